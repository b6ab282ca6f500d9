"""Variants of the fused 2:4 -> cuSPARSELt forward kernel and the compressor (kernels/act24_cslt_triton.py,
kernels/cslt_compress_triton.py): the kept-code table as one 64-bit constant instead of a gathered load."""

import triton
import triton.language as tl

from sparse_compile.kernels.cslt_compress_triton import (
    _half_tile,
    _nonzero_set,
    _pick2,
    _split4,
    _to_words16,
    _word_slots,
)

# the 16-entry kept-code table (nonzero set -> i0 | i1 << 2) as one 64-bit constant, nibble s = code of set s
_KEPT = (
    (2, 3),
    (0, 3),
    (1, 3),
    (0, 1),
    (2, 3),
    (0, 2),
    (1, 2),
    (0, 1),
    (2, 3),
    (0, 3),
    (1, 3),
    (0, 1),
    (2, 3),
    (0, 2),
    (1, 2),
    (0, 1),
)
TABLE64 = tl.constexpr(sum((i0 | i1 << 2) << (4 * s) for s, (i0, i1) in enumerate(_KEPT)))


@triton.jit
def _code(nz, TABLE: tl.constexpr):
    table = tl.full(nz.shape, TABLE, tl.int64)
    return ((table >> (nz.to(tl.int64) * 4)) & 15).to(tl.int32)


@triton.jit
def _store_words(meta_ptr, words, band, tile0, K, TILES: tl.constexpr):
    """words [32 (row i), TILES*4 (tile t, group g)] -> int16 word (t, i, g) at tile*128 + i*4 + g, stored per tile
    as contiguous [TILES, 128] rows."""
    w = tl.reshape(tl.permute(tl.reshape(words, (32, TILES, 4)), (1, 0, 2)), (TILES, 128))
    t = tl.arange(0, TILES)
    tiles_k = K // 32
    slots = (band * tiles_k + tile0 + t)[:, None].to(tl.int64) * 128 + tl.arange(0, 128)[None, :]
    tl.store(meta_ptr + slots, _to_words16(w), mask=((tile0 + t) < tiles_k)[:, None])


