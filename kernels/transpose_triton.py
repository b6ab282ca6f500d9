"""A contiguous transposed copy, A [R, C] -> A^T [C, R], in Triton: the gather GEMMs and cuSPARSELt
want W2^T [h, d] row-major every step, and `w2.t().contiguous()` runs at a fraction of copy
bandwidth.

One program moves a [BLOCK, BLOCK] tile: coalesced row loads of A, tl.trans in registers (through
shared memory), coalesced row stores of A^T. Bytes: read and write R*C elements once each.
"""

import torch
import triton
import triton.language as tl

BLOCK = 64


@triton.jit
def _transpose_kernel(a_ptr, rows_ptr, out_ptr, R, C, stride_a, stride_o, BLOCK: tl.constexpr, GATHER: tl.constexpr):
    """out[c, r] = a[r, c], or a[rows[r], c] with GATHER (out has R = len(rows) columns)."""
    r = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = (r < R)[:, None] & (c < C)[None, :]
    src = tl.load(rows_ptr + r, mask=r < R, other=0).to(tl.int64) if GATHER else r.to(tl.int64)
    tile = tl.load(a_ptr + src[:, None] * stride_a + c[None, :], mask=ok)
    tl.store(out_ptr + c[:, None].to(tl.int64) * stride_o + r[None, :], tl.trans(tile), mask=tl.trans(ok))


def transpose_copy(
    a: torch.Tensor, rows: torch.Tensor | None = None, block: int = BLOCK, num_warps: int = 4
) -> torch.Tensor:
    """``a.t().contiguous()`` for a 2-D tensor with unit column stride (any dtype), one Triton pass;
    with ``rows`` (int64/int32 indices), ``a[rows].t().contiguous()`` in the same pass."""
    if a.dim() != 2 or a.stride(1) != 1:
        raise ValueError(
            f"transpose_copy: expected a 2-D tensor with unit column stride, got shape {tuple(a.shape)} "
            f"strides {a.stride()}"
        )
    if rows is not None and (
        rows.dim() != 1 or rows.dtype not in (torch.int32, torch.int64) or not rows.is_contiguous()
    ):
        raise ValueError(
            f"transpose_copy: rows must be contiguous 1-D int32/int64, got {tuple(rows.shape)} {rows.dtype}"
        )
    r, c = (a.shape[0] if rows is None else rows.numel()), a.shape[1]
    out = torch.empty(c, r, dtype=a.dtype, device=a.device)
    if out.numel():
        _transpose_kernel[(triton.cdiv(r, block), triton.cdiv(c, block))](
            a, a if rows is None else rows, out, r, c, a.stride(0), out.stride(0),
            BLOCK=block, GATHER=rows is not None, num_warps=num_warps,
        )  # fmt: skip
    return out


def row_major(w: torch.Tensor) -> torch.Tensor:
    """``w.contiguous()``, with a transposed view of a row-major tensor (``w.t()`` of one, as the
    backward of a linear passes) copied by transpose_copy instead of torch's strided copy."""
    if w.is_contiguous():
        return w
    if w.dim() == 2 and w.stride(0) == 1:
        return transpose_copy(w.t())
    return w.contiguous()
