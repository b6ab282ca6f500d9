"""Squared ReLU with 2:4 activations straight into cuSPARSELt's sm90 operand, and its backward, in Triton.

Forward, from Z [T, h] (F1's output, bias included): R = relu(Z), H = R^2 (rounded to Z's dtype),
A = the 2:4 mask of H along h (2 largest of each group of 4, ties to the lower index: the rule of
activation_select_24_triton.py), R~ = R * A, H~ = H * A. One pass writes
  h_buf  the sm90 buffer of H~ [T, h/2 + h/16] (cslt_compress_triton.py's layout): F2's sparse operand
  r_buf  the sm90 buffer of R~: all backward keeps (0.56 T h elements, not T h)
The positions a group stores are cuSPARSELt's for that tensor's nonzero set (cslt_compress_triton._KEPT),
so h_buf = cslt_compress_ref(H~) and r_buf = cslt_compress_ref(R~) bit for bit. (Their metadata differ
where a kept r > 0 squares to 0 in the dtype: z = 3e-5 in fp16.)
Backward, from dH = dY W2 [T, h] and r_buf: dZ~ = dH * 2 R~ (one rounding, as the reference), written
  dz_buf  r_buf's metadata with dZ~'s values at its positions: B3's sparse operand
  dz      dZ~ dense [T, h], and h = H~ = R~^2 dense [T, h]: the exact weight gradients' operands
Bytes (elements of T h): forward reads 1, writes 1.125; backward reads 1.56, writes 2.56.
Shapes: T and h multiples of 64 (the layout's tiles; cuSPARSELt pads others in ways not probed).
"""

import torch
import triton
import triton.language as tl

from sparse_compile.kernels.activation_mask import vnm_mask
from sparse_compile.kernels.cslt_compress_triton import (
    _band,
    _check,
    _from_words,
    _kept_code,
    _pick2,
    _split4,
    _to_words,
    _word_slots,
    cslt_compress_ref,
    meta_slots,
)

# (tiles of 32 columns per program, warps): the fastest of a sweep of TILES 2-16 x warps 2-8 at
# T = h = 16384 (bench/cslt_mm.py times these kernels)
FWD_TILES, FWD_WARPS = 8, 8
BWD_TILES, BWD_WARPS = 4, 8


