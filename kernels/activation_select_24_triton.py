"""2:4 activations along the hidden dim, compressed, in Triton (reference: activation_24_ref below).

From Z [T, h] (and optional bias): H = relu(Z + b)^2 (rounded to Z's dtype, as the reference
does), per row and group of 4 hidden units keep the 2 largest (ties to the lower index: the
V:N:M rule with V=1, N=2, M=4), and write
  values [T, h/2]   the 2 kept H values of each group, in column order
  meta   [T, h/4]   uint8 per group: first kept index | second kept index << 2 (0 <= i < j <= 3)
  masked [T, h]     H~ = H * A, when asked (a consumer that wants the dense form)
Bytes: read T*h, write T*h/2 values + T*h/4 meta (+ T*h): one pass, each program a [ROWS, 4*G]
tile loaded and stored as contiguous row segments (the group's 4 positions separated by splits).
"""

import torch
import triton
import triton.language as tl

from sparse_compile.kernels.activation_mask import vnm_select

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def activation_24_ref(z: torch.Tensor, bias: torch.Tensor | None = None, masked: bool = False):
    """(values [T, h/2], meta uint8 [T, h/4], masked H~ [T, h] or None), pure torch."""
    r = torch.relu(z if bias is None else z + bias)
    h = r * r
    t, f = h.shape
    _, keep = vnm_select(h, 1, 2, 4)  # [T, h/4, 4] bool, 2 per group
    pos = torch.arange(4, device=z.device).expand_as(keep)
    idx = torch.where(keep, pos, 4).sort(dim=-1).values[..., :2]  # the two kept positions, ascending
    groups = h.reshape(t, f // 4, 4)
    values = groups.gather(2, idx).reshape(t, f // 2)
    meta = (idx[..., 0] | (idx[..., 1] << 2)).to(torch.uint8)
    return values, meta, (h * keep.reshape(t, f)) if masked else None


@triton.jit
def _act24_kernel(
    z_ptr, b_ptr, val_ptr, meta_ptr, mask_out_ptr, T, G, stride_z, stride_v, stride_m, stride_o,
    ROWS: tl.constexpr, BLOCK_G: tl.constexpr, HAS_BIAS: tl.constexpr, MASKED: tl.constexpr,
):  # fmt: skip
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.program_id(1) * 4 * BLOCK_G + tl.arange(0, 4 * BLOCK_G)  # contiguous: vector loads
    ok = (rows < T)[:, None] & (cols < 4 * G)[None, :]
    dtype = z_ptr.dtype.element_ty
    z = tl.load(z_ptr + rows[:, None].to(tl.int64) * stride_z + cols[None, :], mask=ok, other=0.0).to(tl.float32)
    if HAS_BIAS:
        z = z + tl.load(b_ptr + cols, mask=cols < 4 * G, other=0.0).to(tl.float32)[None, :]
    r = tl.maximum(z.to(dtype).to(tl.float32), 0.0)
    h = (r * r).to(dtype).to(tl.float32)
    # [ROWS, 4 G] -> the 4 positions of each group as [ROWS, G] tensors: index 2a + b of [.., a, b]
    h_even, h_odd = tl.split(tl.reshape(h, (ROWS, BLOCK_G, 2, 2)))  # b = 0: positions 0, 2; b = 1: 1, 3
    h0, h2 = tl.split(h_even)
    h1, h3 = tl.split(h_odd)
    # rank = #larger + #equal at a lower index; keep rank < 2
    k0 = ((h1 > h0).to(tl.int32) + (h2 > h0).to(tl.int32) + (h3 > h0).to(tl.int32)) < 2
    k1 = ((h0 >= h1).to(tl.int32) + (h2 > h1).to(tl.int32) + (h3 > h1).to(tl.int32)) < 2
    k2 = ((h0 >= h2).to(tl.int32) + (h1 >= h2).to(tl.int32) + (h3 > h2).to(tl.int32)) < 2
    # first kept index and second kept index
    i0 = tl.where(k0, 0, tl.where(k1, 1, 2))
    i1 = tl.where(k0 & k1, 1, tl.where((k0 | k1) & k2, 2, 3))
    v0 = tl.where(i0 == 0, h0, tl.where(i0 == 1, h1, h2))
    v1 = tl.where(i1 == 1, h1, tl.where(i1 == 2, h2, h3))
    vals = tl.reshape(tl.join(v0, v1), (ROWS, 2 * BLOCK_G))  # v0 v1 of group 0, then group 1, ...
    cols2 = tl.program_id(1) * 2 * BLOCK_G + tl.arange(0, 2 * BLOCK_G)
    ok2 = (rows < T)[:, None] & (cols2 < 2 * G)[None, :]
    tl.store(val_ptr + rows[:, None].to(tl.int64) * stride_v + cols2[None, :], vals.to(dtype), mask=ok2)
    grp = tl.program_id(1) * BLOCK_G + tl.arange(0, BLOCK_G)
    okg = (rows < T)[:, None] & (grp < G)[None, :]
    meta = (i0 | (i1 << 2)).to(tl.uint8)
    tl.store(meta_ptr + rows[:, None].to(tl.int64) * stride_m + grp[None, :], meta, mask=okg)
    if MASKED:
        k3 = (k0.to(tl.int32) + k1.to(tl.int32) + k2.to(tl.int32)) == 1  # exactly 2 of the 4 are kept
        m_even = tl.join(tl.where(k0, h0, 0.0), tl.where(k2, h2, 0.0))
        m_odd = tl.join(tl.where(k1, h1, 0.0), tl.where(k3, h3, 0.0))
        hm = tl.reshape(tl.join(m_even, m_odd), (ROWS, 4 * BLOCK_G))
        tl.store(mask_out_ptr + rows[:, None].to(tl.int64) * stride_o + cols[None, :], hm.to(dtype), mask=ok)


def activation_24(z: torch.Tensor, bias: torch.Tensor | None = None, masked: bool = False):
    """Triton version of ``activation_24_ref``: same outputs, bit for bit."""
    if not isinstance(z, torch.Tensor) or z.dtype not in _DTYPES or z.dim() != 2:
        raise ValueError(f"activation_24: expected a 2-D z of {_DTYPES}; got {getattr(z, 'dtype', type(z))}")
    t, f = z.shape
    if f % 4:
        raise ValueError(f"activation_24: hidden size {f} is not a multiple of 4")
    if not z.is_contiguous():
        raise ValueError("activation_24: z must be contiguous (row-major [T, h])")
    if bias is not None and (bias.shape != (f,) or bias.dtype != z.dtype or not bias.is_contiguous()):
        raise ValueError(f"activation_24: bias must be contiguous [{f}] of {z.dtype}; got {tuple(bias.shape)}")
    values = torch.empty(t, f // 2, device=z.device, dtype=z.dtype)
    meta = torch.empty(t, f // 4, device=z.device, dtype=torch.uint8)
    out = torch.empty_like(z) if masked else values
    g = f // 4
    rows, block_g = 16, min(64, triton.next_power_of_2(g))
    grid = (triton.cdiv(t, rows), triton.cdiv(g, block_g))
    _act24_kernel[grid](
        z, bias if bias is not None else z, values, meta, out, t, g,
        z.stride(0), values.stride(0), meta.stride(0), out.stride(0),
        ROWS=rows, BLOCK_G=block_g, HAS_BIAS=bias is not None, MASKED=masked,
    )  # fmt: skip
    return values, meta, out if masked else None
