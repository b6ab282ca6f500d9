"""Routed tokens (SparsityConfig.routes): the layout and mask against loops written from the definition,
the op's forward and gradients against the oracle (reference path, and the gather kernels under the
Triton interpreter in fp32), causality by perturbation, the fit, the state through a checkpoint, and
config errors."""

import re

import pytest
import torch
from torch import nn

import sparse_compile
from sparse_compile import SparsityConfig, compile_reports
from sparse_compile.config import BackendOptions
from sparse_compile.kernels.routing import (
    group_columns,
    padded_sources,
    padding_rows,
    route_linear,
    route_plan,
    route_tokens,
    routed_blocks,
    routed_mask,
)
from sparse_compile.ops import routes
from sparse_compile.route_fit import (
    fit_linear_router,
    fit_linear_routers,
    fit_routes,
    initial_groups,
    kept_by_group,
    representatives,
)


def _mask_loop(route, groups, m, c, h):
    """bool [T, h] from the definition: token t keeps unit u iff u's chunk is one of its group's 4 in u's run."""
    out = torch.zeros(route.numel(), h, dtype=torch.bool)
    for t, g in enumerate(route.tolist()):
        for u in range(h):
            run, chunk = divmod(u // c, m)
            out[t, u] = chunk in groups[g, run].tolist()
    return out


@pytest.mark.parametrize(
    "t, n_groups, v, empty",
    [(64, 4, 16, [2]), (100, 3, 8, []), (37, 8, 4, [0, 4, 7]), (16, 2, 16, []), (5, 8, 4, []), (1, 3, 4, [])]
    + [(32, 1, 16, [])],  # one group of whole blocks: no padding rows
)
def test_route_plan_sorts_tokens_into_blocks_of_one_group(t, n_groups, v, empty):
    """The layout against its definition, with groups left empty (first, middle, last), fewer tokens
    than groups, one token, and no padding at all."""
    g = torch.Generator().manual_seed(t)
    route = torch.randint(0, n_groups, (t,), generator=g)
    for k in empty:  # groups without tokens
        route[route == k] = 1 if n_groups > 1 else 0
    if n_groups > 1:
        route[: t // 3] = 1  # an unbalanced routing
    dest, block_group = route_plan(route, n_groups, v)
    assert block_group.shape == (routed_blocks(t, n_groups, v),)
    assert dest.unique().numel() == t and dest.max() < block_group.numel() * v  # one padded row per token
    blocks_needed = sum(-(-int((route == k).sum()) // v) for k in range(n_groups))
    assert blocks_needed <= block_group.numel()
    for i in range(t):
        assert block_group[dest[i] // v] == route[i]  # every block holds tokens of one group
    for k in range(n_groups):  # a group's tokens keep their order and fill its rows from the start
        rows = dest[route == k]
        assert torch.equal(rows, rows.sort().values)
        if rows.numel():
            assert rows[0] % v == 0 and torch.equal(rows - rows[0], torch.arange(rows.numel()))
    inverse = torch.full((block_group.numel() * v,), -1)
    inverse[dest] = torch.arange(t)
    assert torch.equal(inverse[dest], torch.arange(t))  # the permutation and its inverse are exact
    rows = block_group.numel() * v
    src = padded_sources(dest, rows)
    assert torch.equal(src, inverse.clamp_min(0))  # each row's token, 0 for the padding
    want = [i for i in range(rows) if i not in set(dest.tolist())]
    assert padding_rows(dest, rows).tolist() == want  # the rows no token fills, ascending


@pytest.mark.parametrize("m, c, runs", [(16, 4, 2), (8, 2, 3), (4, 8, 1)])
def test_routed_mask_and_columns_follow_the_definition(m, c, runs):
    h = m * c * runs
    groups = initial_groups(5, runs, m)
    groups[2, 0] = torch.tensor([0, 1, 2, 3]) % m
    route = torch.tensor([0, 2, 4, 1, 2, 3, 0])
    cols = group_columns(groups, m, c)
    mask = routed_mask(route, cols, h)
    assert torch.equal(mask, _mask_loop(route, groups, m, c, h))
    assert (mask.sum(1) == h * 4 // m).all()
    assert torch.equal(cols[0, : 4 * c].long(), torch.cat([groups[0, 0, j] * c + torch.arange(c) for j in range(4)]))


def test_router_reads_representatives_and_ties_go_to_the_lower_group():
    x = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, 0.0], [2.0, -1.0]])
    w1 = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 2.0], [-1.0, 0.0], [0.0, 0.5]])
    rep = torch.tensor([[0, 3], [1, 3], [2, 4]])  # group 2: relu(2 x1)^2 + relu(x1 / 2)^2
    want = [[(max(0.0, float(xt @ w1[u]))) ** 2 for u in range(5)] for xt in x]
    scores = [[want[t][a] + want[t][b] for a, b in rep.tolist()] for t in range(4)]
    assert route_tokens(x, w1, None, rep).tolist() == [max(range(3), key=lambda g: (s[g], -g)) for s in scores]
    assert route_tokens(x, w1, None, rep).tolist() == [0, 2, 0, 0]