def sqrelu_24_compress_ref(z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(h_buf, r_buf) of the forward above, pure torch: cuSPARSELt's buffers of H~ and R~."""
    r = torch.relu(z)
    h = r * r
    keep = vnm_mask(h, 1, 2, 4)
    return cslt_compress_ref(h * keep), cslt_compress_ref(r * keep)


def cslt_decompress_ref(buf: torch.Tensor, m: int, k: int) -> torch.Tensor:
    """The dense [m, k] matrix an sm90 buffer holds: each group's two values at its code's positions."""
    values = buf.reshape(-1)[: m * k // 2].reshape(m, k // 4, 2)
    dense = torch.zeros(m, k // 4, 4, dtype=buf.dtype, device=buf.device)
    dense.scatter_(2, _codes(buf, m, k), values)
    return dense.reshape(m, k)


def sqrelu_24_backward_ref(dh: torch.Tensor, r_buf: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dz_buf, dz, h) of the backward above, pure torch."""
    m, k = dh.shape
    r = cslt_decompress_ref(r_buf, m, k)
    dz = (dh.float() * (2.0 * r.float())).to(dh.dtype)
    dz_buf = r_buf.clone()
    values = dz.reshape(m, k // 4, 4).gather(2, _codes(r_buf, m, k))
    dz_buf.view(-1)[: m * k // 2] = values.reshape(-1)
    return dz_buf, dz, r * r


def _codes(buf: torch.Tensor, m: int, k: int) -> torch.Tensor:
    """[m, k/4, 2] int64: the two stored positions of every group."""
    words = buf.reshape(-1)[m * k // 2 :].view(torch.int16).long() & 0xFFFF
    slot = meta_slots(m, k, buf.device)
    code = (words[slot // 4] >> (4 * (slot % 4))) & 15
    return torch.stack([code & 3, code >> 2], -1)


@triton.jit
def _fwd_kernel(z_ptr, h_ptr, r_ptr, hmeta_ptr, rmeta_ptr, K, TILES: tl.constexpr, DENSE_H: tl.constexpr):
    """One program: rows [64 b, +64) x TILES tiles of 32 columns, as whole row pieces (cslt_compress_triton).
    DENSE_H: H~ written dense [T, h] to h_ptr (for F2 on cuBLAS) instead of as a buffer."""
    band = tl.program_id(0)
    tile0 = tl.program_id(1) * TILES
    dtype = z_ptr.dtype.element_ty
    rows, cols, vcols = _band(band, tile0, K, TILES)
    z = tl.load(z_ptr + rows[:, None].to(tl.int64) * K + cols[None, :], mask=(cols < K)[None, :], other=0.0)
    r = tl.maximum(z.to(tl.float32), 0.0)
    h = (r * r).to(dtype).to(tl.float32)
    h0, h1, h2, h3 = _split4(h)
    r0, r1, r2, r3 = _split4(r)
    # rank = #larger + #equal at a lower index; keep rank < 2; nonzero set of R~
    k0 = ((h1 > h0).to(tl.int32) + (h2 > h0).to(tl.int32) + (h3 > h0).to(tl.int32)) < 2
    k1 = ((h0 >= h1).to(tl.int32) + (h2 > h1).to(tl.int32) + (h3 > h1).to(tl.int32)) < 2
    k2 = ((h0 >= h2).to(tl.int32) + (h1 >= h2).to(tl.int32) + (h3 > h2).to(tl.int32)) < 2
    k3 = (k0.to(tl.int32) + k1.to(tl.int32) + k2.to(tl.int32)) == 1
    h0, h1, h2, h3 = tl.where(k0, h0, 0.0), tl.where(k1, h1, 0.0), tl.where(k2, h2, 0.0), tl.where(k3, h3, 0.0)
    r0, r1, r2, r3 = tl.where(k0, r0, 0.0), tl.where(k1, r1, 0.0), tl.where(k2, r2, 0.0), tl.where(k3, r3, 0.0)
    # stored positions: the nonzeros of H~ (of R~), padded by cuSPARSELt's rule
    rcode = _kept_code(r0, r1, r2, r3)
    voff = rows[:, None].to(tl.int64) * (K // 2) + vcols[None, :]
    vok = (vcols < K // 2)[None, :]
    tl.store(r_ptr + voff, _pick2(r0, r1, r2, r3, rcode).to(dtype), mask=vok)
    slots, wok = _word_slots(band, tile0, K, TILES)
    tl.store(rmeta_ptr + slots, _to_words(rcode, TILES), mask=wok)
    if DENSE_H:
        h = tl.reshape(tl.join(tl.join(h0, h2), tl.join(h1, h3)), (64, TILES * 32))  # index 2a + b of [.., a, b]
        off = rows[:, None].to(tl.int64) * K + cols[None, :]
        tl.store(h_ptr + off, h.to(dtype), mask=(cols < K)[None, :])
    else:
        hcode = _kept_code(h0, h1, h2, h3)
        tl.store(h_ptr + voff, _pick2(h0, h1, h2, h3, hcode).to(dtype), mask=vok)
        tl.store(hmeta_ptr + slots, _to_words(hcode, TILES), mask=wok)


@triton.jit
def _at(code, x0, x1, p: tl.constexpr):
    """Dense position p of a group whose stored values x0, x1 sit at code's positions (else 0)."""
    return tl.where((code & 3) == p, x0, tl.where((code >> 2) == p, x1, 0.0))


@triton.jit
def _bwd_kernel(dh_ptr, r_ptr, rmeta_ptr, dzb_ptr, dzmeta_ptr, dz_ptr, h_ptr, K, TILES: tl.constexpr):
    band = tl.program_id(0)
    tile0 = tl.program_id(1) * TILES
    dtype = dh_ptr.dtype.element_ty
    slots, wok = _word_slots(band, tile0, K, TILES)
    words = tl.load(rmeta_ptr + slots, mask=wok, other=0)
    tl.store(dzmeta_ptr + slots, words, mask=wok)
    code = _from_words(words, TILES)  # [64, TILES * 8]
    rows, cols, vcols = _band(band, tile0, K, TILES)
    off = rows[:, None].to(tl.int64) * K + cols[None, :]
    ok = (cols < K)[None, :]
    voff = rows[:, None].to(tl.int64) * (K // 2) + vcols[None, :]
    vok = (vcols < K // 2)[None, :]
    d0, d1, d2, d3 = _split4(tl.load(dh_ptr + off, mask=ok, other=0.0))
    rv0, rv1 = tl.split(tl.reshape(tl.load(r_ptr + voff, mask=vok, other=0.0), (64, TILES * 8, 2)))
    dv0, dv1 = tl.split(tl.reshape(_pick2(d0, d1, d2, d3, code), (64, TILES * 8, 2)))
    dz0 = (dv0.to(tl.float32) * (2.0 * rv0.to(tl.float32))).to(dtype)
    dz1 = (dv1.to(tl.float32) * (2.0 * rv1.to(tl.float32))).to(dtype)
    tl.store(dzb_ptr + voff, tl.reshape(tl.join(dz0, dz1), (64, TILES * 16)), mask=vok)
    h0 = (rv0.to(tl.float32) * rv0.to(tl.float32)).to(dtype)
    h1 = (rv1.to(tl.float32) * rv1.to(tl.float32)).to(dtype)
    dz_even = tl.join(_at(code, dz0, dz1, 0), _at(code, dz0, dz1, 2))
    dz_odd = tl.join(_at(code, dz0, dz1, 1), _at(code, dz0, dz1, 3))
    tl.store(dz_ptr + off, tl.reshape(tl.join(dz_even, dz_odd), (64, TILES * 32)).to(dtype), mask=ok)
    h_even = tl.join(_at(code, h0, h1, 0), _at(code, h0, h1, 2))
    h_odd = tl.join(_at(code, h0, h1, 1), _at(code, h0, h1, 3))
    tl.store(h_ptr + off, tl.reshape(tl.join(h_even, h_odd), (64, TILES * 32)).to(dtype), mask=ok)


def _grid(m: int, k: int, tiles: int) -> tuple[int, int]:
    return m // 64, triton.cdiv(k // 32, tiles)


def _buffer(m: int, k: int, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """An sm90 buffer for [m, k] and its metadata words (int16 view of the tail)."""
    buf = torch.empty(m, k // 2 + k // 16, dtype=like.dtype, device=like.device)
    return buf, buf.view(-1).view(torch.int16)[m * k // 2 :]


def sqrelu_24_compress(
    z: torch.Tensor, tiles: int = FWD_TILES, num_warps: int = FWD_WARPS, dense_h: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton version of ``sqrelu_24_compress_ref``: (h_buf, r_buf), one pass over Z. ``dense_h``: H~
    dense [T, h] in place of h_buf (what F2 on cuBLAS reads; bit-identical to
    ``activation_24(z, masked=True)[2]``), r_buf unchanged."""
    m, k = _check(z)
    h_out, h_meta = (torch.empty_like(z), z) if dense_h else _buffer(m, k, z)
    r_buf, r_meta = _buffer(m, k, z)
    _fwd_kernel[_grid(m, k, tiles)](
        z, h_out, r_buf, h_meta, r_meta, k, TILES=tiles, DENSE_H=dense_h, num_warps=num_warps
    )
    return h_out, r_buf


def sqrelu_24_backward(
    dh: torch.Tensor, r_buf: torch.Tensor, tiles: int = BWD_TILES, num_warps: int = BWD_WARPS
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Triton version of ``sqrelu_24_backward_ref``: (dz_buf, dz, h), one pass over dH."""
    m, k = _check(dh)
    if r_buf.shape != (m, k // 2 + k // 16) or r_buf.dtype != dh.dtype or not r_buf.is_contiguous():
        raise ValueError(
            f"sqrelu_24_backward: r_buf {tuple(r_buf.shape)} {r_buf.dtype}; expected a contiguous "
            f"({m}, {k // 2 + k // 16}) {dh.dtype} buffer (sqrelu_24_compress of a [{m}, {k}] Z)"
        )
    dz_buf, dz_meta = _buffer(m, k, dh)
    dz, h = torch.empty_like(dh), torch.empty_like(dh)
    r_meta = r_buf.view(-1).view(torch.int16)[m * k // 2 :]
    _bwd_kernel[_grid(m, k, tiles)](dh, r_buf, r_meta, dz_buf, dz_meta, dz, h, k, TILES=tiles, num_warps=num_warps)
    return dz_buf, dz, h
