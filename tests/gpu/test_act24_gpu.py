"""2:4 activations on cuSPARSELt (kernels/ffn_act24_cslt.py) on an sm90 GPU: the fused kernels bit for bit
at full size (h_buf also against torch._cslt_compress), the op's output and gradients against the
reference op and the oracle, and a compiled GPT that trains on it like on the reference kernels.
Run by hand on H100/H200."""

import pytest
import torch

from sparse_compile import SparsityConfig
from sparse_compile.kernels.activation_select_24_triton import activation_24
from sparse_compile.kernels.sqrelu_24_compress_triton import (
    sqrelu_24_backward,
    sqrelu_24_backward_ref,
    sqrelu_24_compress,
    sqrelu_24_compress_ref,
)
from sparse_compile.planning.plan import CSLT24

from ..oracle import oracle_ffn
from .test_cuda_reference import _rel, assert_trains_like_reference, train_gpt
from .test_gather_gpu import _poison, ffn_leaves, run_with_grads

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (the CPU path is in tests/)"),
    pytest.mark.skipif(
        torch.cuda.is_available() and torch.cuda.get_device_capability()[0] != 9,
        reason="the fused compressor writes the sm90 (Hopper) layout",
    ),
]


def _bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a.view(torch.int16), b.view(torch.int16))


@pytest.mark.parametrize("t, h", [(16384, 8192), (4096, 16384), (1024, 192)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_kernels_bit_exact(t, h, dtype):
    g = torch.Generator(device="cuda").manual_seed(t + h)
    z = torch.randn(t, h, device="cuda", generator=g).to(dtype)
    _poison()
    h_buf, r_buf = sqrelu_24_compress(z)
    want_h, want_r = sqrelu_24_compress_ref(z)
    assert _bits_equal(h_buf, want_h) and _bits_equal(r_buf, want_r)
    assert _bits_equal(h_buf, torch._cslt_compress(activation_24(z, masked=True)[2])), "vs cuSPARSELt"
    h_dense, r_again = sqrelu_24_compress(z, dense_h=True)  # the F2-on-cuBLAS form
    assert _bits_equal(h_dense, activation_24(z, masked=True)[2]) and _bits_equal(r_again, want_r)
    dh = torch.randn(t, h, device="cuda", generator=g).to(dtype)
    _poison()
    got, want = sqrelu_24_backward(dh, r_buf), sqrelu_24_backward_ref(dh, r_buf)
    assert _bits_equal(got[0], want[0]), "dz_buf"
    assert torch.equal(got[1], want[1]) and torch.equal(got[2], want[2])


@pytest.mark.parametrize("weights", [None, "2:4"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_op_matches_reference_op_and_oracle(weights, dtype):
    from sparse_compile.planning.act24_choice import choose_act24

    leaves = ffn_leaves(2, dtype)  # T = 1024, d = 512, h = 2048
    config = SparsityConfig(weights=weights, activations="2:4")
    ops = torch.ops.sparse_compile
    ref = run_with_grads(ops.sqrelu_ffn, leaves, weights, config.op_spec())
    y_oracle, _ = oracle_ffn(*(t.detach() for t in leaves), config)
    choice = choose_act24(0, dtype, 1024, 512, 2048)
    assert choice.alg is not None, choice.why
    f1 = [""] + ([";f1_alg=0"] if weights else [])
    for suffix in {f";act24_alg={a}" for a in (0, choice.alg, -1)}:  # -1: F2, B3 on cuBLAS
        for f1_suffix in f1:
            _poison()
            got = run_with_grads(ops.sqrelu_ffn_24, leaves, weights, config.op_spec() + suffix + f1_suffix)
            assert all(torch.isfinite(o).all() for o in got)
            for i, (a, b) in enumerate(zip(got, ref, strict=True)):
                assert a.dtype == b.dtype and a.shape == b.shape
                assert _rel(a, b) < 1e-2, f"output {i}{suffix}{f1_suffix}: cuSPARSELt vs reference op"
            assert _rel(got[0], y_oracle) < 1e-2


def test_gpt_trains_on_cusparselt_activations_like_on_reference_kernels():
    """The run memorizes its batch (5.6 -> 0.03); compared as assert_trains_like_reference says."""
    # kernels="triton": cuSPARSELt even where cuBLAS measured faster
    fast, kernels, notes = train_gpt({"activations": "2:4", "kernels": "triton"})
    assert kernels == {CSLT24} and all("F2, B3 on cuSPARSELt alg" in n for n in notes), notes
    assert_trains_like_reference(fast, {"activations": "2:4"})


def test_choice_measures_cusparselt_against_cublas():
    from sparse_compile.planning.act24_choice import choose_act24

    choice = choose_act24(0, torch.bfloat16, 16384, 2048, 8192)
    assert choice.alg is not None and choice.ratio > 0 and "x cuBLAS" in choice.why
