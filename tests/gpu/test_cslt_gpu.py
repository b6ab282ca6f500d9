"""The Triton cuSPARSELt compressor on an sm90 GPU: bit-identical to torch._cslt_compress, and
torch._cslt_sparse_mm on its buffer equals the masked dense GEMM. Run by hand on H100/H200."""

import pytest
import torch

from sparse_compile.kernels.activation_mask import vnm_mask
from sparse_compile.kernels.cslt_compress_triton import cslt_compress, cslt_compress_triton, random_24

from .test_cuda_reference import _rel
from .test_gather_gpu import ffn_leaves, run_with_grads

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (the CPU path is in tests/)"),
    pytest.mark.skipif(
        torch.cuda.is_available() and torch.cuda.get_device_capability()[0] != 9,
        reason="the layout was read off sm90 (Hopper); other GPUs use torch._cslt_compress",
    ),
]


def _relu2_24(m: int, k: int, dtype: torch.dtype, g: torch.Generator) -> torch.Tensor:
    """H * 2:4 mask of H = relu(Z)^2: many groups keep a zero (fewer than 2 nonzeros)."""
    h = torch.relu(torch.randn(m, k, device="cuda", generator=g)).square().to(dtype)
    return h * vnm_mask(h, 1, 2, 4)


@pytest.mark.parametrize("m, k", [(64, 64), (128, 192), (1024, 4096), (16384, 4096), (4096, 16384)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("kind", ["random", "relu2", "negzero"])
def test_bit_identical_to_cslt_compress(m, k, dtype, kind):
    g = torch.Generator(device="cuda").manual_seed(m + k)
    a = _relu2_24(m, k, dtype, g) if kind == "relu2" else random_24(m, k, g, dtype)
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
    w = random_24(2048, 1024, g, dtype)
    x = torch.randn(4096, 1024, device="cuda", generator=g).to(dtype)
    got = torch._cslt_sparse_mm(cslt_compress(w), x.t(), transpose_result=True)
    want = (x.float() @ w.float().t()).to(dtype)
    torch.testing.assert_close(got, want, rtol=2e-2, atol=5e-2)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_cslt_linear_matches_linear_with_bias(dtype):
    from sparse_compile.kernels.cslt_linear import cslt_linear
    from sparse_compile.planning.f1_choice import choose_f1

    g = torch.Generator(device="cuda").manual_seed(3)
    w = random_24(2048, 1024, g, dtype)
    x = torch.randn(4096, 1024, device="cuda", generator=g).to(dtype)
    b = torch.randn(2048, device="cuda", generator=g).to(dtype)
    want = torch.nn.functional.linear(x.float(), w.float(), b.float()).to(dtype)
    choice = choose_f1(0, dtype, 4096, 1024, 2048)
    assert choice.why.startswith("F1 cu")
    for alg in {0, choice.alg} - {None}:
        torch.testing.assert_close(cslt_linear(x, w, b, alg), want, rtol=2e-2, atol=5e-2)


def test_gather_op_with_cusparselt_f1_matches_cublas_f1():
    from sparse_compile import SparsityConfig

    leaves = ffn_leaves(4, torch.bfloat16)
    spec = SparsityConfig(weights="2:4", activations="64:2:8").op_spec()
    op = torch.ops.sparse_compile.sqrelu_ffn_vnm
    outs = [run_with_grads(op, leaves, "2:4", spec + suffix) for suffix in ("", ";f1_alg=0")]
    for i, (a, b) in enumerate(zip(*outs, strict=True)):
        assert _rel(a, b) < 2e-2, f"output {i}"


def test_compiled_venom_model_reports_the_measured_f1_choice():
    from sparse_compile import compile_reports

    torch._dynamo.reset()
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1024))

    class SqReLU(torch.nn.Module):
        def forward(self, x):
            return torch.relu(x).square()

    model[1] = SqReLU()
    model = model.cuda().to(torch.bfloat16)
    options = {"weights": "2:4", "activations": "64:2:8", "small_ffn": "sparse"}  # 3.4e10: under the size rule
    compiled = torch.compile(model, backend="sparse", options=options)
    x = torch.randn(8192, 1024, device="cuda", dtype=torch.bfloat16)
    compiled(x).float().sum().backward()
    (site,) = compile_reports()[-1].sparse_sites
    assert "F1 cuSPARSELt alg" in site.record.reason or "F1 cuBLAS (cuSPARSELt best" in site.record.reason
