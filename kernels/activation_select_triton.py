"""Fused squared-ReLU V:N:M selection in Triton: Z -> compact H~, compact relu(Z), column ids.

One program owns one block of V tokens x BLOCK_G groups of M hidden units, in two passes over
its rows (ROWS at a time; with ROWS >= V the whole block is one register tile, read once):
  1. read Z, R = relu(Z + b), H = R^2 (each rounded to Z's dtype, as the reference does), and
     sum the column L1 norms of H over the V tokens (float32); keep the 4 columns of largest norm
     per M-group (rank = #larger + #equal at a lower index): 4 column ids c_0 < c_1 < c_2 < c_3;
  2. read Z again (the tile was just read: it comes from L2), pick the 4 kept values per group,
     keep per row the N largest of them (ties to the lower column), and store [ROWS, 4*BLOCK_G]
     contiguous row segments of h_c and r_c.
Bytes per call: read T*F (+F bias), write 2 * T*F*4/M values + (T/V)*F*4/M int32 ids. At M=8,
2 + 2 bytes per element of Z in bf16: the kernel should run at copy speed.
Same answer as kernels/activation_mask.py:vnm_compact_ref (ties included; column norms are
summed in a different order, so only norms equal to within rounding can pick differently).
"""

import torch
import triton
import triton.language as tl

from sparse_compile.kernels.activation_mask import _check

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@triton.jit
def _pick(x, j, c):
    """x [ROWS, G, M_P] -> [ROWS, G]: x[:, g, c[g]]."""
    return tl.sum(tl.where((j[None, :] == c[:, None])[None, :, :], x, 0.0), axis=2)


@triton.jit
def _four(a, b, c, d):
    """Four [ROWS, G] tensors -> [ROWS, 4*G] interleaved: a0 b0 c0 d0 a1 b1 ..."""
    x = tl.join(tl.join(a, c), tl.join(b, d))  # [ROWS, G, 2, 2]: x[..., i, k] = (a, b, c, d)[2 i + k]
    return tl.reshape(x, (a.shape[0], a.shape[1] * 4))


@triton.jit
def _relu_tile(z_ptr, bias, rows, row_ok, cols, col_ok, stride_z, HAS_BIAS: tl.constexpr):
    """R = relu(Z + b) of [ROWS, BLOCK_G, M_P] (Z + b rounded to Z's dtype, as the reference does),
    as float32, and the mask of its valid elements."""
    ok = row_ok[:, None, None] & col_ok[None, :, :]
    z = tl.load(z_ptr + rows[:, None, None].to(tl.int64) * stride_z + cols[None, :, :], mask=ok, other=0.0)
    zf = z.to(tl.float32)
    if HAS_BIAS:
        zf = zf + bias[None, :, :]
    return tl.maximum(zf.to(z_ptr.dtype.element_ty).to(tl.float32), 0.0), ok


