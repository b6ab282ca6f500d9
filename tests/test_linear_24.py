"""2:4 weights alone: sparse_compile::linear_24 and the rewrite of an FFN's two linears into it.

On CPU every GEMM of linear_24 runs on F.linear (alg -1); the cuSPARSELt algorithms are checked on
the GPU (tests/gpu/test_linear_24_gpu.py)."""

import torch

from sparse_compile import SparsityConfig
from sparse_compile.planning.plan import W24

from .test_backend import assert_compiled_matches_oracle, autocast_step


def test_linear_24_op_matches_linear_and_its_gradients():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 8, 32, generator=g, requires_grad=True)
    w = torch.randn(48, 32, generator=g, requires_grad=True)
    b = torch.randn(48, generator=g, requires_grad=True)
    gy = torch.randn(2, 8, 48, generator=g)
    y = torch.ops.sparse_compile.linear_24(x, w, b, -1, -1)
    got = torch.autograd.grad(y, (x, w, b), gy)
    y_ref = torch.nn.functional.linear(x, w, b)
    want = torch.autograd.grad(y_ref, (x, w, b), gy)
    torch.testing.assert_close(y, y_ref)
    for name, a, r in zip("xwb", got, want, strict=True):
        torch.testing.assert_close(a, r, msg=name)
    torch.library.opcheck(torch.ops.sparse_compile.linear_24, (x, w, b, -1, -1))
    torch.library.opcheck(torch.ops.sparse_compile.linear_24, (x, w, None, -1, -1))


def test_compiled_model_on_2_4_weight_linears():
    """kernels='triton': both sites on linear_24, relu and square left to Inductor; numbers = oracle."""
    config = SparsityConfig(weights="2:4", kernels="triton")
    report = assert_compiled_matches_oracle(config, torch.randn(2, 16, 32), 1e-4)
    assert [s.kernel for s in report.sparse_sites] == [W24, W24]
    assert all("cuSPARSELt needs a CUDA GPU" in s.record.reason for s in report.sparse_sites)


def test_2_4_weight_linears_under_autocast_match_the_reference_op():
    """bf16 autocast around fp32 weights: the rewrite casts x, W~ and the fp32 relu² the way autocast's
    linear does, so the linears see what the reference op sees."""
    x = torch.randn(2, 16, 32)
    outs = {}
    for kernels in ("triton", "reference"):
        y, g, report = autocast_step({"weights": "2:4", "kernels": kernels}, x)
        outs[kernels] = (y.float(), g)
        kinds = {s.kernel for s in report.sparse_sites}
        assert kinds == ({W24} if kernels == "triton" else {"reference"})
    (y, g), (y_ref, g_ref) = outs["triton"], outs["reference"]
    assert y.dtype == y_ref.dtype
    torch.testing.assert_close(y, y_ref, rtol=2e-2, atol=2e-2)
    for k in g_ref:
        torch.testing.assert_close(g[k], g_ref[k], rtol=5e-2, atol=5e-2, msg=k)
