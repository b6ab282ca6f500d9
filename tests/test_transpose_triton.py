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


@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32])
def test_gathered_rows(index_dtype):
    """rows: a[rows].t().contiguous() in one pass, rows in any order, repeats allowed."""
    g = torch.Generator().manual_seed(3)
    a = torch.randn(130, 72, generator=g).to(DEVICE, torch.float16)
    rows = torch.cat([torch.randperm(130, generator=g), torch.tensor([5, 5, 129])]).to(DEVICE, index_dtype)
    assert torch.equal(transpose_copy(a, rows=rows), a[rows.long()].t().contiguous())


def test_row_slice_with_a_longer_stride():
    a = torch.randn(64, 96, device=DEVICE)[:, :80]
    assert torch.equal(transpose_copy(a), a.t().contiguous())


def test_rejects_column_strided_input_and_bad_rows():
    with pytest.raises(ValueError, match="unit column stride"):
        transpose_copy(torch.randn(8, 16, device=DEVICE).t())
    with pytest.raises(ValueError, match="rows must be contiguous 1-D int32/int64"):
        transpose_copy(torch.randn(8, 16, device=DEVICE), rows=torch.zeros(4, device=DEVICE))


def test_row_major_of_views():
    """Contiguous input comes back as is; a transposed view through the kernel; other strides via torch."""
    a = torch.randn(64, 96, device=DEVICE)
    assert row_major(a) is a
    for view in (a.t(), a[:, ::2], a.t()[:, :40]):
        got = row_major(view)
        assert got.is_contiguous() and torch.equal(got, view.contiguous())
