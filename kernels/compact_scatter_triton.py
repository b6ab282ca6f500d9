"""Compact V:N:M -> dense, in Triton (reference: kernels/gather_reference.py:vnm_scatter_ref).

D [T, F] with D[t, ids[t // V, k]] = c[t, k] (squared first if asked), zeros elsewhere. The
exact weight gradients need the dense operand: dW2 = dY^T H~ and dW1 = dZ^T X.

One program writes a [ROWS, BLOCK_G * M] tile of D (ROWS divides V, so one id set) in full,
zeros included: no memset pass, and every store is a contiguous row segment. Column j of group g
takes the compact value whose id is g*M + j (at most one of the group's 4 matches).
Bytes: read T*Kc values + ids, write T*F: one write pass over D.

vnm_colsum: the column sums of D without forming it (db1 = sum over tokens of the scattered dZ):
one program per G M-groups walks the T/V blocks in order, sums each block's V rows of its 4G
compact columns in float32 and adds them at their units (one-hot within each group: the 4 ids of
a group are distinct units of it). One read of c, one launch, a fixed summation order. Count at
(T, h) = (16384, 8192), 128:4:16: 67 MB read by 128 programs, each a serial walk of 32 steps of
16 KB loads (2 MB in flight in all).
"""

import torch
import triton
import triton.language as tl

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@triton.jit
def _scatter_kernel(
    c_ptr, ids_ptr, out_ptr, G, V, stride_c, stride_ids, stride_out,
    M: tl.constexpr, M_P: tl.constexpr, ROWS: tl.constexpr, BLOCK_G: tl.constexpr, SQUARE: tl.constexpr,
):  # fmt: skip
    r0 = tl.program_id(0) * ROWS
    rows = r0 + tl.arange(0, ROWS)
    grp = tl.program_id(1) * BLOCK_G + tl.arange(0, BLOCK_G)
    g_ok = grp < G
    j = tl.arange(0, M_P)
    blk = r0 // V
    dense = tl.zeros((ROWS, BLOCK_G, M_P), dtype=out_ptr.dtype.element_ty)
    for p in tl.static_range(4):
        col = tl.load(ids_ptr + blk.to(tl.int64) * stride_ids + grp * 4 + p, mask=g_ok, other=-1) - grp * M
        val = tl.load(c_ptr + rows[:, None].to(tl.int64) * stride_c + grp[None, :] * 4 + p, mask=g_ok[None, :])
        if SQUARE:
            val = val * val
        hit = col[None, :, None] == j[None, None, :]
        dense = tl.where(hit, val[:, :, None], dense)
    dst = rows[:, None, None].to(tl.int64) * stride_out + grp[None, :, None] * M + j[None, None, :]
    tl.store(out_ptr + dst, dense, mask=g_ok[None, :, None] & (j < M)[None, None, :])


