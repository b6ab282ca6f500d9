"""The routed sites' state (SparsityConfig.routes): each site's unit permutation, groups and router.

Kept per site module path, outside the model (the dense function, the parameters and the state dict
are unchanged), as ops/unit_perms.py keeps permutations. Before its first fit a site runs the identity
permutation, initial groups (route_fit.initial_groups) and each group's first 16 units as its
representatives (the router reads a token's activations on them: kernels/routing.route_tokens); with
router "linear" a zero linear router (kernels/routing.route_linear), which sends every token to group 0;
with router "weighted" the classifier of the representatives' activations that sums each group's own
(the representatives' router). Inside
``sparse_compile.probe_units()`` every routed site's forward also records a sample of its rows
(x and H = relu(X W1^T + b1)^2, units in their own order; one extra F1 GEMM on the sample);
``sparse_compile.recluster()`` refits each recorded site (sparse_compile.route_fit) and clears the
record. Tensors are updated in place where their shapes allow, so a captured CUDA graph reads the
new state. Under torch.distributed every rank fits on its own sample and the first rank's fit is
sent to all: the routing stays the same on every rank, and no token leaves its rank.
"""

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from sparse_compile.contract import DEFAULT_ROUTER
from sparse_compile.kernels.routing import (
    group_columns,
    rep_activations,
    route_linear,
    route_of_activations,
    routed_mask,
)
from sparse_compile.ops import unit_perms
from sparse_compile.route_fit import finish_routes, fit_linear_routers, initial_groups, kept_by_group, plan_routes

SAMPLE_ROWS_PER_CALL = 4096  # rows of x and H a probed call records (every T/4096-th row)
SAMPLE_ROWS = 4096  # rows a site keeps for its fit (the latest): one probed call of 4096+ tokens fills it
REP_UNITS = 16  # representative units per group before the first fit


@dataclass
class RouteSite:
    n_groups: int
    pattern: tuple[int, int, int]
    chunk: int
    perm: torch.Tensor | None = None  # int64 [h]; None: identity
    groups: torch.Tensor | None = None  # int64 [G, h/(M c), 4]
    rep: torch.Tensor | None = None  # int64 [G, r]: representative units (own ids); None: set at the first call
    cols: torch.Tensor | None = None  # int32 [G, h*4/M], from groups
    fitted: dict[str, float] = field(default_factory=dict)  # the last fit's sample kept masses
    lin: torch.Tensor | None = None  # float32 [G, features + 1]: router "linear" (x) or "weighted" (H on rep)
    made_for: str | None = None  # the router this state (groups, representatives, lin) was made for; None: unknown
    loaded: bool = False  # the state came from load_route_state (a checkpoint), not from this process
    router: str = DEFAULT_ROUTER  # SparsityConfig.router (contract.ROUTERS)
    xs: list[torch.Tensor] = field(default_factory=list)
    hs: list[torch.Tensor] = field(default_factory=list)


_sites: dict[str, RouteSite] = {}


def site(
    name: str, n_groups: int, pattern: tuple[int, int, int], chunk: int, router: str = DEFAULT_ROUTER
) -> RouteSite:
    s = _sites.get(name)
    if s is None or s.n_groups != n_groups:
        s = _sites[name] = RouteSite(n_groups, pattern, chunk)
    s.pattern, s.chunk, s.router = pattern, chunk, router
    return s


def _to(t: torch.Tensor | None, device: torch.device) -> torch.Tensor | None:
    return None if t is None or t.device == device else t.to(device)


def prepare(s: RouteSite, w1: torch.Tensor, b1: torch.Tensor | None) -> None:
    """Fill in what the site lacks for weights w1 [h, d] (units in their own order), on w1's device."""
    dev = w1.device
    h = w1.shape[0]
    _, _, m = s.pattern
    runs = h // (m * s.chunk)
    if s.groups is None or s.groups.shape[1] != runs:
        s.groups = initial_groups(s.n_groups, runs, m, dev)
        s.cols = None
    for name in ("perm", "groups", "rep", "cols", "lin"):
        moved = _to(getattr(s, name), dev)
        if moved is not None:
            setattr(s, name, moved)
    if s.cols is None:
        s.cols = group_columns(s.groups, m, s.chunk)
    if s.rep is None:
        first = s.cols[:, :REP_UNITS].long()  # op order
        s.rep = first if s.perm is None else s.perm[first]
    features = {"linear": w1.shape[1], "weighted": s.rep.numel()}.get(s.router)
    want = None if features is None else (s.n_groups, features + 1)
    if s.made_for not in (None, s.router) or (s.lin is not None and (want is None or s.lin.shape != want)):
        if s.loaded:
            lin = None if s.lin is None else tuple(s.lin.shape)
            raise ValueError(
                f"routed site: its loaded state (router={s.made_for!r}, lin {lin}) does not fit router={s.router!r}"
                f"{'' if want is None else f', which needs lin {want}'}: resume with the router the checkpoint was "
                "fitted for (SparsityConfig.router), or call sparse_compile.reset_units() to start unfitted"
            )
        s.lin, s.made_for = None, None  # another router or model ran this site in this process: start again
    if want is not None and s.lin is None:
        s.lin = torch.zeros(want, device=dev)
        s.loaded = False
        if s.router == "weighted":  # each group's score: the sum of its own representatives' H
            own = torch.arange(features, device=dev) // s.rep.shape[1]
            s.lin[own, torch.arange(features, device=dev)] = 1.0
    if s.made_for is None and not s.loaded:
        s.made_for = s.router


