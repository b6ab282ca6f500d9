"""The chunked V:N:M selection in Triton: Z -> compact H~, R~ and ids in two reads of one group.

Pattern (kernels/activation_mask.py, c > 1): per block of V tokens and group of M chunks of c
units, keep the 4 chunks of largest L1 norm of H = relu(Z + b)^2 (float32 sums over V x c), then
at every row and offset the N largest of those 4 chunks' entries. Reference: vnm_compact_ref(z,
bias, v, n, m, c), which this matches value for value (the float32 norm sums may round in another
order, so a near-tie between chunk norms may resolve differently).

Causal (``seq``, tokens per sequence): pass 1 scores the previous block of the sequence instead
(its last ``score_rows`` rows when given; a sequence's first block: its first row alone), as the
reference's block_scores does; pass 2 is unchanged. The bytes read stay at most 1.25 x Z: each
block's rows are scored by the next block's program.

One program = one V-block x one group (M*c columns, a power of two). Pass 1 walks the block's
rows in ROWS-row steps, accumulating relu(Z + b)^2 (rounded to Z's dtype, as the reference does)
elementwise in float32; one reduction gives the M chunk norms; the top 4 by rank (ties to the
lower chunk). Pass 2 reads only the 4 kept chunks (each c contiguous columns of a row), ranks each
entry among the 4 at its offset, and stores r_c and h_c as contiguous [ROWS, 4c] row segments.
Bytes: Z read 1.25 times, r_c and h_c written (2 x Z/4 at keep 1/4), ids once per program.
"""

import torch
import triton
import triton.language as tl

from sparse_compile.kernels.activation_mask import _check
from sparse_compile.kernels.launch import FastLaunch

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@triton.jit
def _relu_sq(z_ptr, bias_ptr, offs, cols, HAS_BIAS: tl.constexpr):
    """(r, h) = relu(z + b), r*r, each rounded to z's dtype as the reference computes them."""
    z = tl.load(z_ptr + offs)
    if HAS_BIAS:
        z = (z.to(tl.float32) + tl.load(bias_ptr + cols).to(tl.float32)).to(z_ptr.dtype.element_ty)
    r = tl.maximum(z, 0.0)
    h = (r.to(tl.float32) * r.to(tl.float32)).to(z_ptr.dtype.element_ty)
    return r, h


@triton.jit
def _choose_chunks(
    z_ptr, bias_ptr, ids_ptr, blk, g, src0, scored, LOOP, stride_z, stride_ids,
    M: tl.constexpr, C: tl.constexpr, ROWS: tl.constexpr, HAS_BIAS: tl.constexpr,
):  # fmt: skip
    """Pass 1 of one (block, group): the float32 L1 norms of relu(z + b)^2 over the ``scored`` rows
    from row ``src0`` (LOOP >= scored rows walked, ROWS at a time) and each of the M chunks' C columns
    of group g; the 4 largest (ties to the lower chunk) stored to ids row blk as absolute unit ids,
    ascending. Returns them [4, C], slot-major."""
    W: tl.constexpr = M * C
    rr = tl.arange(0, ROWS)
    col = g * W + tl.arange(0, W)
    acc = tl.zeros((ROWS, W), dtype=tl.float32)
    for k in range(0, LOOP, ROWS):
        rows = src0 + k + rr
        _, hh = _relu_sq(z_ptr, bias_ptr, rows[:, None] * stride_z + col[None, :], col[None, :], HAS_BIAS)
        acc += tl.where((k + rr < scored)[:, None], hh.to(tl.float32), 0.0)
    norms = tl.sum(tl.reshape(tl.sum(acc, axis=0), (M, C)), axis=1)  # [M]
    j = tl.arange(0, M)
    ahead = (norms[None, :] > norms[:, None]) | ((norms[None, :] == norms[:, None]) & (j[None, :] < j[:, None]))
    chosen = tl.sum(ahead.to(tl.int32), axis=1) < 4  # [M]
    slot = tl.cumsum(chosen.to(tl.int32), axis=0) - 1  # ascending position among the 4 chosen
    s4 = tl.arange(0, 4)
    kept = tl.sum(tl.where(chosen[None, :] & (slot[None, :] == s4[:, None]), j[None, :], 0), axis=1)  # [4]
    oc = tl.arange(0, C)
    unit = g * W + kept[:, None] * C + oc[None, :]  # [4, C] absolute ids, slot-major
    out_col = g * 4 * C + s4[:, None] * C + oc[None, :]
    tl.store(ids_ptr + blk.to(tl.int64) * stride_ids + out_col, unit.to(tl.int32))
    return unit


