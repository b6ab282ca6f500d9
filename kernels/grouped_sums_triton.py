"""The two reductions of the grouped path (kernels/ffn_grouped.py) over rows sorted by chunk, in Triton.

token_sum(rows, inv, k, bias): out[t] = bias + sum_j rows[inv[t k + j]] ([T k, n] -> [T, n]): each
token's k rows (one per kept chunk) added back together with b2, in float32 in a fixed order, rounded
once to rows' dtype. One read of the rows, one write of the output: no [T k, n] gathered copy.
segment_colsum(rows, offs): out[e] = sum of rows[offs[e-1] : offs[e]] ([R, c] -> float32 [E, c]):
db1 of each chunk from dZp, one program per (chunk, column block, part of the chunk's rows) walking
its rows in order, the parts then added in order; an empty chunk sums to zero.
Bytes at (T, d, h, c) = (16384, 2048, 8192, 512), k = 4: token_sum reads 268 MB and writes 67 MB;
segment_colsum reads 67 MB.
"""

import torch
import triton
import triton.language as tl


@triton.jit
def _token_sum_kernel(rows_ptr, inv_ptr, bias_ptr, out_ptr, n, K: tl.constexpr, HAS_BIAS: tl.constexpr,
                      BLOCK: tl.constexpr):  # fmt: skip
    t = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < n
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    for j in tl.static_range(K):
        r = tl.load(inv_ptr + t * K + j).to(tl.int64)
        acc += tl.load(rows_ptr + r * n + cols, mask=ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + t * n + cols, acc.to(out_ptr.dtype.element_ty), mask=ok)


@triton.jit
def _segment_colsum_kernel(
    rows_ptr, offs_ptr, out_ptr, c, n_cols, SPLIT: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr
):
    e = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    part = tl.program_id(2)
    ok = cols < c
    start = tl.load(offs_ptr + e - 1, mask=e > 0, other=0).to(tl.int64)
    end = tl.load(offs_ptr + e).to(tl.int64)
    per = tl.cdiv(end - start, SPLIT * BLOCK_R) * BLOCK_R  # rows per part, whole blocks
    lo = start + part * per
    hi = tl.minimum(lo + per, end)
    acc = tl.zeros((BLOCK_R, BLOCK_C), dtype=tl.float32)
    for r0 in range(lo, hi, BLOCK_R):
        rr = r0 + tl.arange(0, BLOCK_R)
        m = (rr[:, None] < hi) & ok[None, :]
        acc += tl.load(rows_ptr + rr[:, None] * c + cols[None, :], mask=m, other=0.0).to(tl.float32)
    tl.store(out_ptr + (part * n_cols + e * c) + cols, tl.sum(acc, axis=0), mask=ok)


def token_sum(rows: torch.Tensor, inv: torch.Tensor, k: int, bias: torch.Tensor | None = None) -> torch.Tensor:
    """[T, n] in rows' dtype: out[t] = bias + sum_j rows[inv[t k + j]] for rows [T k, n] (bias [n] or None)."""
    rows, inv = rows.contiguous(), inv.contiguous()
    t, n = inv.numel() // k, rows.shape[1]
    out = rows.new_empty((t, n))
    if t == 0:
        return out
    block = min(1024, triton.next_power_of_2(n))
    b = rows if bias is None else bias.contiguous()  # any pointer when there is no bias
    grid = (t, triton.cdiv(n, block))
    _token_sum_kernel[grid](rows, inv, b, out, n, K=k, HAS_BIAS=bias is not None, BLOCK=block)
    return out


def segment_colsum(rows: torch.Tensor, offs: torch.Tensor, split: int = 8) -> torch.Tensor:
    """float32 [E, c]: the column sums of each run rows[offs[e-1] : offs[e]] of rows [R, c] (contiguous),
    offs [E] the cumulative run ends. Each run is cut into ``split`` parts summed by their own programs,
    then the parts are added in order: a fixed summation order, no atomics."""
    rows = rows.contiguous()
    e, c = offs.numel(), rows.shape[1]
    parts = torch.empty((split, e, c), dtype=torch.float32, device=rows.device)
    block_c = min(64, triton.next_power_of_2(c))
    grid = (e, triton.cdiv(c, block_c), split)
    _segment_colsum_kernel[grid](rows, offs, parts, c, e * c, SPLIT=split, BLOCK_R=32, BLOCK_C=block_c)
    return parts.sum(0)
