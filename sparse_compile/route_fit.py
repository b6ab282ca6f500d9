"""Fitting a routed site (kernels/routing.py): its unit permutation, its G groups and its router.

From a sample of tokens' inputs X [S, d] and activations H = relu(X W1^T + b1)^2 [S, F] (units in
their own order):
1. chunks: the permutation of units into chunks of c co-firing units and runs of M chunks of least
   overlap (clustering.cluster_units on the tokens' own profiles, each token a "block" of one);
2. groups: Lloyd iterations on the tokens' chunk masses U [S, F/(M c), M]: each token goes to the
   group that keeps most of its mass, each group takes the 4 chunks of largest summed mass of its
   tokens in every run. This maximizes the kept mass under an oracle router;
3. router: each group's r representative units (kernels/routing.route_tokens): among its kept
   units, those with the most mass x share of their mass on the group's tokens; a token goes to
   the group whose representatives it activates most. Then the groups are refitted on the tokens
   as the router routes them, and the representatives on the new groups (``rounds`` times), so
   the groups follow what the router sees. With router "linear" (SparsityConfig.router) the groups
   stay step 2's and a linear classifier of x is fitted to each token's best group there
   (``fit_linear_router``: multinomial logistic regression, L2-penalized, on standardized x); with
   router "weighted" the same classifier of the token's activations on the representatives (all
   groups' G r units) instead of x.
With a site's earlier permutation and groups given (``fit_routes(fixed=...)``, recluster(routes="router"))
only step 3 runs, the representatives fitted once to each token's best of those groups.
Everything is deterministic given the refit's samples (ties to the lower index); a linear router is
fitted together with the other sites' of its shape (``fit_linear_routers``), so it is that solve's,
not bitwise the one a site alone would get.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from sparse_compile.clustering import cluster_units
from sparse_compile.contract import DEFAULT_ROUTER
from sparse_compile.kernels.routing import group_columns, route_linear, route_of_activations

LINEAR_DECAY = 1e-2  # the linear router's L2 penalty on its weights over standardized x (per weight)
LINEAR_ITERS = 30  # its L-BFGS iterations, one site alone
# Several sites' routers fitted in one L-BFGS (fit_linear_routers): the sum of their objectives, which are
# independent, so its minimum is each one's; the shared line search needs more iterations than one problem
# alone to reach it. A cap: L-BFGS stops sooner where its tolerances are met. Its FLOPs are the per-site
# solves' (more, with more iterations); what it saves is GPU launches and host synchronizations.
JOINT_ITERS = 100


@dataclass(frozen=True)
class RouteFit:
    perm: torch.Tensor  # int64 [F]: unit at each position
    groups: torch.Tensor  # int64 [G, F/(M c), 4]: kept chunk ids of each group in every run, ascending
    rep: torch.Tensor  # int64 [G, r]: each group's representative units (their own ids)
    oracle_kept: float  # sample mass kept when every token takes its best group
    routed_kept: float  # sample mass kept as the router routes
    lin: torch.Tensor | None = None  # float32 [G, features + 1]: router "linear" / "weighted" (weights, bias)


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


def representatives(hp: torch.Tensor, assign: torch.Tensor, cols: torch.Tensor, r: int) -> torch.Tensor:
    """[G, r] positions (op order) of each group's representatives: among its columns ``cols`` [G, Kc],
    the r with the largest mass on its tokens x the share of their mass that is on its tokens, from
    hp [S, F] (units in op order) and the tokens' groups ``assign`` [S]."""
    n_groups = cols.shape[0]
    mass = torch.zeros(n_groups, hp.shape[1], device=hp.device).index_add_(0, assign, hp)  # [G, F]
    share = mass / mass.sum(dim=0, keepdim=True).clamp_min(1e-30)
    score = (mass * share).gather(1, cols.long())  # [G, Kc]
    top = score.topk(min(r, cols.shape[1]), dim=1).indices
    return cols.long().gather(1, top)