@triton.jit
def _emit(r, j, c0, c1, c2, c3, rows, row_ok, out, out_ok, hc_ptr, rc_ptr, stride_c, N: tl.constexpr):
    """Pick the 4 kept columns of R [ROWS, BLOCK_G, M_P], keep per row the N of largest H = R^2
    (value descending, then column ascending), store [ROWS, 4*BLOCK_G] segments of h_c and r_c."""
    dtype = hc_ptr.dtype.element_ty
    r0_, r1_, r2_, r3_ = _pick(r, j, c0), _pick(r, j, c1), _pick(r, j, c2), _pick(r, j, c3)
    h0 = (r0_ * r0_).to(dtype).to(tl.float32)
    h1 = (r1_ * r1_).to(dtype).to(tl.float32)
    h2 = (r2_ * r2_).to(dtype).to(tl.float32)
    h3 = (r3_ * r3_).to(dtype).to(tl.float32)
    if N == 4:
        k0 = h0 == h0
        k1 = k0
        k2 = k0
        k3 = k0
    else:
        k0 = ((h1 > h0).to(tl.int32) + (h2 > h0).to(tl.int32) + (h3 > h0).to(tl.int32)) < N
        k1 = ((h0 >= h1).to(tl.int32) + (h2 > h1).to(tl.int32) + (h3 > h1).to(tl.int32)) < N
        k2 = ((h0 >= h2).to(tl.int32) + (h1 >= h2).to(tl.int32) + (h3 > h2).to(tl.int32)) < N
        k3 = ((h0 >= h3).to(tl.int32) + (h1 >= h3).to(tl.int32) + (h2 >= h3).to(tl.int32)) < N
    hc = _four(tl.where(k0, h0, 0.0), tl.where(k1, h1, 0.0), tl.where(k2, h2, 0.0), tl.where(k3, h3, 0.0))
    rc = _four(tl.where(k0, r0_, 0.0), tl.where(k1, r1_, 0.0), tl.where(k2, r2_, 0.0), tl.where(k3, r3_, 0.0))
    dst = rows[:, None].to(tl.int64) * stride_c + out[None, :]
    mask = row_ok[:, None] & out_ok[None, :]
    tl.store(hc_ptr + dst, hc.to(dtype), mask=mask)
    tl.store(rc_ptr + dst, rc.to(dtype), mask=mask)