class FFN(nn.Module):
    def __init__(self, d=32, h=256, bias=True):
        super().__init__()
        self.up = nn.Linear(d, h, bias=bias)
        self.down = nn.Linear(h, d, bias=bias)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)).square())


class Net(nn.Module):
    def __init__(self, bias=True):
        super().__init__()
        self.mlp = FFN(bias=bias)

    def forward(self, x):
        return x + self.mlp(x)


OPTIONS = {"activations": "16:4:16", "chunk": 4, "routes": 4, "router": "representatives"}


def _group_mass_loop(h, groups, perm, m, c):
    """float64 [T, G]: the H mass group g keeps of token t (h [T, width], units in their own order), from
    _mask_loop's positions of each group (op position i runs own unit perm[i])."""
    kept = _mask_loop(torch.arange(groups.shape[0]), groups, m, c, h.shape[1])  # [G, width], op positions
    return h[:, perm].double() @ kept.double().t()


def _oracle(net, x, site="mlp", by_mass=False):
    """Masked dense math with autograd, the mask built by the loop above from the site's state; the route
    from the site's router (the representatives', or the linear or weighted router's scores in float64), or (by_mass)
    from each token's H summed group by group in a loop."""
    s = routes._sites[site]
    w1, b1, w2, b2 = net.mlp.up.weight, net.mlp.up.bias, net.mlp.down.weight, net.mlp.down.bias
    x2 = x.reshape(-1, x.shape[-1])
    if s.router in ("linear", "weighted"):
        feats = x2.detach().double()
        if s.router == "weighted":  # H on every group's representatives, group by group
            flat = s.rep.reshape(-1)
            feats = torch.relu(feats @ w1[flat].double().t() + (0 if b1 is None else b1[flat].double())) ** 2
        route = (feats @ s.lin[:, :-1].double().t() + s.lin[:, -1].double()).argmax(dim=1)
    else:
        route = route_tokens(x2, w1, b1, s.rep)
    if by_mass:
        with torch.no_grad():
            h = torch.relu(x2 @ w1.t() + (0 if b1 is None else b1)) ** 2
            perm_ = s.perm if s.perm is not None else torch.arange(w1.shape[0])
            route = _group_mass_loop(h, s.groups, perm_, 16, 4).argmax(dim=1)
    perm = s.perm if s.perm is not None else torch.arange(w1.shape[0])
    keep = torch.zeros_like(_mask_loop(route, s.groups, 16, 4, w1.shape[0]))
    keep[:, perm] = _mask_loop(route, s.groups, 16, 4, w1.shape[0])  # op position i is unit perm[i]
    r = torch.relu(x2 @ w1.t() + (0 if b1 is None else b1)) * keep
    return x + ((r * r) @ w2.t() + (0 if b2 is None else b2)).reshape(x.shape)


def _fitted(net, x, options=OPTIONS):
    compiled = torch.compile(net, backend="sparse", options=options)
    compiled(x)  # the first call prepares the site
    with sparse_compile.probe_units(), torch.no_grad():
        compiled(x)
    assert sparse_compile.recluster() == ["mlp"]
    return compiled


