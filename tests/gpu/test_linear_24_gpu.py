"""2:4 weights alone on an sm90 GPU: sparse_compile::linear_24 on every correct cuSPARSELt algorithm
against F.linear (output and gradients), and a compiled FFN whose linears were rewritten into it
against the reference kernels. Run by hand on H100/H200."""

import pytest
import torch

from sparse_compile import compile_reports
from sparse_compile.kernels import transposable_24_mask
from sparse_compile.planning.plan import W24

from .test_cuda_reference import _rel

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (the CPU path is in tests/)"),
    pytest.mark.skipif(
        torch.cuda.is_available() and torch.cuda.get_device_capability()[0] != 9,
        reason="the cuSPARSELt compressor writes the sm90 (Hopper) layout",
    ),
]


@pytest.mark.parametrize("d_in, d_out", [(1024, 2048), (2048, 1024)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_linear_24_matches_linear_on_each_chosen_algorithm(d_in, d_out, dtype):
    from sparse_compile.planning.f1_choice import choose_f1

    g = torch.Generator(device="cuda").manual_seed(d_in)
    w = torch.randn(d_out, d_in, device="cuda", generator=g).to(dtype)
    w = (w * transposable_24_mask(w)).requires_grad_()
    x = torch.randn(4, 1024, d_in, device="cuda", generator=g).to(dtype).requires_grad_()
    b = torch.randn(d_out, device="cuda", generator=g).to(dtype).requires_grad_()
    gy = torch.randn(4, 1024, d_out, device="cuda", generator=g).to(dtype)
    y_ref = torch.nn.functional.linear(x, w, b)
    want = torch.autograd.grad(y_ref, (x, w, b), gy)
    fwd = choose_f1(0, dtype, 4096, d_in, d_out).alg
    bwd = choose_f1(0, dtype, 4096, d_out, d_in).alg
    for algs in {(0, 0), (-1 if fwd is None else fwd, -1 if bwd is None else bwd)}:
        y = torch.ops.sparse_compile.linear_24(x, w, b, *algs)
        got = torch.autograd.grad(y, (x, w, b), gy)
        assert _rel(y, y_ref) < 1e-2, algs
        for name, a, r in zip("xwb", got, want, strict=True):
            assert _rel(a, r) < 1e-2, (name, algs)


def test_compiled_ffn_on_cusparselt_linears_matches_reference_kernels():
    """A large FFN (cuSPARSELt measured faster than cuBLAS on an H100 for F1 there), one step."""
    t, d, h = 16384, 4096, 16384
    model = torch.nn.Sequential(torch.nn.Linear(d, h), torch.nn.ReLU(), torch.nn.Linear(h, d))

    class Sq(torch.nn.Module):
        def forward(self, x):
            return torch.relu(x).square()

    model[1] = Sq()
    model = model.cuda().to(torch.bfloat16)
    x = torch.randn(t, d, device="cuda", dtype=torch.bfloat16)
    gy = torch.randn(t, d, device="cuda", dtype=torch.bfloat16)
    outs = {}
    for kernels in ("auto", "reference"):
        torch._dynamo.reset()
        options = {"weights": "2:4", "kernels": kernels, "small_ffn": "sparse"}  # under the size rule
        compiled = torch.compile(model, backend="sparse", options=options)
        xl = x.clone().requires_grad_()
        y = compiled(xl)
        y.backward(gy)
        outs[kernels] = [y.detach(), xl.grad] + [p.grad.clone() for p in model.parameters()]
        model.zero_grad()
        (site,) = compile_reports()[-1].sparse_sites
        if kernels == "auto":
            assert site.kernel == W24 and "F1, B1 cuSPARSELt alg" in site.record.reason, site.record.reason
    for i, (a, b) in enumerate(zip(outs["auto"], outs["reference"], strict=True)):
        assert _rel(a, b) < 1e-2, f"output {i}"
