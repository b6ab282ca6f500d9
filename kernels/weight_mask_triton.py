"""Transposable 2:4 weight mask in Triton (reference: kernels/weight_mask.py).

Two kernels, same answer. The default ("pairs", generated into kernels/weight_mask_pairs_triton.py
by kernels/weight_mask_gen.py) scores each tile as sums of row-pair sums: 294 float64 adds per
tile, one tile per lane, W read once in its own dtype.

The first version ("dot", below): one program scores TILES 4x4 tiles of W against all 90 patterns
(padded to 128) as the reference does, |W| tiles [TILES, 16] @ patterns [16, 128] in float64
(tl.dot, fp64 accumulate); 16 x 128 multiply-adds per tile, 8.6 G at 16384x4096; Triton 3.6
needs a float32 copy of 16-bit W for it (see the launch).

Both: for bf16/fp16 weights the float64 sums of 8 values are exact (for realistic weights: the
magnitudes of one tile spanning less than 2^45), so the summation order cannot matter and the
result is the reference's bit for bit (for fp32 weights, exact unless one tile's magnitudes span
more than ~2^26). Best pattern = first maximum in the reference's pattern order (argmax, ties to
the left); then W~ = W * mask is written, and the mask if asked.
"""

import torch
import triton
import triton.language as tl

from sparse_compile.kernels.weight_mask import TRANSPOSABLE_24_PATTERNS
from sparse_compile.kernels.weight_mask_pairs_triton import _transposable_24_pairs_kernel

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_P = 128  # patterns, padded to a power of two
_tables: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}


def _pattern_tables(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(P [16, 128] float64 with the 90 patterns as columns, bits [128, 16] int8 rows)."""
    if device not in _tables:
        bits = torch.zeros(_P, 16, dtype=torch.int8)
        bits[:90] = TRANSPOSABLE_24_PATTERNS.to(torch.int8)
        _tables[device] = (bits.t().to(torch.float64).contiguous().to(device), bits.to(device))
    return _tables[device]


@triton.jit
def _transposable_24_kernel(
    s_ptr, w_ptr, out_ptr, mask_ptr, p_ptr, bits_ptr, TILE_ROWS, TILE_COLS, stride_s, stride_w, stride_o, stride_m,
    TILES: tl.constexpr, P: tl.constexpr, NUM_PATTERNS: tl.constexpr, WRITE_MASK: tl.constexpr,
):  # fmt: skip
    t = tl.program_id(0) * TILES + tl.arange(0, TILES)  # tile index, row-major over the tile grid
    tr = t // TILE_COLS
    tc = t % TILE_COLS
    ok = (tr < TILE_ROWS)[:, None]
    k = tl.arange(0, 16)  # position in the tile, row-major
    s_at = (tr.to(tl.int64) * 4 * stride_s + tc * 4)[:, None] + ((k // 4) * stride_s + (k % 4))[None, :]
    a = tl.abs(tl.load(s_ptr + s_at, mask=ok, other=0.0).to(tl.float64))  # s: W in float32
    p = tl.arange(0, P)
    table = tl.load(p_ptr + k[:, None] * P + p[None, :])  # [16, P] float64 0/1
    scores = tl.dot(a, table)  # [TILES, P], float64 accumulate
    scores = tl.where((p < NUM_PATTERNS)[None, :], scores, -1.0)
    best = tl.argmax(scores, axis=1, tie_break_left=True)  # first maximum, as torch.argmax
    keep = tl.load(bits_ptr + best[:, None] * 16 + k[None, :])  # [TILES, 16] int8
    w_at = (tr.to(tl.int64) * 4 * stride_w + tc * 4)[:, None] + ((k // 4) * stride_w + (k % 4))[None, :]
    w = tl.load(w_ptr + w_at, mask=ok, other=0.0)
    o_at = (tr.to(tl.int64) * 4 * stride_o + tc * 4)[:, None] + ((k // 4) * stride_o + (k % 4))[None, :]
    tl.store(out_ptr + o_at, w * keep.to(w.dtype), mask=ok)
    if WRITE_MASK:
        m_at = (tr.to(tl.int64) * 4 * stride_m + tc * 4)[:, None] + ((k // 4) * stride_m + (k % 4))[None, :]
        tl.store(mask_ptr + m_at, keep, mask=ok)


# pairs kernel (tiles per program, num_warps) by weight element size: the fastest of a sweep
# (bench/weight_mask_kernel.py)
_PAIRS_DEFAULTS = {2: (64, 1), 4: (128, 4)}


def sparsify_24_triton(
    w: torch.Tensor,
    with_mask: bool = False,
    tiles: int | None = None,
    method: str = "pairs",
    num_warps: int | None = None,
):
    """W * M(W) with M the transposable 2:4 mask; with ``with_mask``, (W * M, M as bool).

    ``method``: "pairs" (kernels/weight_mask_pairs_triton.py: row-pair sums, one tile per lane) or
    "dot" (all 90 scores as one float64 tl.dot per TILES tiles, the first version). ``tiles``,
    ``num_warps``: None = the defaults (_PAIRS_DEFAULTS); the answer is the same for every choice."""
    if not isinstance(w, torch.Tensor) or w.dim() != 2 or w.dtype not in _DTYPES:
        raise ValueError(
            f"sparsify_24_triton: expected a 2-D weight of {_DTYPES}; got "
            f"{getattr(w, 'dtype', type(w))} {tuple(getattr(w, 'shape', ()))}"
        )
    if method == "pairs":
        d_tiles, d_warps = _PAIRS_DEFAULTS[2 if w.element_size() == 2 else 4]
        tiles, num_warps = tiles or d_tiles, num_warps or d_warps
    else:
        tiles, num_warps = tiles or 64, num_warps or 4
    rows, cols = w.shape
    if rows % 4 or cols % 4:
        raise ValueError(f"sparsify_24_triton: weight shape {tuple(w.shape)} must have both dims multiples of 4")
    if w.stride(1) != 1:
        raise ValueError("sparsify_24_triton: the weight needs contiguous rows")
    w = w.detach()
    out = torch.empty_like(w, memory_format=torch.contiguous_format)
    mask = torch.empty(w.shape, dtype=torch.int8, device=w.device) if with_mask else out
    n_tiles = rows // 4 * (cols // 4)
    if method == "pairs":
        _transposable_24_pairs_kernel[(rows // 4 * triton.cdiv(cols // 4, tiles),)](
            w, out, mask, rows // 4, cols // 4, w.stride(0), out.stride(0), mask.stride(0),
            TILES=tiles, WRITE_MASK=with_mask, num_warps=num_warps,
        )  # fmt: skip
        return (out, mask.bool()) if with_mask else out
    if method != "dot":
        raise ValueError(f"sparsify_24_triton: method={method!r}; expected 'pairs' or 'dot'")
    p_table, bits = _pattern_tables(w.device)
    # Triton 3.6 cannot lower an fp64 dot whose operand was loaded as 16-bit ("fp64 don't support
    # largeK MMA"): score a float32 copy (exact: every bf16/fp16 value is a float32).
    s = w if w.dtype == torch.float32 else w.float()
    _transposable_24_kernel[(triton.cdiv(n_tiles, tiles),)](
        s, w, out, mask, p_table, bits, rows // 4, cols // 4, s.stride(0), w.stride(0), out.stride(0), mask.stride(0),
        TILES=tiles, P=_P, NUM_PATTERNS=90, WRITE_MASK=with_mask, num_warps=num_warps,
    )  # fmt: skip
    return (out, mask.bool()) if with_mask else out