def _op_order(s: RouteSite, h: torch.Tensor) -> torch.Tensor:
    """float32 H [T, h] with its columns in the op's unit order (op position p runs own unit s.perm[p])."""
    return h.float() if s.perm is None else h.float()[:, s.perm.to(h.device)]


def route_by_mass(s: RouteSite, hp: torch.Tensor) -> torch.Tensor:
    """int64 [T]: the oracle's route, for rows of H [T, h] in the op's unit order (``_op_order``): the
    group that keeps the most of each row's mass, argmax_g of route_fit.kept_by_group over the row's
    chunk masses; ties to the lower group."""
    _, _, m = s.pattern
    u = hp.float().reshape(hp.shape[0], -1, m, s.chunk).sum(dim=3)  # [T, runs, M]: each chunk's mass
    return kept_by_group(u, s.groups.to(hp.device)).argmax(dim=1)


def _route(
    s: RouteSite, x: torch.Tensor, h_rep: Callable[[], torch.Tensor], hp: Callable[[], torch.Tensor]
) -> torch.Tensor:
    """int64 [T]: the group of each row of x [T, d] under the site's router, reading what that router
    reads: ``h_rep()``, float32 H on the representatives [T, G r] (the representatives' sum per group,
    or the weighted router's classifier), x (the linear router), or ``hp()``, float32 H in the op's unit
    order [T, h] (the oracle: the group keeping most of the row's H)."""
    if s.router == "oracle":
        return route_by_mass(s, hp())
    if s.router == "linear":
        return route_linear(x, s.lin.to(x.device))
    if s.router == "weighted":
        return route_linear(h_rep(), s.lin.to(x.device))
    return route_of_activations(h_rep(), s.n_groups)


def route(s: RouteSite, x2: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor | None) -> torch.Tensor:
    """int64 [T]: the group of each row of x2 [T, d], from w1 [h, d], b1 with units in their own order;
    F1 on the representatives only, or with router "oracle" on every unit."""
    return _route(
        s,
        x2,
        lambda: rep_activations(x2, w1, b1, s.rep),
        lambda: _op_order(s, torch.relu(F.linear(x2, w1, b1)).float().square()),
    )


def route_of_rows(s: RouteSite, x: torch.Tensor, h: torch.Tensor, hp: torch.Tensor | None = None) -> torch.Tensor:
    """int64 [T]: what ``route`` gives rows x [T, d] whose H [T, F] (units in their own order) is at hand:
    H read, not computed (``hp``: H already in the op's unit order, if the caller has it)."""
    return _route(
        s,
        x,
        lambda: h.float().index_select(1, s.rep.to(h.device).reshape(-1)),
        lambda: _op_order(s, h) if hp is None else hp,
    )


