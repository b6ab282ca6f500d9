"""cuSPARSELt's compressed 2:4 operand for sm90 (Hopper), written by Triton (reference: cslt_compress_ref).

torch._cslt_compress(A) takes several times as long as the GEMM it feeds; this kernel writes the
same buffer, bit for bit, in one pass (read A, write half of it plus metadata). The layout is
undocumented; bench/cslt_probe.py read it off _cslt_compress on an H200 and an H100 (torch 2.11,
cuSPARSELt 0.8.0), and tests/data/cslt_sm90_probe_{h200,h100}.npz keep real outputs that the CPU
tests compare against. For A [m, k] bf16/fp16, 2:4 along k (the GEMM's K), m % 64 == 0 and
k % 64 == 0, the buffer has A's dtype, shape [m, k/2 + k/16] (m*k/2 + m*k/16 elements), and holds
  values    flat [0, m*k/2): the kept values as a row-major [m, k/2], a group's two in column order
  metadata  the rest, read as int16 words: one 4-bit code per group of 4, code = i0 | i1 << 2 for
            the kept positions i0 < i1 of the group, at nibble slot s (bits 4*(s%4).. of word s//4)
            of group (r, c) (c = group index along k): tiles of 64 rows x 8 groups in row-major
            tile order, 512 slots each, and within a tile the slot's bits are, lowest first,
            r3 c2 c0 c1 r0 r1 r2 r4 r5 (r, c bits within the tile).
Which two positions a group keeps is a function of its nonzero set alone (_KEPT below, probed for
all 16 sets): its nonzeros, and a group with fewer than two (a kept zero: common in relu^2
activations, rare in weights) pads with the highest free positions. Bit-identical for any 2:4
input (at most 2 nonzeros per group). A group with 3 or 4 nonzeros is not 2:4: cuSPARSELt then
stores the code of the table but values that are not the group's kept ones (probed); this kernel
stores the table's positions, so the two differ there.
Other shapes are padded by cuSPARSELt in ways not probed: they are rejected here. Other GPU
generations use other layouts: cslt_compress calls torch._cslt_compress there.
"""

import torch
import triton
import triton.language as tl

_DTYPES = (torch.float16, torch.bfloat16)

# nonzero set (bit p = position p nonzero) -> the kept positions (i0, i1) cuSPARSELt stores: the
# nonzeros, padded with the highest free positions (-0.0 counts as zero; its bits are kept)
_KEPT: tuple[tuple[int, int], ...] = (
    (2, 3), (0, 3), (1, 3), (0, 1), (2, 3), (0, 2), (1, 2), (0, 1),
    (2, 3), (0, 3), (1, 3), (0, 1), (2, 3), (0, 2), (1, 2), (0, 1),
)  # fmt: skip


