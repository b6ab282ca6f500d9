"""Fitting a routed site (kernels/routing.py): its unit permutation, its G groups and its router.

From a sample of tokens' inputs X [S, d] and activations H = relu(X W1^T + b1)^2 [S, F] (units in
their own order):
1. chunks: the permutation of units into chunks of c co-firing units and runs of M chunks of least
   overlap (clustering.cluster_units on the tokens' own profiles, each token a "block" of one);
2. groups: Lloyd iterations on the tokens' chunk masses U [S, F/(M c), M]: each token goes to the
   group that keeps most of its mass, each group takes the 4 chunks of largest summed mass of its
   tokens in every run. This maximizes the kept mass under an oracle router;
3. router: a ridge regression from [x, 1] to the fraction of the token's mass each group keeps,
   route = argmax of the prediction; then the groups are refitted on the tokens as the router
   routes them, and the router on the new groups (``rounds`` times), so the groups follow what
   the router can see.
Everything is deterministic given the sample (ties to the lower index).
"""

from dataclasses import dataclass

import torch

from sparse_compile.clustering import cluster_units


@dataclass(frozen=True)
class RouteFit:
    perm: torch.Tensor  # int64 [F]: unit at each position
    groups: torch.Tensor  # int64 [G, F/(M c), 4]: kept chunk ids of each group in every run, ascending
    router_w: torch.Tensor  # float32 [G, d]
    router_b: torch.Tensor  # float32 [G]
    oracle_kept: float  # sample mass kept when every token takes its best group
    routed_kept: float  # sample mass kept as the router routes


def initial_groups(n_groups: int, runs: int, m: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """int64 [G, runs, 4]: group g keeps chunks 4g .. 4g + 3 (mod M) of every run, shifted by one
    chunk per round of M/4 groups, so the first M/4 groups partition the units."""
    g = torch.arange(n_groups, device=device)[:, None]
    start = 4 * g + g // max(1, m // 4)
    ids = (start + torch.arange(4, device=device)) % m
    return ids.sort(dim=1).values[:, None, :].expand(n_groups, runs, 4).contiguous()


def group_masks(groups: torch.Tensor, m: int) -> torch.Tensor:
    """float32 [G, runs, M]: 1 at each group's kept chunks."""
    g, runs, _ = groups.shape
    return torch.zeros(g, runs, m, device=groups.device).scatter_(2, groups, 1.0)


def kept_by_group(u: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
    """[S, G]: the mass each group keeps of each token, from chunk masses u [S, runs, M]."""
    return torch.einsum("srm,grm->sg", u, group_masks(groups, u.shape[2]))


def _top_chunks(u: torch.Tensor, assign: torch.Tensor, previous: torch.Tensor) -> torch.Tensor:
    """Each group's 4 heaviest chunks per run over the tokens assigned to it; a group with no tokens
    keeps ``previous``."""
    n_groups = previous.shape[0]
    sums = torch.zeros(n_groups, *u.shape[1:], device=u.device).index_add_(0, assign, u)
    # ties to the lower chunk: subtract a tiny index ramp below any float32 mass difference that matters
    ramp = torch.arange(u.shape[2], device=u.device) * 1e-30
    top = (sums - ramp).topk(4, dim=2).indices.sort(dim=2).values
    empty = torch.bincount(assign, minlength=n_groups) == 0
    return torch.where(empty[:, None, None], previous, top)


def _lloyd(u: torch.Tensor, n_groups: int, iters: int) -> torch.Tensor:
    """Groups [G, runs, 4] maximizing the oracle-routed kept mass of u [S, runs, M]."""
    total = u.sum(dim=(1, 2))
    groups = initial_groups(n_groups, u.shape[1], u.shape[2], u.device)
    # seeds, farthest first: the heaviest token, then the token the groups so far serve worst
    seeds = [int(total.argmax())]
    for _ in range(n_groups - 1):
        picked = torch.tensor(seeds, device=u.device)
        fit = _top_chunks(u[picked], torch.arange(len(seeds), device=u.device), groups[: len(seeds)])
        frac = kept_by_group(u, fit).max(dim=1).values / total.clamp_min(1e-30)
        frac[total == 0] = 2.0
        seeds.append(int(frac.argmin()))
    picked = torch.tensor(seeds, device=u.device)
    groups = _top_chunks(u[picked], torch.arange(n_groups, device=u.device), groups)
    assign = None
    for _ in range(iters):
        new = kept_by_group(u, groups).argmax(dim=1)
        if assign is not None and torch.equal(new, assign):
            break
        assign = new
        groups = _top_chunks(u, assign, groups)
    return groups


def fit_router(x: torch.Tensor, target: torch.Tensor, weight: torch.Tensor, ridge: float = 1e-3):
    """(R [G, d], r [G]) minimizing sum_s weight_s |[x_s, 1] [R, r]^T - target_s|^2 + ridge |R|^2 (ridge
    scaled by the mean diagonal of x^T x), in float64."""
    xd = torch.cat([x.double(), torch.ones(x.shape[0], 1, dtype=torch.float64, device=x.device)], dim=1)
    wx = xd * weight.double()[:, None]
    gram = xd.t() @ wx
    d = x.shape[1]
    reg = ridge * gram.diagonal()[:d].mean().clamp_min(1e-30)
    gram[:d, :d] += reg * torch.eye(d, dtype=torch.float64, device=x.device)
    sol = torch.linalg.solve(gram, wx.t() @ target.double())  # [d + 1, G]
    return sol[:d].t().float().contiguous(), sol[d].float().contiguous()


def fit_routes(
    x: torch.Tensor, h: torch.Tensor, n_groups: int, m: int, c: int, rounds: int = 3, iters: int = 20
) -> RouteFit:
    """The routed site's permutation, groups and router from a sample x [S, d], h [S, F]."""
    s, f = h.shape
    if x.shape[0] != s or f % (m * c) or n_groups < 2:
        raise ValueError(
            f"fit_routes: x {tuple(x.shape)}, h {tuple(h.shape)}, G={n_groups}: needs one x row per h row, "
            f"F a multiple of M*c = {m}*{c} and G >= 2"
        )
    hf = h.float()
    perm = cluster_units(hf.t().contiguous(), m, c)
    u = hf[:, perm].reshape(s, f // (m * c), m, c).sum(dim=3)
    total = u.sum(dim=(1, 2))
    weight = total / total.mean().clamp_min(1e-30)
    groups = _lloyd(u, n_groups, iters)
    for _ in range(rounds):
        kept = kept_by_group(u, groups)
        router_w, router_b = fit_router(x, kept / total.clamp_min(1e-30)[:, None], weight)
        route = torch.addmm(router_b, x.float(), router_w.t()).argmax(dim=1)
        groups = _top_chunks(u, route, groups)
    kept = kept_by_group(u, groups)
    router_w, router_b = fit_router(x, kept / total.clamp_min(1e-30)[:, None], weight)
    route = torch.addmm(router_b, x.float(), router_w.t()).argmax(dim=1)
    mass = total.sum().clamp_min(1e-30)
    return RouteFit(
        perm=perm,
        groups=groups,
        router_w=router_w,
        router_b=router_b,
        oracle_kept=float(kept.max(dim=1).values.sum() / mass),
        routed_kept=float(kept.gather(1, route[:, None]).sum() / mass),
    )