@triton.jit
def fwdA_kernel(z_ptr, h_ptr, r_ptr, hmeta_ptr, rmeta_ptr, kept_ptr, K, TILES: tl.constexpr, TABLE: tl.constexpr):
    band = tl.program_id(0)
    tile0 = tl.program_id(1) * TILES
    dtype = z_ptr.dtype.element_ty
    hwords = tl.zeros((32, TILES * 4), dtype=tl.int32)
    rwords = tl.zeros((32, TILES * 4), dtype=tl.int32)
    for half in tl.static_range(4):
        rows, cols, vcols, shift = _half_tile(band, tile0, half, TILES)
        z = tl.load(z_ptr + rows[:, None].to(tl.int64) * K + cols[None, :], mask=(cols < K)[None, :], other=0.0)
        r = tl.maximum(z.to(tl.float32), 0.0)
        h = (r * r).to(dtype).to(tl.float32)
        h0, h1, h2, h3 = _split4(h, TILES)
        r0, r1, r2, r3 = _split4(r, TILES)
        k0 = ((h1 > h0).to(tl.int32) + (h2 > h0).to(tl.int32) + (h3 > h0).to(tl.int32)) < 2
        k1 = ((h0 >= h1).to(tl.int32) + (h2 > h1).to(tl.int32) + (h3 > h1).to(tl.int32)) < 2
        k2 = ((h0 >= h2).to(tl.int32) + (h1 >= h2).to(tl.int32) + (h3 > h2).to(tl.int32)) < 2
        k3 = (k0.to(tl.int32) + k1.to(tl.int32) + k2.to(tl.int32)) == 1
        h0, h1, h2, h3 = tl.where(k0, h0, 0.0), tl.where(k1, h1, 0.0), tl.where(k2, h2, 0.0), tl.where(k3, h3, 0.0)
        r0, r1, r2, r3 = tl.where(k0, r0, 0.0), tl.where(k1, r1, 0.0), tl.where(k2, r2, 0.0), tl.where(k3, r3, 0.0)
        if TABLE:
            hcode = _code(_nonzero_set(h0, h1, h2, h3), TABLE64)
            rcode = _code(_nonzero_set(r0, r1, r2, r3), TABLE64)
        else:
            hcode = tl.load(kept_ptr + _nonzero_set(h0, h1, h2, h3))
            rcode = tl.load(kept_ptr + _nonzero_set(r0, r1, r2, r3))
        hv = _pick2(h0, h1, h2, h3, hcode, TILES)
        rv = _pick2(r0, r1, r2, r3, rcode, TILES)
        voff = rows[:, None].to(tl.int64) * (K // 2) + vcols[None, :]
        vok = (vcols < K // 2)[None, :]
        tl.store(h_ptr + voff, hv.to(dtype), mask=vok)
        tl.store(r_ptr + voff, rv.to(dtype), mask=vok)
        hwords = hwords | hcode << shift
        rwords = rwords | rcode << shift
    _store_words(hmeta_ptr, hwords, band, tile0, K, TILES)
    _store_words(rmeta_ptr, rwords, band, tile0, K, TILES)


@triton.jit
def cslt_table_kernel(a_ptr, out_ptr, meta_ptr, kept_ptr, K, TILES: tl.constexpr):
    band = tl.program_id(0)
    tile0 = tl.program_id(1) * TILES
    words = tl.zeros((32, TILES * 4), dtype=tl.int32)
    for half in tl.static_range(4):
        rows, cols, vcols, shift = _half_tile(band, tile0, half, TILES)
        x = tl.load(a_ptr + rows[:, None].to(tl.int64) * K + cols[None, :], mask=(cols < K)[None, :], other=0.0)
        x0, x1, x2, x3 = _split4(x, TILES)
        code = _code(_nonzero_set(x0, x1, x2, x3), TABLE64)
        vals = _pick2(x0, x1, x2, x3, code, TILES)
        vok = (vcols < K // 2)[None, :]
        tl.store(out_ptr + rows[:, None].to(tl.int64) * (K // 2) + vcols[None, :], vals, mask=vok)
        words = words | code << shift
    slots, wok = _word_slots(band, tile0, K, TILES)
    tl.store(meta_ptr + slots, _to_words16(words), mask=wok)


@triton.jit
def fwdB_kernel(z_ptr, h_ptr, r_ptr, hmeta_ptr, rmeta_ptr, kept_ptr, K, TILES: tl.constexpr, TABLE: tl.constexpr):
    band = tl.program_id(0)
    tile0 = tl.program_id(1) * TILES
    dtype = z_ptr.dtype.element_ty
    hwords = tl.zeros((32, TILES * 4), dtype=tl.int32)
    rwords = tl.zeros((32, TILES * 4), dtype=tl.int32)
    for half in tl.static_range(4):
        rows, cols, vcols, shift = _half_tile(band, tile0, half, TILES)
        z = tl.load(z_ptr + rows[:, None].to(tl.int64) * K + cols[None, :], mask=(cols < K)[None, :], other=0.0)
        r = tl.maximum(z.to(tl.float32), 0.0)
        h = (r * r).to(dtype).to(tl.float32)
        h0, h1, h2, h3 = _split4(h, TILES)
        r0, r1, r2, r3 = _split4(r, TILES)
        k0 = ((h1 > h0).to(tl.int32) + (h2 > h0).to(tl.int32) + (h3 > h0).to(tl.int32)) < 2
        k1 = ((h0 >= h1).to(tl.int32) + (h2 > h1).to(tl.int32) + (h3 > h1).to(tl.int32)) < 2
        k2 = ((h0 >= h2).to(tl.int32) + (h1 >= h2).to(tl.int32) + (h3 > h2).to(tl.int32)) < 2
        k3 = (k0.to(tl.int32) + k1.to(tl.int32) + k2.to(tl.int32)) == 1
        h0, h1, h2, h3 = tl.where(k0, h0, 0.0), tl.where(k1, h1, 0.0), tl.where(k2, h2, 0.0), tl.where(k3, h3, 0.0)
        r0, r1, r2, r3 = tl.where(k0, r0, 0.0), tl.where(k1, r1, 0.0), tl.where(k2, r2, 0.0), tl.where(k3, r3, 0.0)
        if TABLE:
            hcode = _code(_nonzero_set(h0, h1, h2, h3), TABLE64)
            rcode = _code(_nonzero_set(r0, r1, r2, r3), TABLE64)
        else:
            hcode = tl.load(kept_ptr + _nonzero_set(h0, h1, h2, h3))
            rcode = tl.load(kept_ptr + _nonzero_set(r0, r1, r2, r3))
        hv = _pick2(h0, h1, h2, h3, hcode, TILES)
        rv = _pick2(r0, r1, r2, r3, rcode, TILES)
        voff = rows[:, None].to(tl.int64) * (K // 2) + vcols[None, :]
        vok = (vcols < K // 2)[None, :]
        tl.store(h_ptr + voff, hv.to(dtype), mask=vok)
        tl.store(r_ptr + voff, rv.to(dtype), mask=vok)
        hwords = hwords | hcode << shift
        rwords = rwords | rcode << shift
    slots, wok = _word_slots(band, tile0, K, TILES)
    tl.store(hmeta_ptr + slots, _to_words16(hwords), mask=wok)
    tl.store(rmeta_ptr + slots, _to_words16(rwords), mask=wok)


@triton.jit
def _split4r(x):
    """[R, C] -> the 4 positions of its groups of 4 columns, 4 x [R, C/4]."""
    x02, x13 = tl.split(tl.reshape(x, (x.shape[0], x.shape[1] // 4, 2, 2)))
    x0, x2 = tl.split(x02)
    x1, x3 = tl.split(x13)
    return x0, x1, x2, x3


@triton.jit
def _pick2r(x0, x1, x2, x3, code):
    """The values at the code's positions i0 = code & 3 < i1 = code >> 2, as [R, 2 G]."""
    i0 = code & 3
    i1 = code >> 2
    v0 = tl.where(i0 == 0, x0, tl.where(i0 == 1, x1, x2))
    v1 = tl.where(i1 == 1, x1, tl.where(i1 == 2, x2, x3))
    return tl.reshape(tl.join(v0, v1), (x0.shape[0], x0.shape[1] * 2))


@triton.jit
def _store_words_rows(meta_ptr, code, band, tile0, K, TILES: tl.constexpr):
    """code [64 rows, TILES * 8 groups] of a band -> its int16 words: row a*16 + r3*8 + b, group
    t*8 + c2*4 + g sets nibble 4 r3 + 8 c2 of word (tile t, i = a*8 + b, g) at slot t*128 + i*4 + g."""
    c6 = tl.reshape(code, (4, 2, 8, TILES, 2, 4))
    two = tl.arange(0, 2)
    shift = (4 * two)[None, :, None, None, None, None] + (8 * two)[None, None, None, None, :, None]
    w = tl.sum(tl.sum(c6 << shift, axis=4), axis=1)  # [4, 8, TILES, 4]: disjoint nibbles, so sum = or
    w = tl.reshape(tl.permute(w, (2, 0, 1, 3)), (TILES, 128))
    t = tl.arange(0, TILES)
    tiles_k = K // 32
    slots = (band * tiles_k + tile0 + t)[:, None].to(tl.int64) * 128 + tl.arange(0, 128)[None, :]
    tl.store(meta_ptr + slots, _to_words16(w), mask=((tile0 + t) < tiles_k)[:, None])


@triton.jit
def cslt_rows_kernel(a_ptr, out_ptr, meta_ptr, kept_ptr, K, TILES: tl.constexpr):
    """Whole rows: one program loads [64 rows, TILES * 32 columns] at once (contiguous 64 TILES-byte row
    pieces) and writes contiguous value rows and whole metadata tiles."""
    band = tl.program_id(0)
    tile0 = tl.program_id(1) * TILES
    C: tl.constexpr = TILES * 32
    rows = band * 64 + tl.arange(0, 64)
    cols = tile0 * 32 + tl.arange(0, C)
    x = tl.load(a_ptr + rows[:, None].to(tl.int64) * K + cols[None, :], mask=(cols < K)[None, :], other=0.0)
    x0, x1, x2, x3 = _split4r(x)
    code = _code(_nonzero_set(x0, x1, x2, x3), TABLE64)
    vals = _pick2r(x0, x1, x2, x3, code)
    vcols = tile0 * 16 + tl.arange(0, C // 2)
    tl.store(out_ptr + rows[:, None].to(tl.int64) * (K // 2) + vcols[None, :], vals, mask=(vcols < K // 2)[None, :])
    _store_words_rows(meta_ptr, code, band, tile0, K, TILES)