@triton.jit
def _chunk_select_kernel(
    z_ptr, bias_ptr, hc_ptr, rc_ptr, ids_ptr, V, stride_z, stride_c, stride_ids, SEQ_BLOCKS, S,
    M: tl.constexpr, C: tl.constexpr, N: tl.constexpr, ROWS: tl.constexpr, ROWS2: tl.constexpr,
    HAS_BIAS: tl.constexpr, CAUSAL: tl.constexpr,
):  # fmt: skip
    """CAUSAL: pass 1 scores the last S rows of block blk - 1 of the sequence (SEQ_BLOCKS blocks
    per sequence), or only the first row of a sequence's first block (S = V without CAUSAL).
    ROWS: rows per step of pass 1 ([ROWS, M*C] tiles), ROWS2 of pass 2 ([ROWS2, 4*C])."""
    blk = tl.program_id(0)
    g = tl.program_id(1)
    row0 = blk.to(tl.int64) * V
    if CAUSAL:
        starts = blk % SEQ_BLOCKS == 0
        src0 = tl.where(starts, row0, row0 - S)  # first row pass 1 scores
        scored = tl.where(starts, 1, S)  # the rows that count
    else:
        src0 = row0
        scored = V
    unit = _choose_chunks(z_ptr, bias_ptr, ids_ptr, blk, g, src0, scored, S, stride_z, stride_ids, M, C, ROWS, HAS_BIAS)
    s4 = tl.arange(0, 4)
    # the kept units come in runs of C from multiples of C, the output columns are one run of 4C:
    # said to the compiler, pass 2 reads and writes whole vectors (without it, one 16-bit access
    # per element)
    unit = tl.max_contiguous(tl.multiple_of(tl.reshape(unit, (4 * C,)), C), C)
    out_col = g * 4 * C + tl.arange(0, 4 * C)
    rr2 = tl.arange(0, ROWS2)
    for k in range(0, V, ROWS2):
        rows = row0 + k + rr2
        r, hh = _relu_sq(z_ptr, bias_ptr, rows[:, None] * stride_z + unit[None, :], unit[None, :], HAS_BIAS)
        if N < 4:
            hf = tl.reshape(hh, (ROWS2, 4, C)).to(tl.float32)
            # rank of each entry among the 4 chunks at its row and offset: larger first, ties to the lower chunk
            rank = tl.zeros((ROWS2, 4, C), dtype=tl.int32)
            for q in tl.static_range(4):
                other = tl.sum(tl.where((s4 == q)[None, :, None], hf, 0.0), axis=1)  # [ROWS, C]: chunk q
                rank += ((other[:, None, :] > hf) | ((other[:, None, :] == hf) & (q < s4)[None, :, None])).to(tl.int32)
            keep = tl.reshape(rank < N, (ROWS2, 4 * C))
            r = tl.where(keep, r, 0.0)
            hh = tl.where(keep, hh, 0.0)
        # N = 4: every entry of the 4 kept chunks stays
        dst = rows[:, None] * stride_c + out_col[None, :]
        tl.store(rc_ptr + dst, r)
        tl.store(hc_ptr + dst, hh)


_SELECT = FastLaunch(_chunk_select_kernel)


def chunk_supports(v: int, m: int, c: int) -> bool:
    """Whether the kernel takes the pattern: V a multiple of 16, M*c a power of two, c >= 2."""
    w = m * c
    return v % 16 == 0 and c >= 2 and w & (w - 1) == 0


def select_tiling(m: int, c: int) -> tuple[int, int, int]:
    """(rows per step of pass 1, of pass 2, warps). Where M*c >= 2048 (the default's causal 128:4:16
    in chunks of 128): [rows, M*c] and [rows2, 4c] tiles of 8192 entries (16 KB of 16-bit Z), 8 warps,
    the fastest of `python -m bench.chunk_kernels --select-sweep` (smaller steps keep too little in
    flight). Narrower groups: [rows, M*c] tiles of 4096 entries for both passes, 4 warps."""
    if m * c >= 2048:
        return max(1, 8192 // (m * c)), max(1, min(16, 8192 // (4 * c))), 8
    rows = min(16, 4096 // (m * c))
    return rows, rows, 4


def vnm_select_chunks(
    z: torch.Tensor,
    bias: torch.Tensor | None,
    v: int,
    n: int,
    m: int,
    c: int,
    seq: int | None = None,
    tiling: tuple[int, int, int] | None = None,
    score_rows: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(h_c [T, h*4/M], r_c [T, h*4/M], ids int32 [T/V, h*4/M]) of z [T, h] (+ bias), as
    vnm_compact_ref(z, bias, v, n, m, c, seq, score_rows) lays them out; ``seq``: causal over sequences
    of that many tokens, ``score_rows``: scored on the previous block's last that many rows;
    ``tiling``: (rows of pass 1, rows of pass 2, warps), powers of two dividing V (None:
    select_tiling(m, c))."""
    if z.dtype not in _DTYPES or (bias is not None and bias.dtype != z.dtype):
        raise ValueError(f"vnm_select_chunks: z.dtype={z.dtype}, bias dtype must equal it and be one of {_DTYPES}")
    t, h = z.shape
    if not chunk_supports(v, m, c) or n not in (1, 2, 4) or t % v or h % (m * c):
        raise ValueError(
            f"vnm_select_chunks: pattern {v}:{n}:{m} in chunks of {c} on z {tuple(z.shape)}: needs V % 16 == 0, "
            "M*c a power of two, N in (1, 2, 4), T % V == 0 and h % (M*c) == 0"
        )
    _check(z, v, n, m, c, seq, score_rows)  # the reference's checks, the causal sequence length among them
    z = z if z.stride(1) == 1 else z.contiguous()
    kc = h * 4 // m
    h_c = torch.empty(t, kc, device=z.device, dtype=z.dtype)
    r_c = torch.empty_like(h_c)
    ids = torch.empty(t // v, kc, device=z.device, dtype=torch.int32)
    rows, rows2, warps = tiling or select_tiling(m, c)
    if any(r < 1 or r & (r - 1) or v % r for r in (rows, rows2)):
        raise ValueError(f"vnm_select_chunks: tiling={tiling}: rows must be powers of two dividing V={v}")
    grid = (t // v, h // (m * c))
    _SELECT[grid](
        z, z if bias is None else bias, h_c, r_c, ids, v, z.stride(0), kc, kc, (seq or v) // v, score_rows or v,
        M=m, C=c, N=n, ROWS=rows, ROWS2=rows2, HAS_BIAS=bias is not None, CAUSAL=seq is not None,
        num_warps=warps,
    )  # fmt: skip
    return h_c, r_c, ids
