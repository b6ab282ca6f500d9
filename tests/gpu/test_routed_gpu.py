"""Routed tokens on a real GPU: the gather path at full size in bf16 against the reference's masked
math and autograd (outputs poisoned first), and a compiled GPT that trains on it like on the
reference kernels. Run by hand on H100/H200."""

import pytest
import torch

import sparse_compile
from sparse_compile.kernels.routing import group_columns, routed_ffn_ref
from sparse_compile.planning.plan import ROUTED
from sparse_compile.route_fit import initial_groups

from .test_cuda_reference import _rel, train_gpt
from .test_gather_gpu import _poison

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (the CPU path is in tests/)")


@pytest.mark.parametrize("n_groups, c", [(8, 128), (4, 64), (16, 128)])
@pytest.mark.parametrize("skew", [False, True], ids=["spread", "one-group-heavy"])
def test_routed_gather_matches_reference_at_full_size(n_groups, c, skew):
    from sparse_compile.kernels.ffn_routed import sqrelu_ffn_backward_routed, sqrelu_ffn_forward_routed

    t, d, h, v, m = 16384, 2048, 8192, 128, 16
    g = torch.Generator(device="cuda").manual_seed(n_groups + c)
    r = lambda *s, scale=1.0: (torch.randn(*s, generator=g, device="cuda") * scale).to(torch.bfloat16)  # noqa: E731
    x, w1, b1, w2, b2 = r(t, d), r(h, d, scale=0.03), r(h, scale=0.1), r(d, h, scale=0.02), r(d)
    groups = initial_groups(n_groups, h // (m * c), m, "cuda")
    groups = groups[:, torch.randperm(h // (m * c), device="cuda", generator=g)]  # groups differ per run
    cols = group_columns(groups, m, c)
    route = torch.randint(0, n_groups, (t,), device="cuda", generator=g)
    if skew:
        route[: t // 2] = n_groups - 1
    _poison()
    y, r_c, ids, dest = sqrelu_ffn_forward_routed(x, w1, b1, w2, b2, route, cols, v, c)
    leaves = [a.float().requires_grad_(True) for a in (x, w1, b1, w2, b2)]
    y_ref, _ = routed_ffn_ref(*leaves, route, cols)
    assert torch.isfinite(y).all() and _rel(y, y_ref) < 1e-2
    dy = r(t, d)
    y_ref.backward(dy.float())
    _poison()
    grads = sqrelu_ffn_backward_routed(dy, x, w1, w2, r_c, ids, dest, v, m, c)
    for name, a, leaf in zip(("dx", "dw1", "db1", "dw2", "db2"), grads, leaves, strict=True):
        assert torch.isfinite(a).all() and _rel(a, leaf.grad) < 2e-2, name


@pytest.mark.parametrize("router", ["representatives", "weighted", "linear"])
def test_gpt_trains_on_routed_kernels_like_on_reference_kernels(router):
    """50 steps of the 4-block GPT (hidden 1024: chunks of 64), each site's state refitted after step 10
    (the linear router routes every token to group 0 before it): the gather path's losses follow the
    reference kernels' to 0.02 until the refit, then within twice the gap a bf16-sized perturbation of
    the initial weights opens in the reference run, plus 0.05."""
    options = {"activations": "128:4:16", "chunk": 64, "routes": 8, "router": router}
    runs = {}
    for name, extra, perturb in (("fast", {}, False), ("ref", {"kernels": "reference"}, False),
                                 ("noise", {"kernels": "reference"}, True)):  # fmt: skip
        sparse_compile.reset_units()
        runs[name] = train_gpt({**options, **extra}, perturb=perturb, refit_at=10)
    fast, kernels, _ = runs["fast"]
    assert kernels == {ROUTED}
    assert runs["ref"][1] == {"routed reference (cuda)"}
    ref = runs["ref"][0]
    noise = (runs["noise"][0] - ref).abs().max().item()
    assert fast[-1] < fast[0] - 1.0
    # Up to the refit the runs differ by rounding; the refit's discrete choices (groups, and the linear router's
    # L-BFGS fit) amplify it, and the GPU's reference run is not bit-reproducible across processes, so after it
    # the gap is held to the perturbed run's spread plus 0.05 (a wrong kernel stalls or diverges by far more).
    assert (fast[:11] - ref[:11]).abs().max().item() <= 2e-2
    assert (fast - ref).abs().max().item() <= 2 * noise + 5e-2