def _fit_stacked(
    x: torch.Tensor, y: torch.Tensor, n_groups: int, decay: float, iters: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights [N, G, d], bias [N, G]) of N linear routers, x [N, S, d] float32 and labels y [N, S], by
    one L-BFGS on the sum of their objectives (``fit_linear_routers``)."""
    n, s, d = x.shape
    mean, std = x.mean(dim=1, keepdim=True), x.std(dim=1, unbiased=False, keepdim=True).clamp_min(1e-6)
    z = (x - mean) / std
    w = torch.zeros(n, n_groups, d, device=x.device, requires_grad=True)
    b = torch.zeros(n, n_groups, device=x.device, requires_grad=True)
    opt = torch.optim.LBFGS([w, b], max_iter=iters, line_search_fn="strong_wolfe")

    def loss() -> torch.Tensor:
        opt.zero_grad()
        logits = torch.baddbmm(b[:, None, :], z, w.transpose(1, 2)).reshape(n * s, n_groups)
        ce = F.cross_entropy(logits, y.reshape(-1), reduction="none").view(n, s).mean(dim=1)
        value = ce.sum() + decay * w.square().sum()
        value.backward()
        return value

    with torch.enable_grad():
        opt.step(loss)
    weights = w.detach() / std  # [N, G, d]
    return weights, b.detach() - (weights @ mean.transpose(1, 2)).squeeze(2)


def fit_linear_routers(
    features: list[torch.Tensor],
    labels: list[torch.Tensor],
    n_groups: int,
    decay: float = LINEAR_DECAY,
    iters: int | None = None,
) -> list[torch.Tensor]:
    """float32 [G, d + 1] (weights, bias) for each problem (features [S, d], labels [S]): the linear router
    (kernels/routing.route_linear) predicting labels (groups) from features. Each minimizes the mean
    cross-entropy of softmax(z W^T + b) + decay * |W|^2 over its standardized rows z = (x - mean) / std,
    from W = 0, b = 0; the standardization is folded into the returned weights. Problems of one shape and
    device are stacked and solved by one L-BFGS on the sum of their objectives (``iters``: LINEAR_ITERS for
    one problem, JOINT_ITERS for several): one launch sequence and one line search's host syncs for all
    of them, instead of one per problem. The sum's minimum is every problem's own."""
    out: list[torch.Tensor | None] = [None] * len(features)
    batches: dict[tuple, list[int]] = {}
    for i, x in enumerate(features):
        batches.setdefault((tuple(x.shape), x.device), []).append(i)
    for idx in batches.values():
        x = torch.stack([features[i].float() for i in idx])  # [N, S, d]
        steps = iters if iters is not None else (LINEAR_ITERS if len(idx) == 1 else JOINT_ITERS)
        weights, bias = _fit_stacked(x, torch.stack([labels[i] for i in idx]), n_groups, decay, steps)
        for k, i in enumerate(idx):
            out[i] = torch.cat([weights[k], bias[k][:, None]], dim=1)
    return out


def fit_linear_router(
    x: torch.Tensor, labels: torch.Tensor, n_groups: int, decay: float = LINEAR_DECAY, iters: int = LINEAR_ITERS
) -> torch.Tensor:
    """float32 [G, d + 1]: ``fit_linear_routers`` on one problem, x [S, d] and labels [S]."""
    return fit_linear_routers([x], [labels], n_groups, decay, iters)[0]


@dataclass(frozen=True)
class RoutePlan:
    """A routed site's fit up to its linear router (``plan_routes``); ``finish_routes`` completes it."""

    perm: torch.Tensor  # int64 [F]
    groups: torch.Tensor  # int64 [G, F/(M c), 4]
    rep: torch.Tensor  # int64 [G, r]: representatives, op order
    u: torch.Tensor  # float32 [S, F/(M c), M]: the sample's chunk masses, op order
    assign: torch.Tensor  # int64 [S]: each token's group (its best group where a linear router is to be fitted)
    features: torch.Tensor | None  # float32 [S, features]: what the linear router reads; None without one


