"""The Triton transposable 2:4 kernel equals the reference bit for bit (interpreter on CPU)."""

import pytest
import torch

from sparse_compile.kernels import transposable_24_mask
from sparse_compile.kernels.weight_mask_triton import sparsify_24_triton

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float16, torch.float32] + ([torch.bfloat16] if DEVICE == "cuda" else [])


@pytest.mark.parametrize("shape", [(4, 4), (8, 12), (20, 36), (64, 16)])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("method", ["pairs", "dot"])
def test_equals_reference(shape, dtype, ties, method):
    g = torch.Generator().manual_seed(shape[0] * shape[1])
    w = torch.randint(-2, 3, shape, generator=g).float() if ties else torch.randn(shape, generator=g)
    w = w.to(DEVICE, dtype)
    got, mask = sparsify_24_triton(w, with_mask=True, tiles=16, method=method)
    want = transposable_24_mask(w)
    assert torch.equal(mask, want)
    assert torch.equal(got, w * want) and torch.equal(got.signbit(), (w * want).signbit())  # -0.0 where dropped
    tiles = mask.reshape(shape[0] // 4, 4, shape[1] // 4, 4)
    assert (tiles.sum(3) == 2).all() and (tiles.sum(1) == 2).all()  # two per row and column of every tile


@pytest.mark.parametrize("dtype", DTYPES)
def test_close_calls_are_decided_exactly(dtype):
    """Magnitudes 1 and 2^-24 in every tile: float32 sums of 8 entries would drop the 2^-24 (ulp of
    8 is 2^-20), so patterns with equal counts of ones tie unless scored exactly (float64)."""
    g = torch.Generator().manual_seed(5)
    w = torch.tensor([1.0, 2.0**-24, 0.0])[torch.randint(0, 3, (16, 64), generator=g)]
    w = (w * torch.where(torch.rand(16, 64, generator=g) < 0.5, -1.0, 1.0)).to(DEVICE, dtype)
    got, mask = sparsify_24_triton(w, with_mask=True, tiles=16)
    want = transposable_24_mask(w)
    assert torch.equal(mask, want)


def test_strided_rows():
    w = torch.randn(8, 24, device=DEVICE)[:, :16]  # row stride 24
    assert torch.equal(sparsify_24_triton(w), w * transposable_24_mask(w))


@pytest.mark.parametrize(
    "w, match",
    [
        (torch.randn(6, 8), "multiples of 4"),
        (torch.randn(8, 8).double(), "float64"),
        (torch.randn(2, 8, 8), r"\(2, 8, 8\)"),
        (torch.randn(8, 8).t(), "contiguous rows"),
    ],
)
def test_rejects_bad_input(w, match):
    with pytest.raises(ValueError, match=match):
        sparsify_24_triton(w.to(DEVICE))


def test_generated_kernel_is_what_the_generator_writes():
    from sparse_compile.kernels import weight_mask_gen

    assert weight_mask_gen.TARGET.read_text() == weight_mask_gen.kernel_source(), (
        "regenerate: python -m sparse_compile.kernels.weight_mask_gen"
    )


def test_unknown_method():
    with pytest.raises(ValueError, match="method='fast'"):
        sparsify_24_triton(torch.randn(8, 8, device=DEVICE), method="fast")
