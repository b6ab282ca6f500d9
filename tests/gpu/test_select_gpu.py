"""Issue 3's sparsification kernels at full size on a GPU, bit for bit against their pure-torch
references on random data: the V:N:M selection (every one-read default and the two-read kernel),
its |x|-scored form, 2:4 activations, and the transposable 2:4 weight mask. The cuSPARSELt
compressor is in test_cslt_gpu.py, the fused 2:4 -> cuSPARSELt kernels in test_act24_gpu.py.
Run by hand on H100/H200; timings are bench/select_kernel.py's."""

import pytest
import torch

from sparse_compile.kernels import transposable_24_mask
from sparse_compile.kernels.activation_mask import vnm_compact_abs_ref, vnm_compact_ref
from sparse_compile.kernels.activation_select_24_triton import activation_24, activation_24_ref
from sparse_compile.kernels.activation_select_triton import ONCHIP_DEFAULT, vnm_select_abs, vnm_select_compact
from sparse_compile.kernels.weight_mask_triton import sparsify_24_triton

from .test_gather_gpu import _poison

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (the CPU path is in tests/)")

T = 16384
# the one-read defaults, other N on the same tiles, and two patterns left to the two-read kernel
PATTERNS = [(128, 2, 8), (128, 4, 8), (128, 2, 16), (128, 4, 16), (64, 2, 8), (128, 1, 16), (32, 2, 8), (128, 2, 12)]


def _randn(shape, dtype, seed, scale=1.0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return (torch.randn(shape, device="cuda", generator=g) * scale).to(dtype)


@pytest.mark.parametrize("h", [8192, 16384])
@pytest.mark.parametrize("v, n, m", PATTERNS, ids=lambda p: str(p))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("bias", [False, True])
def test_selection_bit_exact(h, v, n, m, dtype, bias):
    h = h // m * m  # M=12: the nearest multiple below
    z = _randn((T, h), dtype, h + v + m)
    b = _randn((h,), dtype, 7, 0.1) if bias else None
    _poison()
    got = vnm_select_compact(z, b, v, n, m)
    for name, a, r in zip(("h_c", "r_c", "ids"), got, vnm_compact_ref(z, b, v, n, m), strict=True):
        assert a.dtype == r.dtype and torch.equal(a, r), name
    h_c, _, ids = got
    grouped = ids.reshape(T // v, h // m, 4).long()
    assert (grouped.diff(dim=-1) > 0).all() and (grouped // m == torch.arange(h // m, device="cuda")[:, None]).all()
    assert ((h_c.reshape(T, h // m, 4) != 0).sum(-1) <= n).all()


def test_patterns_cover_each_one_read_default():
    assert set(ONCHIP_DEFAULT) <= {(v, m) for v, _, m in PATTERNS}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_abs_selection_bit_exact(dtype):
    x = _randn((T, 4096), dtype, 3)
    got = vnm_select_abs(x, 128, 2, 8)
    for name, a, r in zip(("x_c", "ids"), got, vnm_compact_abs_ref(x, 128, 2, 8), strict=True):
        assert a.dtype == r.dtype and torch.equal(a, r), name


@pytest.mark.parametrize("h", [8192, 16384])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("bias", [False, True])
def test_activation_24_bit_exact(h, dtype, bias):
    z = _randn((T, h), dtype, h)
    b = _randn((h,), dtype, 5, 0.1) if bias else None
    _poison()
    for name, a, r in zip(("values", "meta", "masked"), activation_24(z, b, masked=True),
                          activation_24_ref(z, b, masked=True), strict=True):  # fmt: skip
        assert a.dtype == r.dtype and torch.equal(a, r), name


@pytest.mark.parametrize("shape", [(16384, 4096), (4096, 16384)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_weight_mask_bit_exact(shape, dtype):
    w = _randn(shape, dtype, shape[0], shape[1] ** -0.5)
    got, mask = sparsify_24_triton(w, with_mask=True)
    want = transposable_24_mask(w)
    assert torch.equal(mask, want) and torch.equal(got, w * want)


@pytest.mark.parametrize("v, n, m", [(64, 2, 8), (128, 2, 16), (128, 4, 16), (128, 2, 8)], ids=lambda p: str(p))
@pytest.mark.parametrize("seq", [1024, 2048])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_causal_selection_bit_exact(v, n, m, seq, dtype):
    z = _randn((T, 8192), dtype, seq + v + m)
    b = _randn((8192,), dtype, 11, 0.1)
    _poison()
    got = vnm_select_compact(z, b, v, n, m, seq=seq)
    for name, a, r in zip(("h_c", "r_c", "ids"), got, vnm_compact_ref(z, b, v, n, m, seq=seq), strict=True):
        assert a.dtype == r.dtype and torch.equal(a, r), name
    assert not torch.equal(got[2], vnm_compact_ref(z, b, v, n, m)[2])  # not the plain pattern
