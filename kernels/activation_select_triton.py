"""Fused squared-ReLU V:N:M selection in Triton: Z -> compact H~, compact relu(Z), column ids.

One program owns one block of V tokens x BLOCK_G groups of M hidden units. It reads its Z tile
once, computes R = relu(Z + b) and H = R^2 (each rounded to Z's dtype, as the reference does),
the column L1 norms of H over the V tokens (float32), keeps the 4 columns of largest norm per
M-group (rank = #larger + #equal at a lower index), then per row the N largest of those 4
(N rounds of argmax, ties to the left), and writes only the compact outputs.

Bytes per call: read T*F (+F bias), write 2 * T*F*4/M values + (T/V)*F*4/M int32 ids. At
M=8 that is 2 + 2 bytes per element of Z in bf16: the kernel should run at copy speed.
Same answer as kernels/activation_mask.py:vnm_compact_ref (ties included; column norms are
summed in a different order, so only norms equal to within rounding can pick differently).
"""

import torch
import triton
import triton.language as tl

from sparse_compile.kernels.activation_mask import _check

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@triton.jit
def _vnm_select_kernel(
    z_ptr, b_ptr, hc_ptr, rc_ptr, ids_ptr,
    T, F, stride_z, stride_c, stride_ids,
    V: tl.constexpr, N: tl.constexpr, M: tl.constexpr,
    V_P: tl.constexpr, M_P: tl.constexpr, BLOCK_G: tl.constexpr, HAS_BIAS: tl.constexpr,
):  # fmt: skip
    tb = tl.program_id(0)  # token block
    g0 = tl.program_id(1) * BLOCK_G  # first M-group of this program
    rows = tb * V + tl.arange(0, V_P)  # [V_P]
    grp = g0 + tl.arange(0, BLOCK_G)  # [BLOCK_G]
    j = tl.arange(0, M_P)  # [M_P]
    row_ok = tl.arange(0, V_P) < V
    col_ok = (grp[:, None] < F // M) & (j[None, :] < M)  # [BLOCK_G, M_P]
    cols = grp[:, None] * M + j[None, :]  # absolute hidden column [BLOCK_G, M_P]
    ok = row_ok[:, None, None] & col_ok[None, :, :]
    z = tl.load(z_ptr + rows[:, None, None] * stride_z + cols[None, :, :], mask=ok, other=0.0)
    dtype = z.dtype
    zf = z.to(tl.float32)
    if HAS_BIAS:
        zf = zf + tl.load(b_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :, :]
    r = tl.maximum(zf.to(dtype).to(tl.float32), 0.0)  # relu(z + b), rounded to z's dtype
    h = tl.where(ok, (r * r).to(dtype).to(tl.float32), 0.0)  # H = R^2 rounded; padding adds 0 to norms

    # 4 columns of largest norm per group; a column is "behind" each larger or equal-and-left one.
    norms = tl.where(col_ok, tl.sum(h, axis=0), float("-inf"))  # [BLOCK_G, M_P]
    a = norms[:, :, None]
    b = norms[:, None, :]
    left = j[None, None, :] < j[None, :, None]  # [1, M_P(this), M_P(other)]: other is left of this
    rank = tl.sum(((b > a) | ((b == a) & left)).to(tl.int32), axis=2)
    chosen = (rank < 4) & col_ok  # [BLOCK_G, M_P]
    pos = tl.sum((chosen[:, None, :] & left).to(tl.int32), axis=2)  # place among the group's 4

    if N == 4:
        keep = chosen[None, :, :] & row_ok[:, None, None]
    else:
        vals = tl.where(chosen[None, :, :], h, float("-inf"))
        keep = tl.zeros([V_P, BLOCK_G, M_P], dtype=tl.int1)
        for _ in tl.static_range(N):
            best = tl.argmax(vals, axis=2, tie_break_left=True)  # [V_P, BLOCK_G]
            hit = j[None, None, :] == best[:, :, None]
            keep = keep | hit
            vals = tl.where(hit, float("-inf"), vals)
        keep = keep & chosen[None, :, :]

    out = grp[None, :, None] * 4 + pos[None, :, :]  # compact column [1, BLOCK_G, M_P]
    where = chosen[None, :, :] & row_ok[:, None, None]
    dst = rows[:, None, None] * stride_c + out
    tl.store(hc_ptr + dst, tl.where(keep, h, 0.0).to(dtype), mask=where)
    tl.store(rc_ptr + dst, tl.where(keep, r, 0.0).to(dtype), mask=where)
    tl.store(ids_ptr + tb * stride_ids + grp[:, None] * 4 + pos, cols.to(tl.int32), mask=chosen)


def vnm_select_compact(
    z: torch.Tensor, bias: torch.Tensor | None, v: int, n: int, m: int, block_g: int | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Triton version of ``vnm_compact_ref(z, bias, v, n, m)``: (h_c, r_c, ids), same shapes and dtypes."""
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
    v_p, m_p = triton.next_power_of_2(v), triton.next_power_of_2(m)
    if block_g is None:  # about 4K elements of Z per program
        block_g = max(1, min(triton.next_power_of_2(f // m), 4096 // (v_p * m_p)))
    grid = (t // v, triton.cdiv(f // m, block_g))
    _vnm_select_kernel[grid](
        z, bias if bias is not None else z, h_c, r_c, ids,
        t, f, z.stride(0), h_c.stride(0), ids.stride(0),
        V=v, N=n, M=m, V_P=v_p, M_P=m_p, BLOCK_G=block_g, HAS_BIAS=bias is not None,
    )  # fmt: skip
    return h_c, r_c, ids