def random_24(rows: int, cols: int, generator: torch.Generator, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """[rows, cols] normal values on the generator's device, 2 of every 4 along cols kept at random
    positions (the others 0.0 or -0.0): input for tests and measurements of 2:4 operands."""
    dev = generator.device
    keep = torch.rand(rows, cols // 4, 4, device=dev, generator=generator).argsort(-1).argsort(-1) < 2
    return (torch.randn(rows, cols // 4, 4, device=dev, generator=generator) * keep).reshape(rows, cols).to(dtype)


def _check(a: torch.Tensor) -> tuple[int, int]:
    if a.dim() != 2:
        raise ValueError(f"cuSPARSELt compress takes a 2-D tensor, got shape {tuple(a.shape)}")
    if a.dtype not in _DTYPES:
        raise ValueError(f"cuSPARSELt compress: dtype {a.dtype} not supported; allowed: {_DTYPES}")
    if not a.is_contiguous():
        raise ValueError(f"cuSPARSELt compress needs a contiguous (row-major) tensor, got strides {a.stride()}")
    m, k = a.shape
    if m % 64 or k % 64:
        raise ValueError(f"cuSPARSELt sm90 layout: shape ({m}, {k}) must have rows and columns multiples of 64")
    return m, k


def meta_slots(m: int, k: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """[m, k/4] int64: the metadata nibble slot of each group (r, c), the bit permutation above."""
    r = torch.arange(m, device=device)[:, None]
    c = torch.arange(k // 4, device=device)[None, :]
    bit = lambda v, i: (v >> i) & 1  # noqa: E731
    within = (
        bit(r, 3) | bit(c, 2) << 1 | bit(c, 0) << 2 | bit(c, 1) << 3
        | bit(r, 0) << 4 | bit(r, 1) << 5 | bit(r, 2) << 6 | bit(r, 4) << 7 | bit(r, 5) << 8
    )  # fmt: skip
    return ((r >> 6) * (k // 32) + (c >> 3)) * 512 + within


def cslt_compress_ref(a: torch.Tensor) -> torch.Tensor:
    """The sm90 buffer of A, pure torch (any device)."""
    m, k = _check(a)
    groups = a.reshape(m, k // 4, 4)
    nonzero = ((groups != 0).long() << torch.arange(4, device=a.device)).sum(-1)  # [m, k/4] in 0..15
    kept = torch.tensor(_KEPT, device=a.device)[nonzero]  # [m, k/4, 2]
    values = groups.gather(2, kept).reshape(-1)
    code = kept[..., 0] | kept[..., 1] << 2
    nibbles = torch.zeros(m * k // 4, dtype=torch.int64, device=a.device)
    nibbles[meta_slots(m, k, a.device).reshape(-1)] = code.reshape(-1)
    words = (nibbles.reshape(-1, 4) << torch.tensor([0, 4, 8, 12], device=a.device)).sum(-1)
    words = torch.where(words >= 1 << 15, words - (1 << 16), words).to(torch.int16)
    return torch.cat([values.view(torch.int16), words]).view(a.dtype).reshape(m, k // 2 + k // 16)


# _KEPT as one 64-bit constant, nibble s = the code (i0 | i1 << 2) of nonzero set s: a register shift
# instead of a gathered table load, whose layout conversions were most of the kernels' barriers
_KEPT64 = tl.constexpr(sum((i0 | i1 << 2) << (4 * s) for s, (i0, i1) in enumerate(_KEPT)))


@triton.jit
def _band(band, tile0, K, TILES: tl.constexpr):
    """A program's whole rows: rows [64] of band ``band``, columns [TILES * 32] of A from tile ``tile0``,
    and their kept-value columns [TILES * 16] of the [m, k/2] values."""
    rows = band * 64 + tl.arange(0, 64)
    cols = tile0 * 32 + tl.arange(0, TILES * 32)
    vcols = tile0 * 16 + tl.arange(0, TILES * 16)
    return rows, cols, vcols


@triton.jit
def _split4(x):
    """[R, C] -> the 4 positions of its groups of 4 columns, 4 x [R, C/4]."""
    x02, x13 = tl.split(tl.reshape(x, (x.shape[0], x.shape[1] // 4, 2, 2)))  # index 2a + b of [.., a, b]
    x0, x2 = tl.split(x02)
    x1, x3 = tl.split(x13)
    return x0, x1, x2, x3


@triton.jit
def _pick2(x0, x1, x2, x3, code):
    """The values at the code's positions i0 = code & 3 < i1 = code >> 2, as [R, 2 G] (G groups)."""
    i0 = code & 3
    i1 = code >> 2
    v0 = tl.where(i0 == 0, x0, tl.where(i0 == 1, x1, x2))
    v1 = tl.where(i1 == 1, x1, tl.where(i1 == 2, x2, x3))
    return tl.reshape(tl.join(v0, v1), (x0.shape[0], x0.shape[1] * 2))


@triton.jit
def _kept_code(x0, x1, x2, x3):
    """The code cuSPARSELt stores for each group: _KEPT of its nonzero set (-0.0 counts as zero)."""
    nz = (x0 != 0).to(tl.int32) | (x1 != 0).to(tl.int32) << 1 | (x2 != 0).to(tl.int32) << 2
    nz = nz | (x3 != 0).to(tl.int32) << 3
    return ((tl.full(nz.shape, _KEPT64, tl.int64) >> (nz.to(tl.int64) * 4)) & 15).to(tl.int32)


@triton.jit
def _word_slots(band, tile0, K, TILES: tl.constexpr):
    """A program's metadata: int16 word offsets [TILES, 128] (tile, then 128 contiguous words), and
    which tiles exist."""
    t = tl.arange(0, TILES)
    tiles_k = K // 32
    slots = (band * tiles_k + tile0 + t)[:, None].to(tl.int64) * 128 + tl.arange(0, 128)[None, :]
    return slots, ((tile0 + t) < tiles_k)[:, None]


@triton.jit
def _to_words(code, TILES: tl.constexpr):
    """codes [64 rows, TILES * 8 groups] -> int16 words [TILES, 128]: row a*16 + r3*8 + b and group
    t*8 + c2*4 + g set nibble 4 r3 + 8 c2 of word i*4 + g of tile t, i = a*8 + b (module docstring)."""
    two = tl.arange(0, 2)
    shift = (4 * two)[None, :, None, None, None, None] + (8 * two)[None, None, None, None, :, None]
    w = tl.reshape(code, (4, 2, 8, TILES, 2, 4)) << shift
    w = tl.sum(tl.sum(w, axis=4), axis=1)  # [4, 8, TILES, 4]; the nibbles are disjoint, so sum = or
    w = tl.reshape(tl.permute(w, (2, 0, 1, 3)), (TILES, 128))
    return tl.where(w >= 32768, w - 65536, w).to(tl.int16)


@triton.jit
def _from_words(words, TILES: tl.constexpr):
    """int16 words [TILES, 128] -> codes [64 rows, TILES * 8 groups] (the inverse of _to_words)."""
    w = tl.permute(tl.reshape(words.to(tl.int32) & 0xFFFF, (TILES, 4, 8, 4)), (1, 2, 0, 3))  # [4, 8, TILES, 4]
    two = tl.arange(0, 2)
    shift = (4 * two)[None, :, None, None, None, None] + (8 * two)[None, None, None, None, :, None]
    code = (w[:, None, :, :, None, :] >> shift) & 15  # [4, 2, 8, TILES, 2, 4]
    return tl.reshape(code, (64, TILES * 8))


@triton.jit
def _cslt_kernel(a_ptr, out_ptr, meta_ptr, K, TILES: tl.constexpr):
    """One program: rows [64 b, 64 b + 64) x TILES tiles of 32 columns, loaded as whole row pieces
    (TILES * 64 contiguous bytes); writes contiguous value rows and TILES whole metadata tiles."""
    band = tl.program_id(0)
    tile0 = tl.program_id(1) * TILES
    rows, cols, vcols = _band(band, tile0, K, TILES)
    x = tl.load(a_ptr + rows[:, None].to(tl.int64) * K + cols[None, :], mask=(cols < K)[None, :], other=0.0)
    x0, x1, x2, x3 = _split4(x)
    code = _kept_code(x0, x1, x2, x3)
    vok = (vcols < K // 2)[None, :]
    tl.store(out_ptr + rows[:, None].to(tl.int64) * (K // 2) + vcols[None, :], _pick2(x0, x1, x2, x3, code), mask=vok)
    slots, wok = _word_slots(band, tile0, K, TILES)
    tl.store(meta_ptr + slots, _to_words(code, TILES), mask=wok)


# 8 tiles (64 x 256 per program), 8 warps: the fastest of 2-8 tiles x 4-8 warps (bench/cslt_mm.py)
TILES = 8
NUM_WARPS = 8


def cslt_compress_triton(a: torch.Tensor, tiles: int = TILES, num_warps: int = NUM_WARPS) -> torch.Tensor:
    """The sm90 buffer of A (what torch._cslt_compress writes on Hopper), one Triton pass."""
    m, k = _check(a)
    out = torch.empty(m, k // 2 + k // 16, dtype=a.dtype, device=a.device)
    meta = out.view(-1).view(torch.int16)[m * k // 2 :]
    grid = (m // 64, triton.cdiv(k // 32, tiles))
    _cslt_kernel[grid](a, out, meta, k, TILES=tiles, num_warps=num_warps)
    return out


def cslt_compress(a: torch.Tensor) -> torch.Tensor:
    """Compress a 2:4 tensor for torch._cslt_sparse_mm: the Triton kernel on sm90 GPUs (bit-identical
    to torch._cslt_compress there), torch._cslt_compress on other GPUs, whose layouts differ."""
    if a.is_cuda and torch.cuda.get_device_capability(a.device)[0] != 9:
        return torch._cslt_compress(a)
    return cslt_compress_triton(a)
