"""2:4 activations straight into cuSPARSELt's sm90 buffers (kernels/sqrelu_24_compress_triton.py): the Triton
kernels vs their pure-torch references, bit for bit, and the references vs independent definitions
(the FFN reference's R~, H~, dZ~; the compressor validated against real _cslt_compress output)."""

import pytest
import torch

from sparse_compile.kernels import vnm_mask
from sparse_compile.kernels.activation_select_24_triton import activation_24_ref
from sparse_compile.kernels.cslt_compress_triton import cslt_compress_ref, random_24
from sparse_compile.kernels.ffn_reference import sqrelu_ffn_backward_ref
from sparse_compile.kernels.sqrelu_24_compress_triton import (
    cslt_decompress_ref,
    sqrelu_24_backward,
    sqrelu_24_backward_ref,
    sqrelu_24_compress,
    sqrelu_24_compress_ref,
)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float16] + ([torch.bfloat16] if DEVICE == "cuda" else [])  # bf16 dots aside, fp16 on CPU
SHAPES = [(64, 64), (128, 320), (192, 256)]  # 320: a program with a partial set of column tiles


def _z(t: int, h: int, dtype: torch.dtype, ties: bool, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed + t * h)
    z = torch.randint(-2, 3, (t, h), generator=g).float() if ties else torch.randn(t, h, generator=g)
    return z.to(DEVICE, dtype)


def _bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a.view(torch.int16), b.view(torch.int16))


@pytest.mark.parametrize("t, h", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("ties", [False, True], ids=["randn", "ties"])
def test_forward_equals_reference(t, h, dtype, ties):
    z = _z(t, h, dtype, ties)
    for name, got, want in zip(("h_buf", "r_buf"), sqrelu_24_compress(z), sqrelu_24_compress_ref(z), strict=True):
        assert _bits_equal(got, want), name


@pytest.mark.parametrize("t, h", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("ties", [False, True], ids=["randn", "ties"])
def test_forward_dense_h_equals_the_masked_activation(t, h, dtype, ties):
    """dense_h=True (F2 on cuBLAS): H~ dense, bit for bit the 2:4 kernel's masked H~ (whose own
    reference is the 2:4 mask of relu(Z)^2), and the same r_buf."""
    z = _z(t, h, dtype, ties)
    h_dense, r_buf = sqrelu_24_compress(z, dense_h=True)
    assert _bits_equal(h_dense, activation_24_ref(z, masked=True)[2])
    assert _bits_equal(r_buf, sqrelu_24_compress_ref(z)[1])


@pytest.mark.parametrize("t, h", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_backward_equals_reference(t, h, dtype):
    z = _z(t, h, dtype, ties=False)
    dh = _z(t, h, dtype, ties=False, seed=1)
    _, r_buf = sqrelu_24_compress_ref(z)
    got, want = sqrelu_24_backward(dh, r_buf), sqrelu_24_backward_ref(dh, r_buf)
    assert _bits_equal(got[0], want[0]), "dz_buf"
    for name, a, b in zip(("dz", "h"), got[1:], want[1:], strict=True):
        assert a.dtype == b.dtype and torch.equal(a, b), name  # -0.0 == 0.0: dH * 0 keeps dH's sign


def test_references_hold_the_ffn_references_tensors():
    """Decoded, the buffers are R~ and H~ of the FFN reference (activations 1:2:4), and the backward's
    dZ~ and H~ are what sqrelu_ffn_backward_ref computes from R~."""
    t, h, d = 128, 256, 32
    g = torch.Generator().manual_seed(5)
    z = torch.randn(t, h, generator=g).half()
    r = torch.relu(z)
    keep = vnm_mask(r * r, 1, 2, 4)
    h_buf, r_buf = sqrelu_24_compress_ref(z)
    assert torch.equal(cslt_decompress_ref(h_buf, t, h), r * r * keep)
    assert torch.equal(cslt_decompress_ref(r_buf, t, h), r * keep)
    dy, x, w2 = (torch.randn(*s, generator=g).half() for s in ((t, d), (t, d), (d, h)))
    w1 = torch.randn(h, d, generator=g).half()
    dh = dy @ w2
    dz_buf, dz, hm = sqrelu_24_backward_ref(dh, r_buf)
    dx, dw1, db1, dw2, _ = sqrelu_ffn_backward_ref(dy, x, w1, w2, r * keep)
    assert torch.equal(cslt_decompress_ref(dz_buf, t, h), dz)
    assert torch.equal(dz.t() @ x, dw1) and torch.equal(dy.t() @ hm, dw2) and torch.equal(dz.sum(0), db1)
    assert torch.equal(dz @ w1, dx)


def test_decompress_inverts_the_validated_compressor():
    g = torch.Generator().manual_seed(2)
    a = random_24(128, 256, g, torch.float16)
    assert torch.equal(cslt_decompress_ref(cslt_compress_ref(a), 128, 256), a)


def _bad(shape, dtype=torch.float16):
    return torch.randn(*shape).to(DEVICE, dtype)


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: sqrelu_24_compress(_bad((96, 64))), r"\(96, 64\).*multiples of 64"),
        (lambda: sqrelu_24_compress(_bad((64, 96))), r"\(64, 96\).*multiples of 64"),
        (lambda: sqrelu_24_compress(_bad((64, 64), torch.float32)), "float32 not supported"),
        (lambda: sqrelu_24_compress(_bad((128, 64)).t()), "contiguous"),
        (lambda: sqrelu_24_backward(_bad((64, 128)), _bad((64, 72), torch.bfloat16)), r"r_buf \(64, 72\) torch.bf"),
        (lambda: sqrelu_24_backward(_bad((64, 128)), _bad((64, 64))), r"r_buf \(64, 64\).*expected.*\(64, 72\)"),
    ],
)
def test_rejects_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()