def _matches_oracle(net, x, compiled, by_mass=False):
    """The compiled model's output and gradients (x and every parameter) against _oracle's."""
    net.zero_grad()
    xs = x.clone().requires_grad_(True)
    y = compiled(xs)
    dy = torch.randn_like(y)
    y.backward(dy)
    grads = [xs.grad] + [p.grad.clone() for p in net.parameters()]
    net.zero_grad()
    xo = x.clone().requires_grad_(True)
    yo = _oracle(net, xo, by_mass=by_mass)
    torch.testing.assert_close(y, yo, rtol=1e-5, atol=1e-5)
    yo.backward(dy)
    for a, b in zip(grads, [xo.grad] + [p.grad for p in net.parameters()], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("bias", [True, False])
def test_compiled_routed_model_matches_oracle_forward_and_grads(bias):
    sparse_compile.reset_units()
    torch.manual_seed(0)
    net = Net(bias)
    x = torch.randn(2, 48, 32)
    compiled = _fitted(net, x)
    assert routes._sites["mlp"].perm is not None  # the fit permuted the units
    report = compile_reports()[-1]
    assert report.sites[0].record.sparse and report.sites[0].kernel == "routed reference"
    _matches_oracle(net, x, compiled)


def _ignores_later_tokens(compiled, x):
    """Causality by perturbation: change tokens after t, and outputs up to t stay bit-identical."""
    with torch.no_grad():
        y = compiled(x)
        for t in (0, 17, 40):
            xp = x.clone()
            xp[:, t + 1 :] = torch.randn_like(xp[:, t + 1 :]) * 3
            assert torch.equal(compiled(xp)[:, : t + 1], y[:, : t + 1])


def test_routed_outputs_ignore_later_tokens():
    """Causality by perturbation: change tokens after t, and outputs up to t stay bit-identical."""
    sparse_compile.reset_units()
    torch.manual_seed(1)
    net = Net()
    x = torch.randn(2, 64, 32)
    compiled = _fitted(net, x)
    _ignores_later_tokens(compiled, x)


def test_oracle_route_is_the_group_keeping_most_mass_and_ties_go_to_the_lower_group():
    torch.manual_seed(3)
    m, c, runs, n_groups = 16, 4, 2, 5
    width = m * c * runs
    groups = torch.stack(
        [torch.stack([torch.randperm(m)[:4].sort().values for _ in range(runs)]) for _ in range(n_groups)]
    )
    s = routes.RouteSite(n_groups, (16, 4, m), c, perm=torch.randperm(width), groups=groups)
    h = torch.rand(40, width) ** 3  # units in their own order
    want = _group_mass_loop(h, groups, s.perm, m, c).argmax(dim=1)
    assert torch.equal(routes.route_by_mass(s, h[:, s.perm]), want)  # H in the op's unit order
    tie = routes.RouteSite(3, (16, 4, m), c, groups=torch.tensor([[[1, 2, 3, 4]], [[0, 5, 6, 7]], [[0, 8, 9, 10]]]))
    only_chunk_0 = torch.zeros(2, m * c)
    only_chunk_0[0, :c] = 1.0  # groups 1 and 2 keep it, group 0 does not; row 1 is all zero: every group ties
    assert routes.route_by_mass(tie, only_chunk_0).tolist() == [1, 0]


@pytest.mark.parametrize("bias", [True, False])
def test_compiled_oracle_routed_model_matches_oracle_forward_and_grads(bias):
    """router="oracle": each token keeps the group with most of its own H (a loop over units from the
    definition), forward and gradients; causality by perturbation; the router differs from the oracle."""
    sparse_compile.reset_units()
    torch.manual_seed(4)
    net = Net(bias)
    x = torch.randn(2, 48, 32)
    compiled = _fitted(net, x, {**OPTIONS, "router": "oracle"})
    s = routes._sites["mlp"]
    assert s.router == "oracle" and s.perm is not None
    assert "router=oracle" in str(compile_reports()[-1])
    x2 = x.reshape(-1, 32)
    w1, b1 = net.mlp.up.weight, net.mlp.up.bias
    assert not torch.equal(routes.route(s, x2, w1, b1), route_tokens(x2, w1, b1, s.rep))  # not the router
    _matches_oracle(net, x, compiled, by_mass=True)
    h = (torch.relu(nn.functional.linear(x2, w1, b1)) ** 2).detach()
    kept, total = routes.kept_and_total("mlp", x2, h)  # the health probe's kept mass: the oracle's route's
    mass = _group_mass_loop(h, s.groups, s.perm, 16, 4)
    assert kept / total == pytest.approx(float(mass.max(dim=1).values.sum() / h.double().sum()), rel=1e-5)
    _ignores_later_tokens(compiled, x)


def test_linear_route_is_the_argmax_of_its_scores_and_ties_go_to_the_lower_group():
    torch.manual_seed(5)
    x, lin = torch.randn(50, 12), torch.randn(6, 13)
    want = [max(range(6), key=lambda g: (float(xt.double() @ lin[g, :12].double() + lin[g, 12]), -g)) for xt in x]
    assert route_linear(x, lin).tolist() == want
    tie = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]])  # groups 0 and 2 score alike
    assert route_linear(torch.tensor([[2.0], [-1.0]]), tie).tolist() == [0, 1]


def test_linear_route_scores_bf16_rows_in_float32():
    """Scores near 50 that differ by about 0.05: bf16 rounding of the scores (1/256 of their size) would flip
    most routes; in float32 they match float64's."""
    g = torch.Generator().manual_seed(10)
    x = (torch.rand(300, 16, generator=g) + 1.0).bfloat16()
    base = torch.full((16,), 2.0)
    lin = torch.cat([base + 0.01 * torch.randn(8, 16, generator=g), torch.zeros(8, 1)], dim=1)
    want = (x.double() @ lin[:, :-1].double().t()).argmax(dim=1)
    assert torch.equal(route_linear(x, lin), want)
    rounded = (x.double() @ lin[:, :-1].double().t()).bfloat16().float()
    assert (rounded.argmax(dim=1) != want).float().mean() > 0.2  # the test can tell