def plan_routes(
    x: torch.Tensor,
    h: torch.Tensor,
    n_groups: int,
    m: int,
    c: int,
    rounds: int = 3,
    iters: int = 20,
    r: int = 16,
    router: str = DEFAULT_ROUTER,
    fixed: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> RoutePlan:
    """``fit_routes`` up to its linear router: everything for router "representatives" or "oracle"; for
    "linear" and "weighted" the features and labels (each token's best group) the router is fitted to."""
    s, f = h.shape
    if x.shape[0] != s or f % (m * c) or n_groups < 2:
        raise ValueError(
            f"plan_routes: x {tuple(x.shape)}, h {tuple(h.shape)}, G={n_groups}: needs one x row per h row, "
            f"F a multiple of M*c = {m}*{c} and G >= 2"
        )
    hf = h.float()
    if fixed is None:
        perm = cluster_units(hf.t().contiguous(), m, c)
    else:
        perm, groups = (t.to(h.device, torch.long) for t in fixed)
        if perm.shape != (f,) or groups.shape != (n_groups, f // (m * c), 4):
            raise ValueError(
                f"plan_routes: fixed perm {tuple(perm.shape)} and groups {tuple(groups.shape)} do not fit h "
                f"{tuple(h.shape)} and G={n_groups}: expected ({f},) and ({n_groups}, {f // (m * c)}, 4)"
            )
        rounds = 0
    hp = hf[:, perm]
    u = hp.reshape(s, f // (m * c), m, c).sum(dim=3)
    if fixed is None:
        groups = _lloyd(u, n_groups, iters)
    assign = kept_by_group(u, groups).argmax(dim=1)
    features = None
    if router in ("linear", "weighted"):  # representatives for both: the site's state keeps them
        rep = representatives(hp, assign, group_columns(groups, m, c), r)
        features = x.float() if router == "linear" else hp.index_select(1, rep.reshape(-1))
    else:
        for step in range(rounds + 1):
            rep = representatives(hp, assign, group_columns(groups, m, c), r)  # op order
            assign = route_of_activations(hp.index_select(1, rep.reshape(-1)), n_groups)
            if step < rounds:
                groups = _top_chunks(u, assign, groups)
    return RoutePlan(perm=perm, groups=groups, rep=rep, u=u, assign=assign, features=features)


def finish_routes(plan: RoutePlan, lin: torch.Tensor | None = None) -> RouteFit:
    """The RouteFit of ``plan``, routed by ``lin`` (fit_linear_router(plan.features, plan.assign, G)) where
    the plan has features, else by the plan's own routes."""
    if (lin is None) != (plan.features is None):
        raise ValueError("finish_routes: a linear router is needed exactly where the plan has features")
    assign = plan.assign if lin is None else route_linear(plan.features, lin)
    kept = kept_by_group(plan.u, plan.groups)
    mass = plan.u.sum().clamp_min(1e-30)
    return RouteFit(
        perm=plan.perm,
        groups=plan.groups,
        rep=plan.perm[plan.rep],
        oracle_kept=float(kept.max(dim=1).values.sum() / mass),
        routed_kept=float(kept.gather(1, assign[:, None]).sum() / mass),
        lin=lin,
    )


def fit_routes(
    x: torch.Tensor,
    h: torch.Tensor,
    n_groups: int,
    m: int,
    c: int,
    rounds: int = 3,
    iters: int = 20,
    r: int = 16,
    router: str = DEFAULT_ROUTER,
    fixed: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> RouteFit:
    """The routed site's permutation, groups and router from a sample x [S, d], h [S, F]. The
    representatives' router reads the sample's activations, as route_tokens does, and x is only
    checked for shape; router="linear" fits a linear classifier of x (``fit_linear_router``),
    router="weighted" one of the activations on the representatives. ``fixed`` = (perm [F], groups
    [G, F/(M c), 4]), a site's earlier fit: only the router is fitted, to each token's best of those
    groups (steps 1 and 2 skipped; ``rounds`` is ignored, the groups stay as they are). Several sites at
    once: ``plan_routes`` each, ``fit_linear_routers`` on their features together, ``finish_routes``."""
    plan = plan_routes(x, h, n_groups, m, c, rounds, iters, r, router, fixed)
    lin = None if plan.features is None else fit_linear_router(plan.features, plan.assign, n_groups)
    return finish_routes(plan, lin)
