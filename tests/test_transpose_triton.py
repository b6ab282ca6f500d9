"""The Triton transposed copy equals torch's a.t().contiguous() (interpreter on CPU)."""

import pytest
import torch

from sparse_compile.kernels.transpose_triton import row_major, transpose_copy

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("shape", [(64, 64), (100, 37), (1, 130), (192, 64)])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.bfloat16])
def test_equals_torch(shape, dtype):
    g = torch.Generator().manual_seed(shape[0] * 1000 + shape[1])
    a = torch.randn(shape, generator=g).to(DEVICE, dtype)
    got = transpose_copy(a)
    want = a.t().contiguous()
    assert got.is_contiguous() and got.shape == want.shape and torch.equal(got, want)


def test_row_slice_with_a_longer_stride():
    a = torch.randn(64, 96, device=DEVICE)[:, :80]
    assert torch.equal(transpose_copy(a), a.t().contiguous())


def test_rejects_column_strided_input():
    with pytest.raises(ValueError, match="unit column stride"):
        transpose_copy(torch.randn(8, 16, device=DEVICE).t())


def test_row_major_of_views():
    """Contiguous input comes back as is; a transposed view through the kernel; other strides via torch."""
    a = torch.randn(64, 96, device=DEVICE)
    assert row_major(a) is a
    for view in (a.t(), a[:, ::2], a.t()[:, :40]):
        got = row_major(view)
        assert got.is_contiguous() and torch.equal(got, view.contiguous())