def record(s: RouteSite, x2: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor | None) -> None:
    """While probing: keep a sample of this call's rows of x and H (units in their own order)."""
    if not unit_perms.probing():
        return
    with torch.no_grad():
        step = max(1, x2.shape[0] // SAMPLE_ROWS_PER_CALL)
        xs = x2[::step].detach()
        s.xs.append(xs)
        s.hs.append(torch.relu(F.linear(xs, w1.detach(), None if b1 is None else b1.detach())).square())
        while sum(x.shape[0] for x in s.xs) - s.xs[0].shape[0] >= SAMPLE_ROWS:
            s.xs.pop(0)
            s.hs.pop(0)


REFITS = ("all", "router")  # recluster(routes=...): what a refit of a routed site changes


def refit(group: "torch.distributed.ProcessGroup | None" = None, what: str = "router") -> dict[str, dict[str, float]]:
    """Fit every site with a recorded sample; clear the samples. Returns each refitted site's sample
    kept masses ({"oracle": .., "routed": ..}). ``what`` = "router" (the default): a site fitted before
    (it has a permutation) keeps its permutation and groups and refits only its router; "all": everything.
    Under torch.distributed, call on every rank."""
    if what not in REFITS:
        raise ValueError(f"recluster(routes={what!r}): expected one of {REFITS}")
    names = sorted(n for n, s in _sites.items() if s.xs)
    plans = {}
    for name in names:
        s = _sites[name]
        _, _, m = s.pattern
        fixed = (s.perm, s.groups) if what == "router" and s.perm is not None else None  # fitted before
        plans[name] = plan_routes(
            torch.cat(s.xs).float(), torch.cat(s.hs), s.n_groups, m, s.chunk, router=s.router, fixed=fixed
        )
    # the sites' linear routers: one solve per group count and feature shape (route_fit.fit_linear_routers)
    lins: dict[str, torch.Tensor] = {}
    for n_groups in sorted({_sites[n].n_groups for n in names}):
        linear = [n for n in names if _sites[n].n_groups == n_groups and plans[n].features is not None]
        fitted = fit_linear_routers([plans[n].features for n in linear], [plans[n].assign for n in linear], n_groups)
        lins.update(zip(linear, fitted, strict=True))
    done = {}
    for name in names:
        s = _sites[name]
        _, _, m = s.pattern
        fit = finish_routes(plans.pop(name), lins.pop(name, None))
        tensors = {"perm": fit.perm, "groups": fit.groups, "rep": fit.rep}
        if fit.lin is not None:
            tensors["lin"] = fit.lin
        unit_perms.broadcast_from_first(list(tensors.values()), group)  # every rank runs the first rank's fit
        for key, value in tensors.items():
            setattr(s, key, unit_perms.store(getattr(s, key), value))
        s.cols = unit_perms.store(s.cols, group_columns(s.groups, m, s.chunk))
        s.fitted = {"oracle": fit.oracle_kept, "routed": fit.routed_kept}
        s.made_for, s.loaded = s.router, False
        s.xs.clear()
        s.hs.clear()
        done[name] = s.fitted
    return done


STATE_KEYS = ("perm", "groups", "rep", "lin")


def route_state() -> dict[str, dict[str, torch.Tensor | int | str]]:
    """Site module path -> its fitted state (CPU tensors, n_groups, and the router the state was made for),
    for a checkpoint."""
    out = {}
    for name, s in _sites.items():
        if s.rep is None:
            continue
        state = {k: getattr(s, k).detach().cpu().clone() for k in STATE_KEYS if getattr(s, k) is not None}
        out[name] = {**state, "n_groups": s.n_groups, **({"router": s.made_for} if s.made_for is not None else {})}
    return out


def load_route_state(state: dict[str, dict[str, torch.Tensor | int | str]]) -> None:
    """Set routed sites' state from route_state() (sites not yet compiled too)."""
    for name, saved in state.items():
        n_groups = int(saved["n_groups"])
        rep = torch.as_tensor(saved["rep"], dtype=torch.long)
        groups = torch.as_tensor(saved["groups"], dtype=torch.long)
        lin = None if saved.get("lin") is None else torch.as_tensor(saved["lin"], dtype=torch.float32)
        if (
            rep.dim() != 2
            or rep.shape[0] != n_groups
            or groups.dim() != 3
            or groups.shape[0] != n_groups
            or (lin is not None and (lin.dim() != 2 or lin.shape[0] != n_groups))
        ):
            raise ValueError(
                f"load_route_state: {name!r}: rep {tuple(rep.shape)}, groups {tuple(groups.shape)} and lin "
                f"{None if lin is None else tuple(lin.shape)} do not match n_groups={n_groups}"
            )
        s = _sites.get(name)
        if s is None or s.n_groups != n_groups:
            s = _sites[name] = RouteSite(n_groups, (0, 0, 0), 1)  # pattern filled in by the op's first call
        s.perm = None if saved.get("perm") is None else torch.as_tensor(saved["perm"], dtype=torch.long).clone()
        s.groups, s.rep = groups.clone(), rep.clone()
        s.lin = None if lin is None else lin.clone()
        # a checkpoint that does not name its router: "representatives" if it holds no lin (written when that
        # was the only router), else unknown (lin's shape decides)
        router = saved.get("router")
        s.made_for = str(router) if router is not None else ("representatives" if lin is None else None)
        s.loaded = True
        s.cols = None  # rebuilt from groups at the op's next call


def reset_routes() -> None:
    """Forget every routed site's state and sample."""
    _sites.clear()


def fitted_kept() -> dict[str, dict[str, float]]:
    """Each fitted site's sample kept masses of its last fit."""
    return {name: dict(s.fitted) for name, s in _sites.items() if s.fitted}


def kept_and_total(name: str, x: torch.Tensor, h: torch.Tensor) -> tuple[float, float] | None:
    """(sum of H that site ``name``'s routing keeps, sum of H) for rows x [T, d] of the site's input and
    their H [T, F] (units in their own order; the router reads the token's H on its representatives, the
    linear router x, the oracle all of H); None for a site never run."""
    s = _sites.get(name)
    if s is None or s.rep is None or s.cols is None:
        return None
    with torch.no_grad():
        hf = _op_order(s, h)
        keep = routed_mask(route_of_rows(s, x, h, hf), s.cols.to(h.device), h.shape[1])
        return float((hf * keep).sum()), float(hf.sum())