def _standardized(x: torch.Tensor, lin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(w, b) in float64: a linear router lin [G, d + 1] over x back in the standardized coordinates
    z = (x - mean) / std that fit_linear_router's objective is written in."""
    mean, std = x.double().mean(0), x.double().std(0, unbiased=False).clamp_min(1e-6)
    return lin[:, :-1].double() * std, lin[:, -1].double() + lin[:, :-1].double() @ mean


def _router_objective(x: torch.Tensor, labels: torch.Tensor, w: torch.Tensor, b: torch.Tensor, decay: float) -> float:
    """fit_linear_router's objective written out: mean cross-entropy of softmax(z w^T + b) + decay |w|^2."""
    mean, std = x.double().mean(0), x.double().std(0, unbiased=False).clamp_min(1e-6)
    z = (x.double() - mean) / std
    return float(torch.nn.functional.cross_entropy(z @ w.t() + b, labels) + decay * w.square().sum())


def test_linear_router_fit_minimizes_its_objective_and_learns_a_readable_group():
    """The fit against the objective written out (mean cross-entropy + decay |W|^2 on standardized x):
    no small step lowers it, and it routes tokens whose group a direction of x reveals."""
    g = torch.Generator().manual_seed(6)
    s, d, n_groups = 600, 8, 4
    labels = torch.randint(0, n_groups, (s,), generator=g)
    x = torch.randn(s, d, generator=g) * 2.0 + 5.0  # not standardized: the fit must fold it in
    x[torch.arange(s), labels] += 8.0
    lin = fit_linear_router(x, labels, n_groups, decay=1e-3, iters=100)
    assert (route_linear(x, lin) == labels).float().mean() > 0.9
    w, b = _standardized(x, lin)
    best = _router_objective(x, labels, w, b, 1e-3)
    for _ in range(10):
        dw, db = torch.randn(w.shape, generator=g).double(), torch.randn(b.shape, generator=g).double()
        assert _router_objective(x, labels, w + 0.05 * dw, b + 0.05 * db, 1e-3) > best - 1e-6


def test_linear_routers_fitted_together_reach_each_ones_optimum():
    """fit_linear_routers on several problems at once (one L-BFGS on the sum of their objectives): each
    problem's objective within 1e-5 of its own fit run to convergence, its routes those of that fit, and
    a problem of another shape solved on its own, in its place in the output."""
    g = torch.Generator().manual_seed(11)
    n_groups, decay = 4, 1e-2
    problems = []
    for s, d in ((512, 12),) * 4 + ((384, 12),):
        x = (torch.randn(s, d, generator=g) * torch.rand(d, generator=g) * 3 + torch.randn(d, generator=g)).relu()
        truth = torch.randn(n_groups, d, generator=g)
        labels = (x @ truth.t() + torch.randn(s, n_groups, generator=g)).argmax(dim=1)
        problems.append((x, labels))

    def objective(x, labels, lin):
        return _router_objective(x, labels, *_standardized(x, lin), decay)

    together = fit_linear_routers([x for x, _ in problems], [y for _, y in problems], n_groups, decay)
    assert [t.shape for t in together] == [(n_groups, 13)] * 5
    for (x, labels), lin in zip(problems, together, strict=True):
        alone = fit_linear_router(x, labels, n_groups, decay, iters=300)
        assert objective(x, labels, lin) < objective(x, labels, alone) + 1e-5
        assert (route_linear(x, lin) == route_linear(x, alone)).float().mean() > 0.99
    # the fits stay separate: changing one problem's labels moves only its router
    changed = list(problems)
    changed[1] = (problems[1][0], (problems[1][1] + 1) % n_groups)
    again = fit_linear_routers([x for x, _ in changed], [y for _, y in changed], n_groups, decay)
    assert (route_linear(changed[1][0], again[1]) == route_linear(changed[1][0], together[1])).float().mean() < 0.5
    for k in (0, 2, 3, 4):
        assert (
            route_linear(problems[k][0], again[k]) == route_linear(problems[k][0], together[k])
        ).float().mean() > 0.99


PLANTED = (2048, 16, 8, 4, 2)  # tokens S, d, M, chunk c, runs: H has M c runs = 64 units


def _planted_kinds(seed: int, readable_x: bool = True, background: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """(x [S, d], H [S, 64]): tokens of 4 kinds, each firing its own quarter of the units (scattered over
    chunks before a fit) on top of uniform activity up to ``background``; with ``readable_x`` the kind is
    also a direction of x."""
    g = torch.Generator().manual_seed(seed)
    s, d, m, c, runs = PLANTED
    h = m * c * runs
    kind = torch.randint(0, 4, (s,), generator=g)
    x = torch.randn(s, d, generator=g) * (0.1 if readable_x else 1.0)
    if readable_x:
        x[torch.arange(s), kind] += 3.0
    units = torch.randperm(h, generator=g).reshape(4, h // 4)
    act = torch.rand(s, h, generator=g) * background if background else torch.zeros(s, h)
    act[torch.arange(s)[:, None], units[kind]] = torch.rand(s, h // 4, generator=g) + 0.5
    return x, act


def test_fit_with_the_linear_router_keeps_lloyds_groups_and_routes_by_x():
    """router="linear": the planted kinds (readable from x) are found and routed by x alone."""
    s, d, m, c, runs = PLANTED
    x, act = _planted_kinds(0)
    fit = fit_routes(x, act, 4, m, c, router="linear")
    assert fit.lin is not None and fit.lin.shape == (4, d + 1)
    assert fit.oracle_kept > 0.95 and fit.routed_kept > 0.95
    u = act[:, fit.perm].reshape(s, runs, m, c).sum(dim=3)
    best = kept_by_group(u, fit.groups).argmax(dim=1)
    assert (route_linear(x, fit.lin) == best).float().mean() > 0.99


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("router", ["linear", "weighted"])
def test_compiled_fitted_router_model_matches_oracle_forward_and_grads(router, bias):
    """router="linear" / "weighted": before the fit every token takes group 0 / the representatives' route;
    after it, the masked dense math routed by the fitted classifier's scores (of x / of the representatives'
    H), forward and gradients; the health probe's kept mass; causality."""
    sparse_compile.reset_units()
    torch.manual_seed(7)
    net = Net(bias)
    x = torch.randn(2, 48, 32)
    compiled = torch.compile(net, backend="sparse", options={**OPTIONS, "router": router})
    compiled(x)
    s = routes._sites["mlp"]
    x2 = x.reshape(-1, 32)
    w1, b1 = net.mlp.up.weight, net.mlp.up.bias
    assert s.router == router and s.lin.shape == (4, (33 if router == "linear" else s.rep.numel() + 1))
    before = torch.zeros(x2.shape[0], dtype=torch.long) if router == "linear" else route_tokens(x2, w1, b1, s.rep)
    assert torch.equal(routes.route(s, x2, w1, b1), before)
    _matches_oracle(net, x, compiled)
    compiled = _fitted(net, x, {**OPTIONS, "router": router})
    assert s.perm is not None and f"router={router}" in str(compile_reports()[-1])
    route = routes.route(s, x2, w1, b1)
    assert route.unique().numel() > 1
    _matches_oracle(net, x, compiled)
    h = (torch.relu(nn.functional.linear(x2, w1, b1)) ** 2).detach()
    kept, total = routes.kept_and_total("mlp", x2, h)  # the health probe's kept mass: the fitted route's
    mass = _group_mass_loop(h, s.groups, s.perm, 16, 4)
    assert kept / total == pytest.approx(float(mass.gather(1, route[:, None]).sum() / h.double().sum()), rel=1e-5)
    _ignores_later_tokens(compiled, x)


def test_fit_with_the_weighted_router_routes_planted_kinds_by_the_representatives():
    """router="weighted": the planted kinds, not readable from x, are routed by the representatives' H."""
    s, _, m, c, runs = PLANTED
    x, act = _planted_kinds(9, readable_x=False, background=0.05)
    fit = fit_routes(x, act, 4, m, c, router="weighted", r=4)
    assert fit.lin.shape == (4, 4 * 4 + 1) and fit.oracle_kept > 0.9 and fit.routed_kept > 0.9
    u = act[:, fit.perm].reshape(s, runs, m, c).sum(dim=3)
    best = kept_by_group(u, fit.groups).argmax(dim=1)
    assert (route_linear(act[:, fit.rep.reshape(-1)], fit.lin) == best).float().mean() > 0.99


def test_gather_kernels_match_reference_in_the_interpreter():
    """kernels/ffn_routed.py (Triton interpreter, fp32) against the reference's masked math and autograd."""
    from sparse_compile.kernels.ffn_routed import sqrelu_ffn_backward_routed, sqrelu_ffn_forward_routed
    from sparse_compile.kernels.routing import routed_ffn_ref

    g = torch.Generator().manual_seed(3)
    t, d, h, d_out, v, m, c = 40, 32, 256, 24, 16, 16, 16
    x = torch.randn(t, d, generator=g)
    w1, b1 = torch.randn(h, d, generator=g) * 0.2, torch.randn(h, generator=g) * 0.1
    w2, b2 = torch.randn(d_out, h, generator=g) * 0.1, torch.randn(d_out, generator=g)
    groups = initial_groups(3, 1, m)
    cols = group_columns(groups, m, c)
    route = torch.tensor([0, 2, 1, 1, 2] * 8)
    y, r_c, ids, dest = sqrelu_ffn_forward_routed(x, w1, b1, w2, b2, route, cols, v, c)
    leaves = [a.clone().requires_grad_(True) for a in (x, w1, b1, w2, b2)]
    yr, _ = routed_ffn_ref(*leaves, route, cols)
    torch.testing.assert_close(y, yr, rtol=1e-4, atol=1e-4)
    dy = torch.randn(t, d_out, generator=g)
    yr.backward(dy)
    grads = sqrelu_ffn_backward_routed(dy, x, w1, w2, r_c, ids, dest, v, m, c)
    want = [leaves[0].grad, leaves[1].grad, leaves[2].grad, leaves[3].grad, leaves[4].grad]
    for a, b in zip(grads, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("router", ["representatives", "weighted"])
def test_fit_finds_planted_groups_and_a_router_that_sees_them(router):
    """Tokens of 4 kinds, each firing its own quarter of the units, the kind readable from x: the fit's
    oracle and routed kept mass reach ~1, where any fixed group keeps ~1/4."""
    _, _, m, c, runs = PLANTED
    x, act = _planted_kinds(0)
    fit = fit_routes(x, act, 4, m, c, router=router)
    assert fit.oracle_kept > 0.95 and fit.routed_kept > 0.95
    assert torch.equal(fit.perm.sort().values, torch.arange(m * c * runs))


@pytest.mark.parametrize("router", ["representatives", "weighted", "linear", "oracle"])
def test_state_survives_a_checkpoint_and_the_state_dict_stays_plain(router):
    sparse_compile.reset_units()
    torch.manual_seed(2)
    net = Net()
    keys = set(net.state_dict())
    x = torch.randn(2, 32, 32)
    compiled = _fitted(net, x, {**OPTIONS, "router": router})
    with torch.no_grad():
        y = compiled(x)
    state = sparse_compile.route_state()
    assert set(state) == {"mlp"} and set(net.state_dict()) == keys
    sparse_compile.reset_units()
    with torch.no_grad():
        assert not torch.equal(compiled(x), y)  # back to the initial router and groups
    sparse_compile.load_route_state(state)
    with torch.no_grad():
        assert torch.equal(compiled(x), y)
    assert routes._sites["mlp"].router == router


def test_a_refit_of_several_sites_fits_each_as_if_alone(monkeypatch):
    """routes.refit fits the sites' linear routers together (one solve per group count and feature shape):
    each site gets its own sample's permutation, groups and representatives exactly, and a router that
    routes its sample as fit_routes on that sample alone does, whatever sites it was solved with."""
    sparse_compile.reset_units()
    _, _, m, c, _ = PLANTED
    sites = {
        "a": (4, "weighted"),
        "b": (4, "weighted"),
        "c": (8, "weighted"),
        "d": (4, "linear"),
        "e": (4, "representatives"),
    }
    samples = {}
    for seed, (name, (n_groups, router)) in enumerate(sites.items()):
        x, act = _planted_kinds(seed, background=0.3)
        site = routes.site(name, n_groups, (16, 4, m), c, router)
        site.xs.append(x)
        site.hs.append(act)
        samples[name] = (x, act)
    solves = []
    real_step = torch.optim.LBFGS.step

    def counted(self, closure):
        solves.append(sum(p.numel() for g in self.param_groups for p in g["params"]))
        return real_step(self, closure)

    monkeypatch.setattr(torch.optim.LBFGS, "step", counted)
    done = routes.refit()
    monkeypatch.undo()
    assert set(done) == set(sites)
    # one solve per group count and feature shape: a and b together (2 x 4 x (64 + 1)), c (8 x 129), d (4 x 17)
    assert sorted(solves) == sorted([2 * 4 * 65, 8 * 129, 4 * 17])
    for name, (n_groups, router) in sites.items():
        x, act = samples[name]
        alone = fit_routes(x, act, n_groups, m, c, router=router)
        site = routes._sites[name]
        assert torch.equal(site.perm, alone.perm) and torch.equal(site.groups, alone.groups), name
        assert torch.equal(site.rep, alone.rep), name
        assert not site.xs and not site.hs
        if alone.lin is None:
            assert site.lin is None and site.fitted["routed"] == alone.routed_kept
            continue
        assert site.lin.shape == alone.lin.shape, name
        mine = routes.route_of_rows(site, x, act)
        alone_site = routes.RouteSite(
            n_groups, (16, 4, m), c, perm=alone.perm, groups=alone.groups, rep=alone.rep, lin=alone.lin, router=router
        )
        assert (mine == routes.route_of_rows(alone_site, x, act)).float().mean() > 0.99, name
        assert abs(site.fitted["routed"] - alone.routed_kept) < 0.01, name
    sparse_compile.reset_units()


@pytest.mark.parametrize("router", ["weighted", "linear"])
def test_a_refit_updates_the_router_in_place(router):
    """A captured CUDA graph reads the site's tensors by address: a refit writes the new router into them."""
    sparse_compile.reset_units()
    torch.manual_seed(11)
    net = Net()
    x = torch.randn(2, 32, 32)
    compiled = _fitted(net, x, {**OPTIONS, "router": router})
    lin = routes._sites["mlp"].lin
    before = lin.clone()
    with sparse_compile.probe_units(), torch.no_grad():
        compiled(torch.randn(2, 32, 32))
    sparse_compile.recluster()
    assert routes._sites["mlp"].lin is lin and not torch.equal(lin, before)


def test_a_loaded_router_state_of_another_router_is_refused():
    """d = G r = 64: a weighted router's lin has a linear router's shape, so only the router it was fitted
    for tells them apart. Loaded from a checkpoint it is refused, naming both; a checkpoint that does not say
    its router loads where the shape fits; within a process another router starts from an unfitted one;
    a representatives state is refused by the default router, whether or not it names its router."""
    sparse_compile.reset_units()
    torch.manual_seed(12)
    net = Net()
    net.mlp = FFN(d=64)
    x = torch.randn(2, 32, 64)
    _fitted(net, x, {**OPTIONS, "router": "weighted"})
    state = sparse_compile.route_state()
    assert state["mlp"]["router"] == "weighted" and state["mlp"]["lin"].shape == (4, 65)
    sparse_compile.reset_units()
    sparse_compile.load_route_state(state)
    linear = torch.compile(net, backend="sparse", options={**OPTIONS, "router": "linear"})
    with pytest.raises(ValueError, match="router='weighted'.*does not fit router='linear'"):
        linear(x)
    sparse_compile.reset_units()
    sparse_compile.load_route_state({"mlp": {k: v for k, v in state["mlp"].items() if k != "router"}})
    weighted = torch.compile(net, backend="sparse", options={**OPTIONS, "router": "weighted"})
    weighted(x)  # a checkpoint without the router's name: accepted, its lin kept
    assert torch.equal(routes._sites["mlp"].lin, state["mlp"]["lin"])
    sparse_compile.reset_units()
    _fitted(net, x, {**OPTIONS, "router": "weighted"})
    linear(x)  # fitted in this process, not loaded: the linear router starts unfitted
    assert routes._sites["mlp"].made_for == "linear" and not routes._sites["mlp"].lin.any()
    # a representatives state (no lin) names its router too, and one that does not (written when it was the
    # only router) is read as representatives: refused by the default router, accepted by its own
    sparse_compile.reset_units()
    _fitted(net, x, OPTIONS)
    reps = sparse_compile.route_state()
    assert reps["mlp"]["router"] == "representatives" and "lin" not in reps["mlp"]
    for saved in (reps, {"mlp": {k: v for k, v in reps["mlp"].items() if k != "router"}}):
        sparse_compile.reset_units()
        sparse_compile.load_route_state(saved)
        default = torch.compile(net, backend="sparse", options={k: v for k, v in OPTIONS.items() if k != "router"})
        with pytest.raises(ValueError, match="router='representatives'.*does not fit router='weighted'"):
            default(x)
        sparse_compile.reset_units()
        sparse_compile.load_route_state(saved)
        torch.compile(net, backend="sparse", options=OPTIONS)(x)
        assert torch.equal(routes._sites["mlp"].rep, reps["mlp"]["rep"])


def test_an_op_spec_with_an_unknown_router_names_it():
    from sparse_compile.ops.spec import parse_spec

    with pytest.raises(ValueError, match="router='best'; allowed: representatives, weighted, linear, oracle"):
        parse_spec("weights=none;activations=16:4:16;kernels=auto;chunk=4;routes=4;router=best")


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(activations="128:4:16", chunk=128, routes=1), "routes=1: expected None or an int in [2, 1024]"),
        (dict(activations="128:4:16", chunk=128, routes=True), "routes=True"),
        (dict(activations="128:4:16", chunk=128, routes="8"), "routes='8'"),
        (dict(activations="128:2:16", chunk=128, routes=8), "needs V:4:M activations"),
        (dict(activations="128:4:16", routes=8), "chunk=1"),
        (dict(activations="128:4:16", chunk=128, routes=8, causal=True), "'causal': True"),
        (dict(activations="128:4:16", chunk=128, routes=8, permute=True), "'permute': True"),
        (dict(activations="128:4:16", chunk=128, routes=8, router="best"), "router='best': expected 'repres"),
        (dict(activations="128:4:16", chunk=128, router="oracle"), "router='oracle' needs routes=G"),
    ],
)
def test_config_errors_name_the_value(kwargs, message):
    with pytest.raises(ValueError) as e:
        SparsityConfig(**kwargs)
    assert message in str(e.value)


def test_routes_on_top_of_the_default_drop_the_causal_choice():
    config = BackendOptions.parse({"routes": 8}).config
    assert (config.routes, config.causal, config.score_rows, config.chunk) == (8, False, None, 128)
    assert BackendOptions.parse({"preset": "routed"}).config.routes == 8
    assert "routes=8" in config.op_spec()


def test_the_default_router_is_weighted_and_the_report_names_it():
    """Routed sites run router="weighted" unless told otherwise; the op spec omits the default and the
    report always names the router of a routed run."""
    config = BackendOptions.parse({"preset": "routed"}).config
    assert config.router == "weighted" and "router=" not in config.op_spec()
    assert "router=representatives" in SparsityConfig(**{**OPTIONS}).op_spec()
    sparse_compile.reset_units()
    torch.manual_seed(0)
    net, x = Net(), torch.randn(2, 48, 32)
    compiled = _fitted(net, x, {k: v for k, v in OPTIONS.items() if k != "router"})
    assert routes._sites["mlp"].router == "weighted" and routes._sites["mlp"].lin is not None
    assert "routes=4, router=weighted" in str(compile_reports()[-1])
    _matches_oracle(net, x, compiled)


@pytest.mark.parametrize("router", ["representatives", "weighted", "linear"])
def test_a_router_only_fit_keeps_the_permutation_and_groups_and_fits_the_router_to_them(router):
    """fit_routes(fixed=(perm, groups)): those exactly; the router fitted, from the written-out steps,
    to each token's best of those groups (the representatives of those groups, the classifier of
    their features); a fixed pair of the wrong shape names both."""
    s, d, m, c, runs = PLANTED
    x0, h0 = _planted_kinds(0, background=0.3)
    first = fit_routes(x0, h0, 4, m, c, router=router)
    x, h = _planted_kinds(1, background=0.3)  # another sample: a full fit would move the units
    fit = fit_routes(x, h, 4, m, c, router=router, fixed=(first.perm, first.groups))
    assert torch.equal(fit.perm, first.perm) and torch.equal(fit.groups, first.groups)
    hp = h[:, first.perm]
    u = hp.reshape(s, runs, m, c).sum(dim=3)
    best = kept_by_group(u, first.groups).argmax(dim=1)
    rep = representatives(hp, best, group_columns(first.groups, m, c), 16)  # op order
    assert torch.equal(fit.rep, first.perm[rep])
    if router == "representatives":
        assert fit.lin is None
    else:
        features = x if router == "linear" else hp.index_select(1, rep.reshape(-1))
        torch.testing.assert_close(fit.lin, fit_linear_router(features, best, 4))
    assert fit.oracle_kept == pytest.approx(float(kept_by_group(u, first.groups).max(dim=1).values.sum() / u.sum()))
    with pytest.raises(ValueError, match=rf"fixed perm \({m * c * runs},\) and groups \(3, {runs}, 4\)"):
        fit_routes(x, h, 4, m, c, router=router, fixed=(first.perm, first.groups[:3]))


def test_recluster_router_only_keeps_the_units_each_group_keeps():
    """recluster() (routes="router", the default) after a first fit: the permutation and groups stay, the
    representatives and the router are refitted on the new rows, and the compiled model matches the masked
    math; before any fit it fits everything; routes="all" refits the units too; a bad value is refused
    before anything is refitted."""
    sparse_compile.reset_units()
    torch.manual_seed(0)
    net = Net()
    x = torch.randn(2, 48, 32)
    options = {k: v for k, v in OPTIONS.items() if k != "router"}  # the default router
    compiled = torch.compile(net, backend="sparse", options=options)
    compiled(x)
    with sparse_compile.probe_units(), torch.no_grad():
        compiled(x)
    assert sparse_compile.recluster(routes="router") == ["mlp"]  # no fit yet: a full one
    site = routes._sites["mlp"]
    perm, groups, rep, lin = (t.clone() for t in (site.perm, site.groups, site.rep, site.lin))
    x2 = torch.randn(2, 48, 32) * 2 + 0.5
    with sparse_compile.probe_units(), torch.no_grad():
        compiled(x2)
    with pytest.raises(ValueError, match=r"recluster\(routes='groups'\): expected one of \('all', 'router'\)"):
        sparse_compile.recluster(routes="groups")
    assert site.xs  # the refused call left the sample
    assert sparse_compile.recluster() == ["mlp"]  # the default: the router alone
    assert torch.equal(site.perm, perm) and torch.equal(site.groups, groups)
    assert not torch.equal(site.rep, rep) and not torch.equal(site.lin, lin)
    _matches_oracle(net, x2, compiled)
    with sparse_compile.probe_units(), torch.no_grad():
        compiled(x2)
    assert sparse_compile.recluster(routes="all") == ["mlp"]  # everything again: the units move
    assert not (torch.equal(site.perm, perm) and torch.equal(site.groups, groups))


def test_bench_train_refits_the_router_alone_by_default_and_keeps_the_first_fits_units(tmp_path, monkeypatch, capsys):
    """bench.train with routed tokens and no --refit-routes: every refit is router-only, and every site keeps
    the permutation and groups of the fit before its first sparse step; --refit-routes all refits them all.
    A checkpoint written before the flag existed (its runs refitted everything) resumes only under
    --refit-routes all; without routed tokens the flag is refused."""
    from bench import checkpoint
    from bench.train import main

    calls = []
    real = routes.refit

    def spy(group=None, what="router"):
        out = real(group, what)
        calls.append((what, {n: (s.perm.clone(), s.groups.clone()) for n, s in routes._sites.items()}))
        return out

    monkeypatch.setattr(routes, "refit", spy)
    sparse_compile.reset_units()
    torch._dynamo.reset()
    common = ["--steps", "10", "--batch-size", "2", "--seq-len", "64", "--log-every", "5", "--eval-every", "10"]
    common += ["--eval-iters", "1", "--no-progress", "--data-dir", str(tmp_path / "data"), "--runs", "sparse"]
    routed = ["--sparsity", '{"activations": "16:4:16", "chunk": 4, "routes": 4}', "--recluster-every", "2"]
    assert main([*common, *routed, "--out", str(tmp_path / "r")]) == 0
    assert len(calls) >= 2 and {what for what, _ in calls} == {"router"}
    # the summary says whether the groups still follow the model: best-group share, first / last logged
    summary = (tmp_path / "r" / "summary.txt").read_text()
    assert re.search(r"first / last logged \| [01]\.\d{3} / [01]\.\d{3} \(a random group: 0\.250\)", summary)
    first = calls[0][1]
    assert len(first) == 4
    for _, sites in calls[1:]:
        for name, (perm, groups) in sites.items():
            assert torch.equal(perm, first[name][0]) and torch.equal(groups, first[name][1])
    calls.clear()
    sparse_compile.reset_units()
    assert main([*common, *routed, "--refit-routes", "all", "--out", str(tmp_path / "a")]) == 0
    assert {what for what, _ in calls} == {"all"}
    assert any(not torch.equal(s[n][1], calls[0][1][n][1]) for _, s in calls[1:] for n in s)  # groups moved
    assert main([*common, *routed, "--refit-routes", "all", "--out", str(tmp_path / "s"), "--stop-at", "4"]) == 0
    ckpt = checkpoint.load(tmp_path / "s", {})
    assert ckpt.args["refit_routes"] == "all"
    ckpt.args.pop("refit_routes")  # as bench.train wrote it before --refit-routes existed
    checkpoint.save(tmp_path / "s", ckpt)
    resume = [*common, *routed, "--out", str(tmp_path / "s"), "--resume", str(tmp_path / "s")]
    capsys.readouterr()
    assert main(resume) == 2  # it ran full refits: the default would change what it runs
    assert "'refit_routes': ('all', 'router')" in capsys.readouterr().err
    calls.clear()
    assert main([*resume, "--refit-routes", "all"]) == 0  # steps 4 to 10, refitting everything as before
    assert calls and {what for what, _ in calls} == {"all"}
    with pytest.raises(SystemExit):
        main([*common, "--refit-routes", "router", "--out", str(tmp_path / "d")])
