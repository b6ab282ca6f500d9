"""Weight gradients from a compact chunked V:N:M operand, block-sparse along tokens (Triton).

With neuron chunks (kernels/activation_mask.py, c >= 16) hidden unit u is nonzero only in the
token blocks that kept its chunk u // c, so

    out[u, :] = sum_t A[t, u] * B[t, :] = sum over the blocks b that kept chunk u // c of
                A_c[bV:(b+1)V, p:p+c]^T B[bV:(b+1)V, :]

with A_c the compact operand [T, Kc] and p the compact column where block b stores that chunk.
B2 = dW2 = dY^T H~ is out^T with A = r_c squared (H~ = R~^2, rounded once to the dtype, as the
scatter does) and B = dY; B4 = dW1 = dZ~^T X is out with A = dz_c and B = X. No [T, h] operand is
formed: the scatters that fed the dense B2/B4 are gone, and the GEMMs do keep-fraction x the work.

Layout: ``chunk_csr`` lists, for each chunk, the (block, compact column) pairs that hold it (E = T/V
x Kc/c entries, grouped by chunk, blocks ascending; one launch, ``chunk_csr_ref`` the torch
reference). One program computes a [BLOCK_D, c] tile of out^T for one chunk, its K loop running over
that chunk's blocks in V/BLOCK_K steps; dense tensor cores (M = BLOCK_D, N = c; with ``units_m``
the [c, BLOCK_D] tile of out, M = c, N = BLOCK_D). Reference:
``chunk_wgrad_ref`` (scatter, then a dense product in float32).

Split-K: the grid has h/c x D/BLOCK_D programs, 256 at (d, h) = (1024, 4096): one wave at two
programs per SM, so a call lasts as long as the chunk kept by the most blocks (K steps per chunk
vary with how often it is kept; ~64 on average at T = 16384, keep 1/4). With ``split`` S > 1 each
(chunk, D tile) is shared by S programs, each taking 1/S of its K steps and writing its float32
partial to [S, ...]; one more launch sums the partials in a fixed order (deterministic) and rounds
once. Extra traffic: S x D x h x 4 bytes written and read (64 MB at S = 4, (1024, 4096)). By
default S is the smallest power of two (at most 8) that gives at least 4 programs per SM; not for
the c >= 128 tile (one program per SM), where a fixed split costs more than it balances. That tile
splits by the selection instead, on the GPU: the TAIL schedule (``_tail_plan``) splits only the
heavy tiles of a last, partly filled wave into pieces, their partials P x BLOCK_D x c x 4 bytes.

db1 = scatter(dZ~).sum(0) is ``chunk_colsum``: per-block column sums of dZ~ (or the row-tile sums
that B1's gather-N epilogue wrote), then one program per chunk over the same csr (deterministic).
Summed inside the wgrad kernel it either raced (tl.sum) or was slower (a ones dot).
"""

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from sparse_compile.kernels.gather_gemm_triton import _tile, sm_count, tma_for
from sparse_compile.kernels.gather_reference import vnm_scatter_ref
from sparse_compile.kernels.launch import FastLaunch

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def chunk_csr_ref(ids: torch.Tensor, c: int, h: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(offsets int32 [h/c + 1], blocks int32 [E], cols int32 [E]): chunk j is held by block
    blocks[e] at compact column cols[e], for e in [offsets[j], offsets[j + 1]), blocks ascending
    (a stable sort of the chunk ids of ids[:, ::c]; about ten torch launches)."""
    nb, kc = ids.shape
    chunks = (ids[:, ::c] // c).reshape(-1)  # [nb * kc/c]
    keys, order = torch.sort(chunks, stable=True)
    # no bincount: its output size needs the max on the host, a device sync per call
    offsets = torch.searchsorted(keys, torch.arange(h // c + 1, device=ids.device, dtype=keys.dtype), out_int32=True)
    per_block = kc // c
    return offsets, (order // per_block).to(torch.int32), ((order % per_block) * c).to(torch.int32)


@triton.jit
def _chunk_csr_kernel(
    ids_ptr, offsets_ptr, blocks_ptr, cols_ptr, order_ptr, E, stride_ids,
    PER_BLOCK: tl.constexpr, C: tl.constexpr, BLOCK_E: tl.constexpr, ORDER: tl.constexpr, NCP: tl.constexpr,
):  # fmt: skip
    """Program j: offsets[j] = #entries (block, slot) whose chunk is < j; then chunk j's entries in
    entry order (blocks ascending) at offsets[j].. . Two reads of the E = T/V x Kc/c chunk ids.
    ORDER: the first read also counts every chunk's entries (a histogram over NCP >= h/c bins), and
    order[rank] = j with rank = #chunks kept by more blocks, or as many with a smaller id
    (chunk_order's sort, stable and descending, without its torch launches)."""
    j = tl.program_id(0)
    lanes = tl.arange(0, BLOCK_E)
    below = 0
    counts = tl.zeros((NCP,), dtype=tl.int32)
    bins = tl.arange(0, NCP)
    for e0 in range(0, E, BLOCK_E):
        e = e0 + lanes
        ch = tl.load(ids_ptr + (e // PER_BLOCK) * stride_ids + (e % PER_BLOCK) * C, mask=e < E, other=0) // C
        below += tl.sum(((ch < j) & (e < E)).to(tl.int32))
        if ORDER:  # lanes past E read chunk 0: taken off its bin
            counts += tl.histogram(ch, NCP) - tl.where(bins == 0, tl.sum((e >= E).to(tl.int32)), 0)
    tl.store(offsets_ptr + j, below)
    if j == 0:
        tl.store(offsets_ptr + tl.num_programs(0), E)
    if ORDER:
        mine = tl.sum(tl.where(bins == j, counts, 0))
        ahead = (counts > mine) | ((counts == mine) & (bins < j))
        tl.store(order_ptr + tl.sum((ahead & (bins < tl.num_programs(0))).to(tl.int32)), j)
    at = below
    for e0 in range(0, E, BLOCK_E):
        e = e0 + lanes
        ch = tl.load(ids_ptr + (e // PER_BLOCK) * stride_ids + (e % PER_BLOCK) * C, mask=e < E, other=-1) // C
        hit = (ch == j) & (e < E)
        pos = at + tl.cumsum(hit.to(tl.int32), 0) - 1
        tl.store(blocks_ptr + pos, (e // PER_BLOCK).to(tl.int32), mask=hit)
        tl.store(cols_ptr + pos, ((e % PER_BLOCK) * C).to(tl.int32), mask=hit)
        at += tl.sum(hit.to(tl.int32))


_CSR = FastLaunch(_chunk_csr_kernel)


def chunk_csr(ids: torch.Tensor, c: int, h: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``chunk_csr_ref`` in one Triton launch (one program per chunk; equal outputs)."""
    return _csr(ids, c, h, ordered=False)[0]


def chunk_plan(
    ids: torch.Tensor, c: int, h: int, units_m: bool = False
) -> tuple[tuple[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor | None]:
    """(chunk_csr(ids, c, h), default_order(offsets, c, units_m)) in the one launch of chunk_csr:
    where chunk_wgrad runs its chunks most-kept first, the csr kernel also ranks them (about six
    torch launches fewer per backward: argsort, diff, a cast; host time, not GPU time)."""
    return _csr(ids, c, h, ordered=_wide(c, ids.device, units_m))


def _csr(ids: torch.Tensor, c: int, h: int, ordered: bool):
    nb, kc = ids.shape
    if ids.dtype != torch.int32 or kc % c or h % c or ids.stride(1) != 1:
        raise ValueError(f"chunk_csr: ids {tuple(ids.shape)} {ids.dtype} (int32, unit stride), c={c}, h={h}")
    per_block = kc // c
    e = nb * per_block
    offsets = torch.empty(h // c + 1, device=ids.device, dtype=torch.int32)
    blocks = torch.empty(e, device=ids.device, dtype=torch.int32)
    cols = torch.empty(e, device=ids.device, dtype=torch.int32)
    order = torch.empty(h // c, device=ids.device, dtype=torch.int32) if ordered else None
    block_e = min(1024, triton.next_power_of_2(max(e, 16)))
    _CSR[(h // c,)](
        ids, offsets, blocks, cols, order if ordered else offsets, e, ids.stride(0), PER_BLOCK=per_block, C=c,
        BLOCK_E=block_e, ORDER=ordered, NCP=triton.next_power_of_2(h // c), num_warps=4,
    )  # fmt: skip
    return (offsets, blocks, cols), order


@triton.jit
def _tail_plan(offsets_ptr, NCH, ND, P, NCP: tl.constexpr, MOST: tl.constexpr):
    """The TAIL schedule of B2/B4 from the csr offsets (every program computes the same numbers):
    (nh, whole, tail, pieces). The heavy chunks are those kept by at least half as many blocks as
    the most-kept one; with the chunks most-kept first they are the first nh, and their nh x ND
    output tiles are numbered in the grouped order. The first ``whole`` run one program each; the
    last ``tail`` (heavy tiles mod P: the part of a last wave of long programs that would leave SMs
    idle) run ``pieces`` programs each, min(P // tail, MOST), each summing a contiguous share of the
    tile's K steps into float32 partials (tail_sum adds them in a fixed order). pieces < 2: no tail
    (tail 0, pieces 1). Every other tile keeps its program of the one-program-per-tile grid, in
    that grid's order (light and unkept chunks' tiles between the heavy ones, as before)."""
    j = tl.arange(0, NCP)
    lo = tl.load(offsets_ptr + j, mask=j < NCH, other=0)
    hi = tl.load(offsets_ptr + j + 1, mask=j < NCH, other=0)
    kept = hi - lo
    most = tl.max(kept)
    nh = tl.sum(((2 * kept >= most) & (kept > 0)).to(tl.int32))
    heavy = nh * ND
    rest = heavy % P
    pieces = tl.minimum(P // tl.maximum(rest, 1), MOST)
    split = (rest > 0) & (pieces > 1)
    tail = tl.where(split, rest, 0)
    return nh, heavy - tail, tail, tl.where(split, pieces, 1)


@triton.jit
def _tile_dst(chunk, dd, D, H, C: tl.constexpr, TRANSPOSE: tl.constexpr):
    """Offsets in out of a [BLOCK_D, C] tile (d rows dd, the chunk's C units): out [D, H] with
    TRANSPOSE, else [H, D]."""
    units = chunk * C + tl.arange(0, C)
    if TRANSPOSE:
        return dd[:, None].to(tl.int64) * H + units[None, :]
    return units[None, :].to(tl.int64) * D + dd[:, None]


@triton.jit
def _chunk_wgrad_kernel(
    a_ptr, b_ptr, out_ptr, offsets_ptr, blocks_ptr, cols_ptr, order_ptr, ws_ptr, D, H, V, stride_a, stride_b,
    P, C: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_K: tl.constexpr, SQUARE: tl.constexpr,
    TRANSPOSE: tl.constexpr, EVEN_D: tl.constexpr, I64: tl.constexpr, IEEE: tl.constexpr,
    SPLIT: tl.constexpr, UNITS_M: tl.constexpr, USE_TMA: tl.constexpr, GROUP_D: tl.constexpr,
    ORDERED: tl.constexpr, TAIL: tl.constexpr, NCP: tl.constexpr, MOST: tl.constexpr,
):  # fmt: skip
    """With SPLIT > 1, out_ptr is float32 [SPLIT, D*H]: each split's partial product; with SPLIT = 1,
    out in the output dtype. UNITS_M: the tile is [C, BLOCK_D] += A^T B (the chunk's units along the
    MMA's M), else [BLOCK_D, C] += B^T A. USE_TMA: a_ptr and b_ptr are TMA descriptors of A [T, Kc]
    ([BLOCK_K, C] tiles) and B [T, D] ([BLOCK_K, BLOCK_D] tiles, zero-filled past D): each K step is
    two bulk copies at (row, column) coordinates, no [BLOCK_K, BLOCK_D] pointer tile in registers.
    Program order: GROUP_D consecutive D tiles per chunk (they share its A slab in L2), chunks in
    ``order_ptr``'s order with ORDERED (most kept blocks first: the longest programs start first),
    else in chunk-id order, then the next GROUP_D D tiles.
    TAIL (ORDERED, not UNITS_M, SPLIT 1; _tail_plan): 1, this grid less the tail's heavy tiles,
    whose programs return at once; 2, the tail's pieces (a grid of P programs, those past tail x
    pieces idle), each writing its float32 partial to ws_ptr [P, BLOCK_D * C] at its number."""
    pid = tl.program_id(0)
    n_cap = 2**30
    if TAIL == 2:  # the tail's pieces: program pid is piece pid % pieces of heavy tile whole + pid // pieces
        nh, whole, tail, pieces = _tail_plan(offsets_ptr, H // C, tl.cdiv(D, BLOCK_D), P, NCP, MOST)
        live = pid < tail * pieces
        nh = tl.maximum(nh, 1)  # 0 only with no kept block at all (T = 0): no tile, no division by 0
        last = nh * tl.cdiv(D, BLOCK_D) - 1
        d_tile, rank = _tile(tl.minimum(whole + pid // pieces, last), D, nh * C, BLOCK_D, C, GROUP_D)
        chunk = tl.load(order_ptr + rank)
        n_cap = tl.where(live, n_cap, 0)
        d_end = tl.where(live, D, 0)
    else:
        d_tile, rank = _tile(pid, D, H, BLOCK_D, C, GROUP_D)
        chunk = tl.load(order_ptr + rank) if ORDERED else rank
        d_end = D
        if TAIL == 1:  # a heavy tile numbered >= whole in the heavy tiles' grouped order: left to the pieces
            nh, whole, tail, pieces = _tail_plan(offsets_ptr, H // C, tl.cdiv(D, BLOCK_D), P, NCP, MOST)
            first = (d_tile // GROUP_D) * GROUP_D
            size = tl.minimum(tl.cdiv(D, BLOCK_D) - first, GROUP_D)
            skip = (rank < nh) & (first * nh + rank * size + d_tile - first >= whole)
            n_cap = tl.where(skip, 0, n_cap)
            d_end = tl.where(skip, 0, D)
    dd = d_tile * BLOCK_D + tl.arange(0, BLOCK_D)
    d_ok = dd < d_end
    oc = tl.arange(0, C)
    ok = tl.arange(0, BLOCK_K)
    start = tl.load(offsets_ptr + chunk)
    ksteps = V // BLOCK_K
    n_iter = tl.minimum((tl.load(offsets_ptr + chunk + 1) - start) * ksteps, n_cap)
    i0 = 0
    if SPLIT > 1:  # this program's share of the K steps: [i0, n_iter)
        share = tl.cdiv(n_iter, SPLIT)
        i0 = tl.program_id(2) * share
        n_iter = tl.minimum(n_iter, i0 + share)
    if TAIL == 2:  # the piece's contiguous share of the tile's K steps
        share = tl.cdiv(n_iter, pieces)
        i0 = (pid % pieces) * share
        n_iter = tl.minimum(n_iter, i0 + share)
    acc = tl.zeros((C, BLOCK_D) if UNITS_M else (BLOCK_D, C), dtype=tl.float32)
    # A feeds the dot only: a tl.sum of A's tile here (db1) makes Triton 3.6 keep one shared buffer of
    # A that the next step's async copy overwrites under the in-flight wgmma (wrong dW1;
    # tests/triton_sm90_compile.py flags that pattern), and db1 as ones^T A on the tensor cores
    # serializes four small wgmmas per step: db1 is chunk_colsum's
    # one flat loop over (kept block, K step), so the loads of the next step are issued under this
    # step's dot (the index loads cost a pipeline stage, as in gather_k)
    for i in range(i0, n_iter):
        e = start + i // ksteps
        row0 = tl.load(blocks_ptr + e) * V + (i % ksteps) * BLOCK_K
        col = tl.multiple_of(tl.load(cols_ptr + e), C)
        if USE_TMA:
            a = a_ptr.load([row0, col])  # [BLOCK_K, C]
            b = b_ptr.load([row0, d_tile * BLOCK_D])  # [BLOCK_K, BLOCK_D]
        else:
            rows = (row0.to(tl.int64) if I64 else row0) + ok
            a = tl.load(a_ptr + rows[:, None] * stride_a + col + oc[None, :])  # [BLOCK_K, C]
            if EVEN_D:
                b = tl.load(b_ptr + rows[:, None] * stride_b + dd[None, :])
            else:
                b = tl.load(b_ptr + rows[:, None] * stride_b + dd[None, :], mask=d_ok[None, :], other=0.0)
        if SQUARE:
            a = (a.to(tl.float32) * a.to(tl.float32)).to(a.dtype)  # H~ = R~^2, one rounding
        if UNITS_M:  # [C, BLOCK_D] += A^T B
            lhs, rhs = tl.trans(a), b
        else:  # [BLOCK_D, C] += B^T A
            lhs, rhs = tl.trans(b), a
        if IEEE:  # float32 operands: no TF32, so the kernel never changes a user's precision
            acc = tl.dot(lhs, rhs, acc, input_precision="ieee")
        else:
            acc = tl.dot(lhs, rhs, acc)
    if UNITS_M:  # acc [C, BLOCK_D]
        units = chunk * C + oc
        if TRANSPOSE:  # out [D, H]
            dst = dd[None, :].to(tl.int64) * H + units[:, None]
        else:  # out [H, D]
            dst = units[:, None].to(tl.int64) * D + dd[None, :]
        d_mask = d_ok[None, :]
    else:  # acc [BLOCK_D, C]
        dst = _tile_dst(chunk, dd, D, H, C, TRANSPOSE)
        d_mask = d_ok[:, None]
    if SPLIT > 1:  # out is the float32 partials [SPLIT, D*H]
        dst += tl.program_id(2).to(tl.int64) * D * H
    if TAIL == 2:  # the piece's float32 partial, [BLOCK_D, C] row-major at its piece number
        rows = tl.arange(0, BLOCK_D)
        ws = ws_ptr + pid.to(tl.int64) * (BLOCK_D * C) + rows[:, None] * C + oc[None, :]
        tl.store(ws, acc, mask=(rows < tl.where(live, BLOCK_D, 0))[:, None])
    else:
        tl.store(out_ptr + dst, acc.to(out_ptr.dtype.element_ty), mask=d_mask)


@triton.jit
def _tail_sum_kernel(
    ws_ptr, out_ptr, offsets_ptr, order_ptr, D, H, P,
    C: tl.constexpr, BLOCK_D: tl.constexpr, ROWS: tl.constexpr, TRANSPOSE: tl.constexpr, GROUP_D: tl.constexpr,
    NCP: tl.constexpr, MOST: tl.constexpr,
):  # fmt: skip
    """Program (q, r): rows [r ROWS, (r+1) ROWS) of tail tile q of _chunk_wgrad_kernel's TAIL
    schedule (nothing where q >= tail): the sum of its pieces' float32 partials, piece 0 first,
    rounded once to out's dtype."""
    q = tl.program_id(0)
    nh, whole, tail, pieces = _tail_plan(offsets_ptr, H // C, tl.cdiv(D, BLOCK_D), P, NCP, MOST)
    if q < tail:
        d_tile, rank = _tile(whole + q, D, nh * C, BLOCK_D, C, GROUP_D)
        chunk = tl.load(order_ptr + rank)
        rows = tl.program_id(1) * ROWS + tl.arange(0, ROWS)
        oc = tl.arange(0, C)
        acc = tl.zeros((ROWS, C), dtype=tl.float32)
        for s in range(0, pieces):
            src = ws_ptr + ((q * pieces + s).to(tl.int64) * (BLOCK_D * C)) + rows[:, None] * C + oc[None, :]
            acc += tl.load(src)
        dd = d_tile * BLOCK_D + rows
        dst = _tile_dst(chunk, dd, D, H, C, TRANSPOSE)
        tl.store(out_ptr + dst, acc.to(out_ptr.dtype.element_ty), mask=(dd < D)[:, None])


@triton.jit
def _chunk_colsum_kernel(
    part_ptr, db_ptr, offsets_ptr, blocks_ptr, cols_ptr, KC, R, C: tl.constexpr, ENT: tl.constexpr,
):  # fmt: skip
    """Program j: db[j*C + o] = sum over chunk j's entries e (blocks ascending, ENT at a time) and
    the R row tiles of each block of part[blocks[e] R + r, cols[e] + o], part the float32 column
    sums of row tiles [T/V x R, Kc]. Reads E x R x c x 4 bytes in all (1 MB at (16384, 8192), keep
    1/4, R = 1)."""
    chunk = tl.program_id(0)
    start = tl.load(offsets_ptr + chunk)
    end = tl.load(offsets_ptr + chunk + 1)
    oc = tl.arange(0, C)
    ee = tl.arange(0, ENT)
    acc = tl.zeros((C,), dtype=tl.float32)
    for e0 in range(start, end, ENT):
        e = e0 + ee
        ok = e < end
        blk = tl.load(blocks_ptr + e, mask=ok, other=0)
        col = tl.multiple_of(tl.load(cols_ptr + e, mask=ok, other=0), C)  # a chunk starts at a multiple of c
        for r in range(R):
            x = tl.load(part_ptr + ((blk * R + r) * KC + col)[:, None] + oc[None, :], mask=ok[:, None], other=0.0)
            acc += tl.sum(x, axis=0)
    tl.store(db_ptr + chunk * C + oc, acc.to(db_ptr.dtype.element_ty))


_COLSUM = FastLaunch(_chunk_colsum_kernel)


def chunk_colsum(
    a: torch.Tensor, ids: torch.Tensor, v: int, c: int, h: int,
    csr: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
    tile_sums: torch.Tensor | None = None,
) -> torch.Tensor:  # fmt: skip
    """scatter(a).sum(0) [h] in a's dtype, summed in float32 (B4's db1 from the compact dZ~), in two
    launches, both deterministic: the column sums of each V-row block of a (a dense reduction over
    all of a's T x Kc elements, [T/V, Kc] float32 out), then one program per chunk adding its kept
    blocks' sums over the csr lists. One program per chunk over a itself was bound by the chunks most
    blocks keep. ``csr`` as in chunk_wgrad. ``tile_sums``: a's float32 column sums over row tiles of
    R rows, R dividing V ([T/R, Kc], gather_n_mm(..., tile_sums=True)), in place of the first launch."""
    _check(a, ids, a, v, c, h)
    if not chunk_wgrad_supports(v, c):
        raise ValueError(f"chunk_colsum: c={c} (a power of two >= 16), V={v} (a multiple of 16)")
    offsets, blocks, cols = csr if csr is not None else chunk_csr(ids, c, h)
    nb, kc = ids.shape
    if tile_sums is None:
        part, per_block = a.reshape(nb, v, kc).sum(1, dtype=torch.float32), 1  # [T/V, Kc]
    else:
        per_block = tile_sums.shape[0] // nb  # row tiles per block, V / R
        shape_ok = tile_sums.dim() == 2 and tile_sums.shape == (nb * per_block, kc) and per_block and v % per_block == 0
        if not shape_ok or tile_sums.dtype != torch.float32 or not tile_sums.is_contiguous():
            raise ValueError(
                f"chunk_colsum: tile_sums {tuple(tile_sums.shape)} {tile_sums.dtype}; expected contiguous float32 "
                f"[T/R, {kc}] with R dividing V={v} (T={a.shape[0]})"
            )
        part = tile_sums
    db = torch.empty(h, device=a.device, dtype=a.dtype)
    _COLSUM[(h // c,)](part, db, offsets, blocks, cols, kc, per_block, C=c, ENT=max(1, 2048 // c), num_warps=4)
    return db


def chunk_order(offsets: torch.Tensor) -> torch.Tensor:
    """int32 [h/c]: the chunks by how many blocks keep them, most first (ties by chunk id), from
    chunk_csr's offsets: chunk_wgrad starts its longest programs first, so none of them is left
    for the last wave (longest-processing-time-first)."""
    return torch.argsort(offsets.diff(), descending=True, stable=True).to(torch.int32)


def default_order(offsets: torch.Tensor, c: int, units_m: bool = False) -> torch.Tensor | None:
    """chunk_wgrad's program order when none is given: chunk_order(offsets) for the c >= 128 tile on
    CUDA, else None (chunk-id order, nothing built). The op calls it once for B2 and B4."""
    return chunk_order(offsets) if _wide(c, offsets.device, units_m) else None


def _wide(c: int, device: torch.device, units_m: bool) -> bool:
    """Whether chunk_wgrad runs its c >= 128 tile: [256, 128], 5 stages, TMA, grouped and ordered."""
    return c >= 128 and device.type == "cuda" and not units_m


def chunk_wgrad_supports(v: int, c: int) -> bool:
    """Whether the kernel takes chunks of c units in blocks of V tokens: c a power of two >= 16
    (the tensor-core tile's N), V a multiple of 16."""
    return c >= 16 and c & (c - 1) == 0 and v % 16 == 0


def _check(a: torch.Tensor, ids: torch.Tensor, b: torch.Tensor, v: int, c: int, h: int) -> None:
    t, kc = a.shape
    if a.dtype not in _DTYPES or b.dtype != a.dtype or ids.dtype != torch.int32:
        raise ValueError(f"chunk_wgrad: a {a.dtype}, b {b.dtype} (one of {_DTYPES}, equal), ids {ids.dtype} (int32)")
    if v < 1 or t % v or ids.shape != (t // v, kc) or b.shape[0] != t or kc % c or h % c:
        raise ValueError(
            f"chunk_wgrad: a {tuple(a.shape)}, ids {tuple(ids.shape)}, b {tuple(b.shape)}, "
            f"V={v}, c={c}, h={h} do not match"
        )


def chunk_wgrad(
    a: torch.Tensor,
    ids: torch.Tensor,
    b: torch.Tensor,
    v: int,
    c: int,
    h: int,
    square: bool = False,
    transpose: bool = False,
    csr: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
    order: torch.Tensor | None = None,
    group_d: int | None = None,
    block_d: int | None = None,
    block_k: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    split: int | None = None,
    units_m: bool = False,
    tma: bool | None = None,
    tail: bool | None = None,
    programs: int | None = None,
) -> torch.Tensor:
    """scatter(a)^T @ b [h, D] (``transpose``: its transpose [D, h], contiguous) for a compact
    chunked operand a [T, Kc] with ids [T/V, Kc] and b [T, D]; ``square``: a*a (rounded) for a.
    c must be >= 16 and a power of two, V a multiple of 16. ``csr``: chunk_csr(ids, c, h), if built.
    ``order``: the chunks' program order, int32 [h/c] (None: default_order(csr[0], c, units_m); the
    op builds it once for B2 and B4). ``group_d``: D tiles
    per chunk back to back (None: 4 for the c >= 128 tile, else 1; see the note at the launch).
    ``split``: programs per output tile, each summing 1/split of its K steps (None: the TAIL
    schedule for the c >= 128 tile, else split_for).
    ``units_m``: the output tile [c, block_d] (a's chunk along the MMA's M) instead of [block_d, c].
    Off by default: no faster for B4 and slower for B2, whose sm90 build loads its squared A tile
    with scalar 16-bit loads (``python -m bench.chunk_kernels --sweep`` times both).
    ``tma``: load a and b through TMA descriptors (None: for c >= 128 on sm90+ where both are 16-byte
    aligned; c = 64 is no faster through TMA). None for block_d, num_warps, num_stages: the
    defaults per c (the fastest of ``--sweep``).
    ``tail``: the TAIL schedule (_tail_plan): the heavy tiles of a last, partly filled wave split over
    the SMs it would leave idle, their float32 partials summed by one more launch (None: on for the
    c >= 128 tile where ``split`` is None; not with ``units_m`` or ``split``). It takes ``order``
    as chunk_order's ranking (by how many blocks keep each chunk, most first): the heavy chunks
    must be its first ranks.
    ``programs``: the SM count the schedule fills (None: the device's; 4 off CUDA)."""
    _check(a, ids, b, v, c, h)
    if not chunk_wgrad_supports(v, c):
        raise ValueError(f"chunk_wgrad: c={c} must be a power of two >= 16 and V={v} a multiple of 16")
    a = a if a.stride(1) == 1 else a.contiguous()
    b = b if b.stride(1) == 1 else b.contiguous()
    offsets, blocks, cols = csr if csr is not None else chunk_csr(ids, c, h)
    d = b.shape[1]
    out = torch.empty((d, h) if transpose else (h, d), device=a.device, dtype=a.dtype)
    # Tiles, the fastest of bench.chunk_kernels --sweep. c = 64: BLOCK_D 256, 8 warps, through
    # pointers (the kernel is L2-bound there: each kept chunk re-reads its blocks' rows of b, and TMA
    # is no faster). c = 128: a [256, 128] tile, 8 warps, 5 stages, TMA (Triton 3.6 spends one stage
    # on the csr loads: 3 buffers of 48 KB, one program per SM), ahead of [128, 128] tiles with 2
    # buffers and of the same tile at 3 or 4 stages (2 buffers, two programs per SM)
    cuda = a.device.type == "cuda"
    wide = _wide(c, a.device, units_m)
    block_d = block_d or (32 if not cuda else 256)
    num_warps = num_warps or (4 if units_m or not cuda else 8)  # [64, 256] float32: one warpgroup
    num_stages = num_stages or (5 if wide else 3)
    if tma is None and not wide:  # c = 64: pointer tiles (None stays: TMA where tma_for allows)
        tma = False
    block_k = block_k or (64 if v % 64 == 0 else 16)
    if v % block_k:
        raise ValueError(f"chunk_wgrad: block_k={block_k} must divide V={v}")
    i64 = max(a.shape[0] * a.stride(0), b.shape[0] * b.stride(0)) >= 2**31
    tiles = (h // c) * triton.cdiv(d, block_d)
    tail = wide and split is None if tail is None else tail
    if tail and (split not in (None, 1) or units_m):
        raise ValueError(
            f"chunk_wgrad: tail=True with split={split}, units_m={units_m}; it runs with split None or 1, not units_m"
        )
    # the wide tile runs one program per SM (shared memory): split only under two waves of it
    split = 1 if tail else split_for(tiles, a.device, per_sm=2 if wide else 4) if split is None else split
    if split < 1:
        raise ValueError(f"chunk_wgrad: split={split}; expected an int >= 1")
    dst = out if split == 1 else torch.empty((split, out.numel()), device=a.device, dtype=torch.float32)
    # square with units_m: Triton 3.6 keeps the squared A^T tile in one shared slot under async wgmma
    # (tests/triton_sm90_compile.py's one-slot check); units_m never defaults to TMA (not wide above)
    if tma and square and units_m:
        raise ValueError("chunk_wgrad: tma=True with square=True and units_m=True is not built (one-slot A^T tile)")
    use_tma = tma_for(a, tma) and tma_for(b, tma)
    a_src = TensorDescriptor.from_tensor(a, [block_k, c]) if use_tma else a
    b_src = TensorDescriptor.from_tensor(b, [block_k, block_d]) if use_tma else b
    # Program order of the c >= 128 tile (the fastest of bench.chunk_kernels --sweep): 4 D tiles per
    # chunk back to back, chunks most-kept first; in chunk-id order with D tiles outer each chunk's A
    # slab is re-read once per D tile from DRAM. Other tiles keep chunk-id order, D tiles outer
    if order is None:
        order = chunk_order(offsets) if tail else default_order(offsets, c, units_m)
    group_d = group_d or (4 if wide else 1)
    order_arg = offsets if order is None else order  # any int32 pointer: the kernel reads it only when ORDERED
    # TAIL: where most blocks keep the same chunks, the heavy tiles (chunks kept by most blocks) run
    # one per SM in waves and the last wave is partly full; its tiles are split into pieces of
    # contiguous K steps over the SMs it would leave idle (P x BLOCK_D x c x 4 bytes of partials)
    p = programs if programs is not None else sm_count(a.device.index) if cuda else 4
    if p < 1:
        raise ValueError(f"chunk_wgrad: programs={programs}; expected an int >= 1")
    ws = torch.empty((p, block_d * c), device=a.device, dtype=torch.float32) if tail else dst
    ncp = triton.next_power_of_2(h // c)
    for grid, stage in ((tiles, 1), (p, 2)) if tail else ((tiles, 0),):  # TAIL: the grid, then the pieces
        _WGRAD[(grid, 1, split)](
            a_src, b_src, dst, offsets, blocks, cols, order_arg, ws, d, h, v, a.stride(0), b.stride(0), p,
            C=c, BLOCK_D=block_d, BLOCK_K=block_k, SQUARE=square, TRANSPOSE=transpose, EVEN_D=d % block_d == 0,
            I64=i64, IEEE=a.dtype == torch.float32, SPLIT=split, UNITS_M=units_m, USE_TMA=use_tma,
            GROUP_D=group_d, ORDERED=order is not None, TAIL=stage, NCP=ncp, MOST=_MOST_PIECES,
            num_warps=num_warps,
            num_stages=num_stages,
        )  # fmt: skip
    if tail:  # the tail tiles' partials summed piece by piece, rounded once (nothing where no tail)
        rows = min(32, block_d)
        _TAIL_SUM[(p, block_d // rows)](
            ws, out, offsets, order, d, h, p, C=c, BLOCK_D=block_d, ROWS=rows, TRANSPOSE=transpose,
            GROUP_D=group_d, NCP=ncp, MOST=_MOST_PIECES, num_warps=4,
        )  # fmt: skip
    if split > 1:  # the partials summed in a fixed order, rounded once: one launch
        grid = (triton.cdiv(out.numel(), 2048),)
        _SUM_PARTIALS[grid](dst, out, out.numel(), SPLIT=split, BLOCK=2048, num_warps=4)
    return out


def tail_plan(counts: list[int], nd: int, programs: int) -> tuple[int, int, int, int]:
    """The TAIL schedule's (nh, whole, tail, pieces) for chunks kept by ``counts`` blocks, ``nd``
    D tiles and ``programs`` SMs: _tail_plan's numbers on the host (tests, benchmarks)."""
    most = max(counts)
    nh = sum(1 for k in counts if k > 0 and 2 * k >= most)
    heavy = nh * nd
    rest = heavy % programs
    pieces = min(programs // max(rest, 1), _MOST_PIECES)
    if rest == 0 or pieces < 2:
        return nh, heavy, 0, 1
    return nh, heavy - rest, rest, pieces


@triton.jit
def _sum_partials_kernel(part_ptr, out_ptr, n, SPLIT: tl.constexpr, BLOCK: tl.constexpr):
    """out[i] = sum over s of part[s, i] (float32 [SPLIT, n], s ascending), rounded to out's dtype."""
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = i < n
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in tl.static_range(SPLIT):
        acc += tl.load(part_ptr + s * n.to(tl.int64) + i, mask=ok, other=0.0)
    tl.store(out_ptr + i, acc.to(out_ptr.dtype.element_ty), mask=ok)


_WGRAD = FastLaunch(_chunk_wgrad_kernel)
_TAIL_SUM = FastLaunch(_tail_sum_kernel)
_SUM_PARTIALS = FastLaunch(_sum_partials_kernel)
_MOST_PIECES = 8  # programs per tail tile at most: a tile of 128 blocks x 2 K steps in pieces of >= 32 steps


def split_for(tiles: int, device: torch.device, per_sm: int = 4, most: int = 8) -> int:
    """The split of a grid of ``tiles`` output tiles: the smallest power of two, at most ``most``,
    that makes at least ``per_sm`` programs per SM (1 off CUDA)."""
    if device.type != "cuda":
        return 1
    want = per_sm * sm_count(device.index)
    split = 1
    while split < most and tiles * split < want:
        split *= 2
    return split


def chunk_wgrad_ref(
    a: torch.Tensor, ids: torch.Tensor, b: torch.Tensor, v: int, h: int, square: bool = False
) -> torch.Tensor:
    """scatter(a)^T @ b [h, D] in float32, rounded to a's dtype: the dense product the kernel skips zeros of."""
    if square:
        a = a * a
    dense = vnm_scatter_ref(a, ids, v, h)
    return (dense.float().t() @ b.float()).to(a.dtype)