@triton.jit
def _vnm_select_kernel(
    z_ptr, b_ptr, hc_ptr, rc_ptr, ids_ptr,
    G, stride_z, stride_c, stride_ids,
    V: tl.constexpr, N: tl.constexpr, M: tl.constexpr, M_P: tl.constexpr,
    ROWS: tl.constexpr, BLOCK_G: tl.constexpr, HAS_BIAS: tl.constexpr,
):  # fmt: skip
    tb = tl.program_id(0)  # token block
    g0 = tl.program_id(1) * BLOCK_G  # first M-group of this program
    grp = g0 + tl.arange(0, BLOCK_G)
    j = tl.arange(0, M_P)
    r_idx = tl.arange(0, ROWS)
    g_ok = grp < G
    col_ok = g_ok[:, None] & (j[None, :] < M)  # [BLOCK_G, M_P]
    cols = grp[:, None] * M + j[None, :]  # absolute hidden column
    dtype = z_ptr.dtype.element_ty
    if HAS_BIAS:
        bias = tl.load(b_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    else:
        bias = 0.0

    # pass 1: column norms of H over the block's V tokens (ROWS >= V: the whole block in one tile,
    # kept in registers for pass 2 instead of read again)
    norms = tl.zeros((BLOCK_G, M_P), dtype=tl.float32)
    if ROWS >= V:
        r_all, ok = _relu_tile(z_ptr, bias, tb * V + r_idx, r_idx < V, cols, col_ok, stride_z, HAS_BIAS)
        norms += tl.sum(tl.where(ok, (r_all * r_all).to(dtype).to(tl.float32), 0.0), axis=0)
    else:
        for r0 in range(0, V, ROWS):
            r, ok = _relu_tile(z_ptr, bias, tb * V + r0 + r_idx, (r0 + r_idx) < V, cols, col_ok, stride_z, HAS_BIAS)
            norms += tl.sum(tl.where(ok, (r * r).to(dtype).to(tl.float32), 0.0), axis=0)

    # the 4 columns of largest norm per group; a column is "behind" each larger or equal-and-left one
    norms = tl.where(col_ok, norms, float("-inf"))
    left = j[None, None, :] < j[None, :, None]  # [1, M_P(this), M_P(other)]: other is left of this
    a = norms[:, :, None]
    b = norms[:, None, :]
    chosen = (tl.sum(((b > a) | ((b == a) & left)).to(tl.int32), axis=2) < 4) & col_ok
    pos = tl.sum((chosen[:, None, :] & left).to(tl.int32), axis=2)  # place among the group's 4
    c0 = tl.sum(tl.where(chosen & (pos == 0), j[None, :], 0), axis=1)  # [BLOCK_G], ascending
    c1 = tl.sum(tl.where(chosen & (pos == 1), j[None, :], 0), axis=1)
    c2 = tl.sum(tl.where(chosen & (pos == 2), j[None, :], 0), axis=1)
    c3 = tl.sum(tl.where(chosen & (pos == 3), j[None, :], 0), axis=1)
    out = g0 * 4 + tl.arange(0, 4 * BLOCK_G)  # compact columns of this program
    out_ok = out < G * 4
    ids = tl.reshape(_four(c0[None, :], c1[None, :], c2[None, :], c3[None, :]), (4 * BLOCK_G,)) + (out // 4) * M
    tl.store(ids_ptr + tb.to(tl.int64) * stride_ids + out, ids.to(tl.int32), mask=out_ok)

    # pass 2: the kept values, the in-row choice among them, contiguous stores
    if ROWS >= V:
        _emit(r_all, j, c0, c1, c2, c3, tb * V + r_idx, r_idx < V, out, out_ok, hc_ptr, rc_ptr, stride_c, N)
    else:
        for r0 in range(0, V, ROWS):
            rows = tb * V + r0 + r_idx
            row_ok = (r0 + r_idx) < V
            r, _ = _relu_tile(z_ptr, bias, rows, row_ok, cols, col_ok, stride_z, HAS_BIAS)
            _emit(r, j, c0, c1, c2, c3, rows, row_ok, out, out_ok, hc_ptr, rc_ptr, stride_c, N)


def vnm_select_compact(
    z: torch.Tensor,
    bias: torch.Tensor | None,
    v: int,
    n: int,
    m: int,
    block_g: int | None = None,
    rows: int | None = None,
    num_warps: int = 4,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Triton version of ``vnm_compact_ref(z, bias, v, n, m)``: (h_c, r_c, ids), same shapes and dtypes.

    Tiling (powers of two; the defaults are what bench/select_kernel.py measured): ``block_g`` M-groups
    per program, ``rows`` token rows per step of each pass, ``num_warps``.
    """
    if not isinstance(z, torch.Tensor) or z.dtype not in _DTYPES:
        raise ValueError(f"vnm_select_compact: z.dtype={getattr(z, 'dtype', type(z))}; expected one of {_DTYPES}")
    _check(z, v, n, m)
    if not z.is_contiguous():
        raise ValueError("vnm_select_compact: z must be contiguous (row-major [T, F])")
    t, f = z.shape
    if bias is not None and (bias.shape != (f,) or bias.dtype != z.dtype or not bias.is_contiguous()):
        raise ValueError(
            f"vnm_select_compact: bias must be contiguous [{f}] of {z.dtype}; got {tuple(bias.shape)} {bias.dtype}"
        )
    kc = f * 4 // m
    h_c = torch.empty(t, kc, device=z.device, dtype=z.dtype)
    r_c = torch.empty_like(h_c)
    ids = torch.empty(t // v, kc, device=z.device, dtype=torch.int32)
    m_p = triton.next_power_of_2(m)
    # Defaults from the H100 sweep (bench/RESULTS.md): 64 hidden columns x 16 rows per step was the
    # best or within 10% of it for 128:2:16, 128:2:8 and 64:2:8 (256 x 16 was 1.2-1.6x slower).
    if block_g is None:  # V=1 (2:4) has one row per program: give it 256 columns (1.57 ms vs 9.6 ms)
        block_g = max(1, min(triton.next_power_of_2(f // m), (256 if v == 1 else 64) // m_p))
    if rows is None:
        rows = max(1, min(triton.next_power_of_2(v), 16))
    grid = (t // v, triton.cdiv(f // m, block_g))
    _vnm_select_kernel[grid](
        z, bias if bias is not None else z, h_c, r_c, ids,
        f // m, z.stride(0), h_c.stride(0), ids.stride(0),
        V=v, N=n, M=m, M_P=m_p, ROWS=rows, BLOCK_G=block_g, HAS_BIAS=bias is not None, num_warps=num_warps,
    )  # fmt: skip
    return h_c, r_c, ids
