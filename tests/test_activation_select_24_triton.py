"""2:4 activations compressed (values + metadata + masked dense): Triton vs reference, bit for bit."""

import pytest
import torch

from sparse_compile.kernels import vnm_mask
from sparse_compile.kernels.activation_select_24_triton import activation_24, activation_24_ref

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float16, torch.float32] + ([torch.bfloat16] if DEVICE == "cuda" else [])


@pytest.mark.parametrize("t, h", [(16, 16), (5, 12), (33, 264)])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("ties", [False, True])
def test_equals_reference(t, h, dtype, bias, ties):
    g = torch.Generator().manual_seed(t * h)
    z = torch.randint(-2, 3, (t, h), generator=g).float() if ties else torch.randn(t, h, generator=g)
    z = z.to(DEVICE, dtype)
    b = (torch.randn(h, generator=g) * 0.1).to(DEVICE, dtype) if bias else None
    got = activation_24(z, b, masked=True)
    want = activation_24_ref(z, b, masked=True)
    for name, a, r in zip(("values", "meta", "masked"), got, want, strict=True):
        assert a.dtype == r.dtype and torch.equal(a, r), name


def test_reference_is_the_2_4_mask():
    """Independent check of the reference: decoding values + meta gives H * vnm_mask(H, 1, 2, 4)."""
    z = torch.randn(8, 32)
    values, meta, masked = activation_24_ref(z, masked=True)
    h = torch.relu(z) ** 2
    want = h * vnm_mask(h, 1, 2, 4)
    decoded = torch.zeros(8, 8, 4)
    i0, i1 = (meta & 3).long(), (meta >> 2).long()
    assert (i0 < i1).all()
    decoded.scatter_(2, i0.unsqueeze(-1), values[:, 0::2].unsqueeze(-1))
    decoded.scatter_(2, i1.unsqueeze(-1), values[:, 1::2].unsqueeze(-1))
    assert torch.equal(decoded.reshape(8, 32), want) and torch.equal(masked, want)


@pytest.mark.parametrize(
    "z, match",
    [(torch.randn(4, 6), "multiple of 4"), (torch.randn(4, 8).double(), "float64"), (torch.randn(8, 4).t(), "contig")],
)
def test_rejects_bad_input(z, match):
    with pytest.raises(ValueError, match=match):
        activation_24(z.to(DEVICE))
