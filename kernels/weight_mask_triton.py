"""Transposable 2:4 weight mask in Triton (reference: kernels/weight_mask.py).

One program scores TILES 4x4 tiles of W against all 90 patterns (padded to 128): for each of
the 16 in-tile positions k, scores[t, p] += |w[t, k]| * P[k, p] in float64, the reference's
precision. For bf16/fp16 weights the float64 sums of 8 values are exact, so the summation order
cannot matter and the result is bit-identical to the reference (for fp32 weights, exact unless
one tile's magnitudes span more than ~2^26). Best pattern = first maximum in the reference's
pattern order (argmax, ties to the left); then W~ = W * mask is written, and the mask if asked.

Cost: 16 x 128 float64 FMAs per tile (128 per weight), compute-bound on fp64, far above the
memory floor (read W, write W~): about 0.26 ms of fp64 FMA at 16384x4096 on an H100 against the
reference's 7.6 ms. Skipping the 38 padding patterns or summing per-row pairs first would cut
the FMAs 4-7x (not done).
"""

import torch
import triton
import triton.language as tl

from sparse_compile.kernels.weight_mask import TRANSPOSABLE_24_PATTERNS

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
    w_ptr, out_ptr, mask_ptr, p_ptr, bits_ptr, TILE_ROWS, TILE_COLS, stride_w, stride_o, stride_m,
    TILES: tl.constexpr, P: tl.constexpr, NUM_PATTERNS: tl.constexpr, WRITE_MASK: tl.constexpr,
):  # fmt: skip
    t = tl.program_id(0) * TILES + tl.arange(0, TILES)  # tile index, row-major over the tile grid
    tr = t // TILE_COLS
    tc = t % TILE_COLS
    ok = tr < TILE_ROWS
    w_base = tr.to(tl.int64) * 4 * stride_w + tc * 4
    p = tl.arange(0, P)
    scores = tl.zeros((TILES, P), dtype=tl.float64)
    for k in tl.static_range(16):
        w = tl.load(w_ptr + w_base + (k // 4) * stride_w + (k % 4), mask=ok, other=0.0)
        scores += tl.abs(w.to(tl.float64))[:, None] * tl.load(p_ptr + k * P + p)[None, :]
    scores = tl.where((p < NUM_PATTERNS)[None, :], scores, -1.0)
    best = tl.argmax(scores, axis=1, tie_break_left=True)  # [TILES]
    o_base = tr.to(tl.int64) * 4 * stride_o + tc * 4
    m_base = tr.to(tl.int64) * 4 * stride_m + tc * 4
    for k in tl.static_range(16):
        keep = tl.load(bits_ptr + best * 16 + k, mask=ok, other=0)
        w = tl.load(w_ptr + w_base + (k // 4) * stride_w + (k % 4), mask=ok, other=0.0)
        tl.store(out_ptr + o_base + (k // 4) * stride_o + (k % 4), w * keep.to(w.dtype), mask=ok)
        if WRITE_MASK:
            tl.store(mask_ptr + m_base + (k // 4) * stride_m + (k % 4), keep, mask=ok)


def sparsify_24_triton(w: torch.Tensor, with_mask: bool = False, tiles: int = 32):
    """W * M(W) with M the transposable 2:4 mask; with ``with_mask``, (W * M, M as bool)."""
    if not isinstance(w, torch.Tensor) or w.dim() != 2 or w.dtype not in _DTYPES:
        raise ValueError(
            f"sparsify_24_triton: expected a 2-D weight of {_DTYPES}; got "
            f"{getattr(w, 'dtype', type(w))} {tuple(getattr(w, 'shape', ()))}"
        )
    rows, cols = w.shape
    if rows % 4 or cols % 4:
        raise ValueError(f"sparsify_24_triton: weight shape {tuple(w.shape)} must have both dims multiples of 4")
    if w.stride(1) != 1:
        raise ValueError("sparsify_24_triton: the weight needs contiguous rows")
    w = w.detach()
    out = torch.empty_like(w, memory_format=torch.contiguous_format)
    mask = torch.empty(w.shape, dtype=torch.int8, device=w.device) if with_mask else out
    p_table, bits = _pattern_tables(w.device)
    n_tiles = rows // 4 * (cols // 4)
    _transposable_24_kernel[(triton.cdiv(n_tiles, tiles),)](
        w, out, mask, p_table, bits, rows // 4, cols // 4, w.stride(0), out.stride(0), mask.stride(0),
        TILES=tiles, P=_P, NUM_PATTERNS=90, WRITE_MASK=with_mask,
    )  # fmt: skip
    return (out, mask.bool()) if with_mask else out
