"""The Triton cuSPARSELt compressor on an sm90 GPU: bit-identical to torch._cslt_compress, and
torch._cslt_sparse_mm on its buffer equals the masked dense GEMM. Run by hand on H100/H200."""

import pytest
import torch

from sparse_compile.kernels.activation_mask import vnm_mask
from sparse_compile.kernels.cslt_compress_triton import cslt_compress, cslt_compress_triton

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (the CPU path is in tests/)"),
    pytest.mark.skipif(
        torch.cuda.is_available() and torch.cuda.get_device_capability()[0] != 9,
        reason="the layout was read off sm90 (Hopper); other GPUs use torch._cslt_compress",
    ),
]


def _random_24(m: int, k: int, dtype: torch.dtype, g: torch.Generator) -> torch.Tensor:
    keep = torch.rand(m, k // 4, 4, device="cuda", generator=g).argsort(-1).argsort(-1) < 2
    return (torch.randn(m, k // 4, 4, device="cuda", generator=g) * keep).reshape(m, k).to(dtype)


def _relu2_24(m: int, k: int, dtype: torch.dtype, g: torch.Generator) -> torch.Tensor:
    """H * 2:4 mask of H = relu(Z)^2: many groups keep a zero (fewer than 2 nonzeros)."""
    h = torch.relu(torch.randn(m, k, device="cuda", generator=g)).square().to(dtype)
    return h * vnm_mask(h, 1, 2, 4)


@pytest.mark.parametrize("m, k", [(64, 64), (128, 192), (1024, 4096), (16384, 4096), (4096, 16384)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("kind", ["random", "relu2", "negzero"])
def test_bit_identical_to_cslt_compress(m, k, dtype, kind):
    g = torch.Generator(device="cuda").manual_seed(m + k)
    a = _relu2_24(m, k, dtype, g) if kind == "relu2" else _random_24(m, k, dtype, g)
    if kind == "negzero":  # W * mask: pruned negative weights are -0.0
        dense = torch.randn(m, k, device="cuda", generator=g).to(dtype)
        a = dense * (a != 0)
    want = torch._cslt_compress(a)
    got = cslt_compress_triton(a)
    assert got.shape == want.shape and got.dtype == want.dtype
    diff = (got.view(torch.int16) != want.view(torch.int16)).sum().item()
    assert diff == 0, f"{diff} of {want.numel()} elements differ"
    assert cslt_compress(a).data_ptr() != 0


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_sparse_mm_on_the_buffer_matches_dense(dtype):
    g = torch.Generator(device="cuda").manual_seed(7)
    w = _random_24(2048, 1024, dtype, g)
    x = torch.randn(4096, 1024, device="cuda", generator=g).to(dtype)
    got = torch._cslt_sparse_mm(cslt_compress(w), x.t(), transpose_result=True)
    want = (x.float() @ w.float().t()).to(dtype)
    torch.testing.assert_close(got, want, rtol=2e-2, atol=5e-2)