def vnm_scatter(c: torch.Tensor, ids: torch.Tensor, v: int, m: int, square: bool = False) -> torch.Tensor:
    """Dense [T, Kc*M/4] from compact c [T, Kc] and ids [T/V, Kc] (c*c, rounded to c's dtype, if ``square``)."""
    if c.dtype not in _DTYPES or ids.dtype != torch.int32:
        raise ValueError(f"vnm_scatter: c.dtype={c.dtype} (expected one of {_DTYPES}), ids.dtype={ids.dtype} (int32)")
    t, kc = c.shape
    if v < 1 or t % v or ids.shape != (t // v, kc) or kc % 4 or m % 4 or m < 4:
        raise ValueError(f"vnm_scatter: c {tuple(c.shape)}, ids {tuple(ids.shape)}, V={v}, M={m} do not match")
    if c.stride(1) != 1 or not ids.is_contiguous():
        raise ValueError("vnm_scatter: c needs contiguous rows and ids must be contiguous")
    g = kc // 4
    out = torch.empty(t, g * m, device=c.device, dtype=c.dtype)
    rows = min(v & -v, 16)  # the largest power of two dividing V, at most 16
    m_p = triton.next_power_of_2(m)
    block_g = max(1, min(triton.next_power_of_2(g), 4096 // (rows * m_p)))
    grid = (t // rows, triton.cdiv(g, block_g))
    _scatter_kernel[grid](
        c, ids, out, g, v, c.stride(0), ids.stride(0), out.stride(0),
        M=m, M_P=m_p, ROWS=rows, BLOCK_G=block_g, SQUARE=square,
    )  # fmt: skip
    return out


@triton.jit
def _colsum_kernel(
    c_ptr, ids_ptr, out_ptr, NB, V, stride_c, stride_ids,
    M: tl.constexpr, M_P: tl.constexpr, G: tl.constexpr, ROWS: tl.constexpr, BLK: tl.constexpr,
):  # fmt: skip
    q = tl.program_id(0) * 4 * G + tl.arange(0, 4 * G)  # this program's compact columns
    first = (tl.program_id(0) * G + tl.arange(0, G)) * M  # the first unit of each of its groups
    j = tl.arange(0, M_P)
    rr = tl.arange(0, ROWS)
    bb = tl.arange(0, BLK)
    steps = V // ROWS
    acc = tl.zeros((G, M_P), dtype=tl.float32)
    # each step loads ROWS rows of BLK blocks at once ([BLK, ROWS, 4G], independent loads in flight:
    # Triton does not software-pipeline loads that feed a reduction)
    for i in range(0, tl.cdiv(NB, BLK) * steps):
        blk = (i // steps) * BLK + bb  # [BLK]
        ok = blk < NB
        rows = (blk[:, None] * V + (i % steps) * ROWS + rr[None, :]).to(tl.int64)  # [BLK, ROWS]
        x = tl.load(c_ptr + rows[:, :, None] * stride_c + q[None, None, :], mask=ok[:, None, None], other=0.0)
        s = tl.sum(x.to(tl.float32), axis=1)  # [BLK, 4G]
        u = tl.load(ids_ptr + blk[:, None] * stride_ids + q[None, :], mask=ok[:, None], other=-1)  # [BLK, 4G]
        local = tl.reshape(u, (BLK, G, 4)) - first[None, :, None]
        hit = local[:, :, :, None] == j[None, None, None, :]  # [BLK, G, 4, M_P]
        add = tl.where(hit, tl.reshape(s, (BLK, G, 4))[:, :, :, None], 0.0)
        acc += tl.sum(tl.sum(add, axis=2), axis=0)
    units = first[:, None] + j[None, :]
    tl.store(out_ptr + units, acc.to(out_ptr.dtype.element_ty), mask=(j < M)[None, :])


def vnm_colsum(c: torch.Tensor, ids: torch.Tensor, v: int, m: int) -> torch.Tensor:
    """vnm_scatter(c, ids, v, m).sum(0) [Kc*M/4] in c's dtype, summed in float32 without forming the
    dense tensor (db1 from the compact dZ: one launch, deterministic)."""
    if c.dtype not in _DTYPES or ids.dtype != torch.int32:
        raise ValueError(f"vnm_colsum: c.dtype={c.dtype} (expected one of {_DTYPES}), ids.dtype={ids.dtype} (int32)")
    t, kc = c.shape
    if v < 16 or v % 16 or t % v or ids.shape != (t // v, kc) or kc % 4 or m % 4 or m < 4:
        raise ValueError(f"vnm_colsum: c {tuple(c.shape)}, ids {tuple(ids.shape)}, V={v} (a multiple of 16), M={m}")
    if c.stride(1) != 1 or not ids.is_contiguous():
        raise ValueError("vnm_colsum: c needs contiguous rows and ids must be contiguous")
    groups = kc // 4
    g = 4 if groups % 4 == 0 else (2 if groups % 2 == 0 else 1)  # 4 groups: 16 compact columns per row read
    # each program walks all T/V blocks: 512 rows x 4G columns per step (16 KB of bf16 in flight at
    # G = 4), as ROWS rows (the largest power of two dividing V, at most 128) of BLK blocks
    rows = min(v & -v, 128)
    out = torch.empty(groups * m, device=c.device, dtype=c.dtype)
    _colsum_kernel[(groups // g,)](
        c, ids, out, t // v, v, c.stride(0), ids.stride(0),
        M=m, M_P=triton.next_power_of_2(m), G=g, ROWS=rows, BLK=512 // rows, num_warps=8,
    )  # fmt: skip
    return out
