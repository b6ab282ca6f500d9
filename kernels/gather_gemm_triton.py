"""The two GEMMs of a compact V:N:M activation, in Triton (references: kernels/gather_reference.py).

Every block of V tokens keeps the same Kc = F*4/M hidden columns (ids [T/V, Kc]), so a tile of
BLOCK_M rows inside one block multiplies against one set of gathered rows of a dense operand:

  gather_k_mm  C[T, N]  = c[T, Kc] @ b[ids, :]            K = Kc  (F2: b = W2^T [h, d]; B3: b = W1 [h, d])
  gather_n_mm  C[T, Kc] = a[T, K] @ bt[ids, :]^T          N = Kc  (B1: a = dY, bt = W2^T [h, d])
               with the dZ epilogue: C = round(C) * 2 r   (r = compact relu(Z), 0 where a row drops)
               and optionally each row tile's column sums of C in float32 (db1's first step)
               and H~ = round(r^2) (B2's operand: the epilogue has r loaded already);
               or with the activation epilogue (F1 on the kept chunks: a = X, bt = W1 [h, d]):
               C = relu(round(C + b1[ids])) = R~, and H~ = round(R~^2)

FLOPs are 2*T*N*Kc (resp. 2*T*K*Kc): M/4 times fewer than the dense GEMM over F. Bytes: the
gathered operand is re-read once per BLOCK_M-row tile, like a dense B. Rows of b are contiguous
along N (resp. K), so each gathered row is a coalesced load (cp.async; Hopper has no TMA gather);
the contiguous operand (c, resp. a) comes through a TMA descriptor on sm90+. With neuron chunks
whose runs cover the id tile (chunk 128; BLOCK_K, resp. BLOCK_N, 64 or 128) a tile's ids are
consecutive units, so the gathered tile is a dense slab of b: one TMA copy at the run's first id.
fp32 accumulate; fp32 inputs use IEEE fp32 dot (no TF32), so the kernels never change a user's precision.
BLOCK_M must divide V (one id set per tile): the autotuner only tries those configs. The token
count T is not in the autotune key: a model whose batch varies (dynamic shapes) tunes once per
layer shape, not once per batch size (tuning takes seconds), and the choices are kept on disk
(kernels/tune_cache.py): a machine tunes each shape once, not once per process.
"""

import functools
import os

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from sparse_compile.kernels.launch import FastLaunch
from sparse_compile.kernels.tune_cache import TuneStore

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
# Load the contiguous operand (c in gather_k, dY in gather_n) through TMA by default (sm90+,
# aligned rows): faster at large shapes, equal at small ones.
TMA_DEFAULT = True
# gather_n as persistent programs (one per SM, walking the tiles in one flattened loop, so the
# next tile's loads are issued under this tile's last dots and its dZ epilogue).
PERSISTENT_DEFAULT = True

# Hopper/Ampere bf16/fp16 tiles: (BLOCK_M, BLOCK_N, BLOCK_K, stages, warps)
_TILES = [
    (128, 256, 64, 3, 8),
    (128, 256, 64, 4, 8),
    (128, 128, 64, 4, 8),
    (128, 128, 64, 4, 4),
    (128, 128, 64, 5, 4),
    (128, 128, 64, 6, 8),
    (128, 128, 128, 3, 8),
    (64, 256, 64, 4, 8),
    (64, 128, 64, 4, 4),
    (64, 128, 128, 3, 4),
    (64, 64, 64, 4, 4),
    (32, 128, 64, 4, 4),  # V = 32 or 16 only
    (16, 128, 64, 4, 4),
]
# gather_k loads its ids inside the K loop and the gathered rows' addresses depend on them, so
# Triton's pipeliner spends one stage on the ids: at num_stages 3 or 4 the gathered operand is
# double-buffered (one tile in flight), at 5-6 triple-, at 7 quadruple-buffered (read off the
# sm90 TTGIR: async_wait counts and shared memory, 98/148/197 KB at 128x256x64). gather_n loads
# its ids once, outside the loop, so its stages count as written.
# Row tiles sharing a column tile (GROUP_M): each of the T/V blocks gathers its own Kc rows of b,
# so more row tiles per column tile keep more of those rows in L2 (at GROUP_M=8 most of the DRAM
# traffic is rows of b read again); 32 was the fastest of 8-64 for gather_k and gather_n.
_GROUP_M = 32
# Chunk runs that cover the id tile copied as slabs through a TMA descriptor of the weight
# (_run_operand); False: gathered rows, for a benchmark's baseline (bench.chunk_kernels).
SLABS_DEFAULT = True
_GATHER_K_TILES = list(dict.fromkeys([(bm, bn, bk, s + 2, w) for bm, bn, bk, s, w in _TILES] + [(128, 256, 64, 7, 8)]))
# The narrowest id tile of any config (gather_k's BLOCK_K, gather_n's BLOCK_N): runs of chunk ids
# are hinted at most this long, so a run never outlasts its tile.
_MIN_ID_TILE = min(min(bk for _, _, bk, _, _ in _GATHER_K_TILES), min(bn for _, bn, _, _, _ in _TILES))
_MIN_BLOCK_M = min(bm for bm, _, _, _, _ in _TILES)  # the narrowest row tile (16, as the interpreter's)


def _tma_block(nargs: dict) -> None:
    """Autotune pre-hook: the contiguous operand's TMA descriptor loads [BLOCK_M, BLOCK_K] tiles;
    the gathered operand's (chunk runs, ``b_desc``), one run's slab per tile, in its storage order:
    gather_k [BLOCK_K, BLOCK_N] of b (B_T: [BLOCK_N, BLOCK_K] of b^T), gather_n [BLOCK_N, BLOCK_K]
    of bt (B_T: [BLOCK_K, BLOCK_N] of bt^T)."""
    if isinstance(nargs["a_desc"], TensorDescriptor):
        nargs["a_desc"].block_shape = [nargs["BLOCK_M"], nargs["BLOCK_K"]]
    if isinstance(nargs["b_desc"], TensorDescriptor):
        gather_n = "bt_ptr" in nargs
        k_rows = nargs["B_T"] if gather_n else not nargs["B_T"]  # the slab is [BLOCK_K, BLOCK_N]
        shape = [nargs["BLOCK_K"], nargs["BLOCK_N"]] if k_rows else [nargs["BLOCK_N"], nargs["BLOCK_K"]]
        nargs["b_desc"].block_shape = shape


def _configs(tiles: list[tuple[int, int, int, int, int]]) -> list[triton.Config]:
    if os.environ.get("TRITON_INTERPRET") == "1":  # CPU interpreter: one small config
        return [
            triton.Config({"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 2}, num_warps=1, pre_hook=_tma_block)
        ]
    return [
        triton.Config(
            {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": _GROUP_M},
            num_stages=s,
            num_warps=w,
            pre_hook=_tma_block,
        )
        for bm, bn, bk, s, w in tiles
    ]


def _tma_aligned(t: torch.Tensor) -> bool:
    """Whether ``t`` (row-major) has the 16-byte aligned base and row stride TMA requires."""
    return t.data_ptr() % 16 == 0 and (t.stride(0) * t.element_size()) % 16 == 0


def tma_for(t: torch.Tensor, tma: bool | None) -> bool:
    """Whether to load ``t`` (row-major) through a TMA descriptor: asked for, or (None) on sm90+
    when its base and row stride are 16-byte aligned, as TMA requires."""
    aligned = _tma_aligned(t)
    if tma is None:
        return TMA_DEFAULT and aligned and t.is_cuda and capability(t.device.index) >= (9, 0)
    if tma and not aligned:
        raise ValueError(f"tma=True needs a 16-byte aligned base and row stride; got stride {t.stride()}")
    return tma


def _a_operand(t: torch.Tensor, use_tma: bool):
    """The kernel's a_desc argument: a TMA descriptor (block shape set per config by _tma_block),
    or the tensor itself when the kernel loads through pointers."""
    return TensorDescriptor.from_tensor(t, [16, 16]) if use_tma else t


def _run_operand(b: torch.Tensor, transposed: bool, use_tma: bool, chunk: int):
    """(the kernel's b_desc argument, RUN): with ids in aligned runs of ``chunk`` >= 16 units and
    the contiguous operand on TMA, a descriptor of the gathered operand's row-major storage (b, or
    b^T when b is a transposed view) where it is 16-byte aligned, and RUN = chunk: a config whose id
    tile (gather_k's BLOCK_K, gather_n's BLOCK_N) divides the run loads one contiguous slab per tile
    through it at the run's first id, no per-row addresses. Else (b itself, 1): gathered rows."""
    store = b.t() if transposed else b
    if SLABS_DEFAULT and use_tma and chunk >= 16 and _tma_aligned(store):
        return TensorDescriptor.from_tensor(store, [16, 16]), chunk
    return b, 1


def _persistent(t: torch.Tensor, persistent: bool | None) -> bool:
    return (PERSISTENT_DEFAULT and t.is_cuda) if persistent is None else persistent


def capability(index: int | None) -> tuple[int, int]:
    """(major, minor) compute capability of CUDA device ``index`` (None: the current one), asked
    once per device: torch's query costs host time on every call, and tma_for runs on every
    gather and weight-gradient launch."""
    return _capability(torch.cuda.current_device() if index is None else index)


@functools.cache
def _capability(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


@functools.cache
def sm_count(index: int | None) -> int:
    """Streaming multiprocessors of CUDA device ``index`` (None: the current one)."""
    index = torch.cuda.current_device() if index is None else index
    return torch.cuda.get_device_properties(index).multi_processor_count


def _grid(rows: int, cols: int, device: torch.device, persistent: bool):
    """Launch grid of a [rows, cols] output: one program per tile, or (persistent) at most one per
    SM (CPU interpreter: 4 programs, enough to walk several tiles each)."""

    def grid(meta):
        tiles = triton.cdiv(rows, meta["BLOCK_M"]) * triton.cdiv(cols, meta["BLOCK_N"])
        if not persistent:
            return (tiles,)
        return (min(tiles, sm_count(device.index) if device.type == "cuda" else 4),)

    return grid


def _i32_rows(b: torch.Tensor) -> bool:
    """Whether every element offset of b fits in int32: then the gathered rows' addresses are
    computed in 32 bits (64-bit address arithmetic stalls the gathered loads)."""
    return sum(n * abs(st) for n, st in zip(b.shape, b.stride(), strict=True)) < 2**31


def _prune(configs, named_args, **kwargs):
    v = named_args["V"] if "V" in named_args else kwargs["V"]
    return [c for c in configs if v % c.kwargs["BLOCK_M"] == 0]


@triton.jit
def _tile(pid, T, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """Tile number -> (pid_m, pid_n) in grouped order: GROUP_M row tiles share each column tile
    while it is in L2."""
    num_m = tl.cdiv(T, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * num_n
    first_m = (pid // per_group) * GROUP_M
    size_m = tl.minimum(num_m - first_m, GROUP_M)
    return first_m + (pid % per_group) % size_m, (pid % per_group) // size_m


@triton.jit
def _gather_k_tile(
    tile, c_ptr, a_desc, ids_ptr, b_ptr, b_desc, bias_ptr, out_ptr,
    T, N, KC, V, stride_c, stride_ids, stride_b, stride_out,
    HAS_BIAS: tl.constexpr, IEEE: tl.constexpr, USE_TMA: tl.constexpr, B_I32: tl.constexpr,
    B_T: tl.constexpr, CHUNK: tl.constexpr, RUN: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):  # fmt: skip
    """One [BLOCK_M, BLOCK_N] output tile of gather_k_mm. B_T: b is stored transposed (element
    (f, n) at f + n * stride_b), its gathered rows contiguous only along runs of CHUNK ids. RUN > 1
    with BLOCK_K dividing it: each K step's BLOCK_K ids are one run's consecutive units id0.., so
    b's tile is the slab at row id0 of b_desc (B_T: column id0 of b^T), one bulk copy."""
    pid_m, pid_n = _tile(tile, T, N, BLOCK_M, BLOCK_N, GROUP_M)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    n_ok = rn < N
    blk = (pid_m * BLOCK_M) // V
    c_ptrs = c_ptr + rm[:, None].to(tl.int64) * stride_c + rk[None, :]
    id_ptrs = ids_ptr + blk.to(tl.int64) * stride_ids + rk
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, KC, BLOCK_K):
        k_ok = rk < KC - k0
        if USE_TMA:  # c through its TMA descriptor (zero-filled past KC)
            a = a_desc.load([pid_m * BLOCK_M, k0])
        else:
            a = tl.load(c_ptrs, mask=k_ok[None, :], other=0.0)
        if RUN % BLOCK_K == 0:  # one run's slab (KC is a multiple of RUN: no tail); zero-filled past N
            id0 = tl.load(ids_ptr + blk.to(tl.int64) * stride_ids + k0)
            if B_T:
                b = tl.trans(b_desc.load([pid_n * BLOCK_N, id0]))
            else:
                b = b_desc.load([id0, pid_n * BLOCK_N])
        else:
            idx = tl.load(id_ptrs, mask=k_ok, other=0)
            if CHUNK > 1:  # ids in aligned runs of CHUNK consecutive units: vector loads along them
                idx = tl.max_contiguous(tl.multiple_of(idx, CHUNK), CHUNK)
            if B_T:  # gathered columns of b^T [N, F]: [BLOCK_K, BLOCK_N], contiguous along K in each run
                if B_I32:
                    b_ptrs = b_ptr + (idx[:, None] + rn[None, :] * stride_b)
                else:
                    b_ptrs = b_ptr + idx[:, None].to(tl.int64) + rn[None, :].to(tl.int64) * stride_b
            elif B_I32:  # row offsets fit in int32: a shorter address chain per gathered row
                b_ptrs = b_ptr + (idx[:, None] * stride_b + rn[None, :])  # gathered rows [BLOCK_K, BLOCK_N]
            else:
                b_ptrs = b_ptr + idx[:, None].to(tl.int64) * stride_b + rn[None, :]
            b = tl.load(b_ptrs, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
        if IEEE:
            acc = tl.dot(a, b, acc, input_precision="ieee")
        else:
            acc = tl.dot(a, b, acc)
        c_ptrs += BLOCK_K
        id_ptrs += BLOCK_K
    if HAS_BIAS:
        acc += tl.load(bias_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    out = out_ptr + rm[:, None].to(tl.int64) * stride_out + rn[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=n_ok[None, :])


@triton.autotune(
    configs=_configs(_GATHER_K_TILES),
    key=["N", "KC", "V", "USE_TMA", "B_I32", "B_T", "CHUNK", "RUN"],
    prune_configs_by={"early_config_prune": _prune},
)
@triton.jit
def _gather_k_kernel(
    c_ptr, a_desc, ids_ptr, b_ptr, b_desc, bias_ptr, out_ptr,
    T, N, KC, V, stride_c, stride_ids, stride_b, stride_out,
    HAS_BIAS: tl.constexpr, IEEE: tl.constexpr, USE_TMA: tl.constexpr, B_I32: tl.constexpr,
    B_T: tl.constexpr, CHUNK: tl.constexpr, RUN: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):  # fmt: skip
    # Not persistent: in a flattened persistent loop (tl.range(..., flatten=True)) Triton 3.6 does
    # not pipeline the gathered rows (their addresses come from the ids load: plain synchronous
    # loads in the sm90 TTGIR), which is several times slower.
    _gather_k_tile(
        tl.program_id(0), c_ptr, a_desc, ids_ptr, b_ptr, b_desc, bias_ptr, out_ptr,
        T, N, KC, V, stride_c, stride_ids, stride_b, stride_out,
        HAS_BIAS, IEEE, USE_TMA, B_I32, B_T, CHUNK, RUN, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M,
    )  # fmt: skip


@triton.jit
def _gather_n_tile(
    tile, a_ptr, a_desc, bt_ptr, b_desc, ids_ptr, r_ptr, out_ptr, sums_ptr, sq_ptr, bias_ptr,
    T, KC, K, V, stride_a, stride_bt, stride_ids, stride_r, stride_out,
    HAS_R: tl.constexpr, IEEE: tl.constexpr, USE_TMA: tl.constexpr, B_T: tl.constexpr, CHUNK: tl.constexpr,
    RUN: tl.constexpr, SUMS: tl.constexpr, SQ: tl.constexpr, ACT: tl.constexpr, HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):  # fmt: skip
    """One [BLOCK_M, BLOCK_N] output tile of gather_n_mm. B_T: bt is stored transposed (element
    (f, k) at f + k * stride_bt), its gathered rows contiguous only along runs of CHUNK ids. RUN > 1
    with BLOCK_N dividing it: the tile's BLOCK_N ids are one run's consecutive units id0.., so each
    K step's bt tile is the slab at row id0 of b_desc (B_T: column id0 of bt^T), one bulk copy. SUMS:
    sums [T/BLOCK_M, KC] float32 gets this tile's column sums of the stored (rounded) values.
    ACT: the activation epilogue, out = relu(round(acc + bias[ids])) (HAS_BIAS: with bias), and
    with SQ, sq = round(out^2)."""
    pid_m, pid_n = _tile(tile, T, KC, BLOCK_M, BLOCK_N, GROUP_M)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # compact columns
    rk = tl.arange(0, BLOCK_K)
    n_ok = rn < KC
    blk = (pid_m * BLOCK_M) // V
    idx = tl.load(ids_ptr + blk.to(tl.int64) * stride_ids + rn, mask=n_ok, other=0)
    if CHUNK > 1:  # ids in aligned runs of CHUNK consecutive units: vector loads along them
        idx = tl.max_contiguous(tl.multiple_of(idx, CHUNK), CHUNK)
    a_ptrs = a_ptr + rm[:, None].to(tl.int64) * stride_a + rk[None, :]
    if B_T:  # [BLOCK_K, BLOCK_N] of bt^T [K, F], contiguous along N in each run
        b_ptrs = bt_ptr + idx[None, :].to(tl.int64) + rk[:, None].to(tl.int64) * stride_bt
        b_step = BLOCK_K * stride_bt
    else:
        b_ptrs = bt_ptr + idx[None, :].to(tl.int64) * stride_bt + rk[:, None]  # [BLOCK_K, BLOCK_N]
        b_step = BLOCK_K
    id0 = 0
    if RUN % BLOCK_N == 0:  # the tile's run's first unit
        id0 = tl.load(ids_ptr + blk.to(tl.int64) * stride_ids + pid_n * BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_ok = rk < K - k0
        if USE_TMA:  # dY through its TMA descriptor (zero-filled past K)
            a = a_desc.load([pid_m * BLOCK_M, k0])
        else:
            a = tl.load(a_ptrs, mask=k_ok[None, :], other=0.0)
        if RUN % BLOCK_N == 0:  # one run's slab (KC is a multiple of RUN: no tail); zero-filled past K
            if B_T:
                b = b_desc.load([k0, id0])
            else:
                b = tl.trans(b_desc.load([id0, k0]))
        else:
            b = tl.load(b_ptrs, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
        if IEEE:
            acc = tl.dot(a, b, acc, input_precision="ieee")
        else:
            acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K
        b_ptrs += b_step
    dtype = out_ptr.dtype.element_ty
    # The epilogue addresses its columns as (scalar pid_n * BLOCK_N) + arange, not through rn: with
    # B_T the pipeliner carries the rn tensor across the persistent loop, which loses its contiguity
    # and left these loads and stores scalar (sm90 PTX, Triton 3.6)
    col0 = pid_n * BLOCK_N
    cols = tl.arange(0, BLOCK_N)
    c_ok = (cols < KC - col0)[None, :]
    if HAS_R:  # dZ = round(dH) * 2 relu(Z), as the reference rounds dH = dY W2 before the product
        r = tl.load(r_ptr + col0 + rm[:, None].to(tl.int64) * stride_r + cols[None, :], mask=c_ok, other=0.0)
        acc = acc.to(dtype).to(tl.float32) * (2.0 * r.to(tl.float32))
        if SQ:  # H~ = R~^2 rounded once, as the scatter and chunk_wgrad(square=True) round it
            sq = (r.to(tl.float32) * r.to(tl.float32)).to(dtype)
            tl.store(sq_ptr + col0 + rm[:, None].to(tl.int64) * stride_out + cols[None, :], sq, mask=c_ok)
    if ACT:  # R~ = relu(Z) with Z = round(X W1[ids]^T + b1[ids]), as F.linear rounds Z; H~ = round(R~^2)
        if HAS_BIAS:
            units = tl.load(ids_ptr + blk.to(tl.int64) * stride_ids + col0 + cols, mask=cols < KC - col0, other=0)
            if CHUNK > 1:  # runs of CHUNK consecutive units: the bias in vector loads
                units = tl.max_contiguous(tl.multiple_of(units, CHUNK), CHUNK)
            acc += tl.load(bias_ptr + units).to(tl.float32)[None, :]
        acc = tl.maximum(acc.to(dtype).to(tl.float32), 0.0)  # exact: relu of a rounded value
        if SQ:
            tl.store(
                sq_ptr + col0 + rm[:, None].to(tl.int64) * stride_out + cols[None, :], (acc * acc).to(dtype), mask=c_ok
            )
    val = acc.to(dtype)
    if SUMS:  # every row of the tile is in range: BLOCK_M divides V, V divides T
        s = tl.sum(val.to(tl.float32), axis=0)
        tl.store(sums_ptr + pid_m.to(tl.int64) * KC + col0 + cols, s, mask=cols < KC - col0)
    out = out_ptr + col0 + rm[:, None].to(tl.int64) * stride_out + cols[None, :]
    tl.store(out, val, mask=c_ok)


@triton.autotune(
    configs=_configs(_TILES),
    key=["KC", "K", "V", "USE_TMA", "PERSISTENT", "B_T", "CHUNK", "RUN", "SUMS", "SQ", "ACT", "HAS_BIAS"],
    prune_configs_by={"early_config_prune": _prune},
)
@triton.jit
def _gather_n_kernel(
    a_ptr, a_desc, bt_ptr, b_desc, ids_ptr, r_ptr, out_ptr, sums_ptr, sq_ptr, bias_ptr,
    T, KC, K, V, stride_a, stride_bt, stride_ids, stride_r, stride_out,
    HAS_R: tl.constexpr, IEEE: tl.constexpr, USE_TMA: tl.constexpr, PERSISTENT: tl.constexpr,
    B_T: tl.constexpr, CHUNK: tl.constexpr, RUN: tl.constexpr, SUMS: tl.constexpr, SQ: tl.constexpr,
    ACT: tl.constexpr, HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):  # fmt: skip
    if PERSISTENT:
        tiles = tl.cdiv(T, BLOCK_M) * tl.cdiv(KC, BLOCK_N)
        for tile in tl.range(tl.program_id(0), tiles, tl.num_programs(0), flatten=True):
            _gather_n_tile(
                tile, a_ptr, a_desc, bt_ptr, b_desc, ids_ptr, r_ptr, out_ptr, sums_ptr, sq_ptr, bias_ptr,
                T, KC, K, V, stride_a, stride_bt, stride_ids, stride_r, stride_out,
                HAS_R, IEEE, USE_TMA, B_T, CHUNK, RUN, SUMS, SQ, ACT, HAS_BIAS, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M,
            )  # fmt: skip
    else:
        _gather_n_tile(
            tl.program_id(0), a_ptr, a_desc, bt_ptr, b_desc, ids_ptr, r_ptr, out_ptr, sums_ptr, sq_ptr, bias_ptr,
            T, KC, K, V, stride_a, stride_bt, stride_ids, stride_r, stride_out,
            HAS_R, IEEE, USE_TMA, B_T, CHUNK, RUN, SUMS, SQ, ACT, HAS_BIAS, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M,
        )  # fmt: skip


# their tuning choices, kept on disk per machine (kernels/tune_cache.py)
_K_STORE = TuneStore(_gather_k_kernel)
_N_STORE = TuneStore(_gather_n_kernel)
_GATHER_K = FastLaunch(_gather_k_kernel)
_GATHER_N = FastLaunch(_gather_n_kernel)


def _check(name: str, v: int, gathered: str, chunk: int, **tensors: torch.Tensor) -> bool:
    """Validates the operands; returns whether the ``gathered`` one is stored transposed (allowed
    with chunk > 1 only: its rows are then contiguous only along the runs of chunk ids)."""
    dtypes = {t.dtype for t in tensors.values() if t.is_floating_point()}
    if len(dtypes) != 1 or next(iter(dtypes)) not in _DTYPES:
        raise ValueError(f"{name}: operands must share one dtype of {_DTYPES}; got {sorted(map(str, dtypes))}")
    if not isinstance(chunk, int) or chunk < 1 or chunk & (chunk - 1):
        raise ValueError(f"{name}: chunk={chunk}; expected a power of two >= 1")
    transposed = False
    for key, t in tensors.items():
        if key == gathered and t.dim() == 2 and t.stride(-1) != 1 and t.stride(0) == 1 and chunk > 1:
            transposed = True
        elif t.dim() != 2 or t.stride(-1) != 1:
            allowed = "contiguous rows" + (" or columns" if key == gathered and chunk > 1 else "")
            got = f"shape {tuple(t.shape)}, stride {t.stride()}"
            raise ValueError(f"{name}: {key} must be 2-D with {allowed}; got {got}")
    ids = tensors["ids"]
    if ids.dtype != torch.int32:
        raise ValueError(f"{name}: ids.dtype={ids.dtype}; expected torch.int32")
    if not isinstance(v, int) or v < 16 or v % 16:
        raise ValueError(f"{name}: V={v}; the gather kernels need V a multiple of 16")
    if ids.shape[1] % chunk:
        raise ValueError(f"{name}: {ids.shape[1]} ids per block is not a multiple of chunk={chunk}")
    return transposed


def gather_k_mm(
    c: torch.Tensor,
    ids: torch.Tensor,
    b: torch.Tensor,
    v: int,
    bias: torch.Tensor | None = None,
    tma: bool | None = None,
    chunk: int = 1,
) -> torch.Tensor:
    """[T, N] = per block of V rows, c[block] @ b[ids[block]] (+ bias [N]). c [T, Kc], ids [T/V, Kc], b [F, N].

    ``tma``: load c through a TMA descriptor (None: see tma_for); with ``chunk`` >= 16 also b where
    aligned (configs whose BLOCK_K divides chunk copy each run's slab whole). ``chunk`` > 1: every
    block's ids are aligned runs of ``chunk`` consecutive units (neuron chunks, at multiples of
    chunk); then b may be a transposed view (W2^T as ``w2.t()``: no copy), read in vectors along the runs."""
    b_t = _check("gather_k_mm", v, "b", chunk, c=c, ids=ids, b=b)
    t, kc = c.shape
    if t % v or ids.shape != (t // v, kc):
        raise ValueError(f"gather_k_mm: c {tuple(c.shape)} and ids {tuple(ids.shape)} do not match V={v}")
    n = b.shape[1]
    if bias is not None and (bias.shape != (n,) or bias.dtype != c.dtype or not bias.is_contiguous()):
        raise ValueError(f"gather_k_mm: bias must be contiguous [{n}] of {c.dtype}; got {tuple(bias.shape)}")
    out = torch.empty(t, n, device=c.device, dtype=c.dtype)

    use_tma = tma_for(c, tma)
    b_desc, run = _run_operand(b, b_t, use_tma, chunk)
    _K_STORE.load(c.device)
    _GATHER_K[_grid(t, n, c.device, persistent=False)](
        c, _a_operand(c, use_tma), ids, b, b_desc, bias if bias is not None else b, out,
        t, n, kc, v, c.stride(0), ids.stride(0), b.stride(1) if b_t else b.stride(0), out.stride(0),
        HAS_BIAS=bias is not None, IEEE=c.dtype == torch.float32, USE_TMA=use_tma, B_I32=_i32_rows(b),
        B_T=b_t, CHUNK=min(chunk, _MIN_ID_TILE), RUN=run,
    )  # fmt: skip
    _K_STORE.save(c.device)
    return out


def gather_n_mm(
    a: torch.Tensor,
    bt: torch.Tensor,
    ids: torch.Tensor,
    v: int,
    r: torch.Tensor | None = None,
    tma: bool | None = None,
    persistent: bool | None = None,
    chunk: int = 1,
    tile_sums: bool = False,
    square_out: torch.Tensor | None = None,
    act: bool = False,
    bias: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """[T, Kc] = per block of V rows, a[block] @ bt[ids[block]]^T; with r [T, Kc]: round, then * 2 r.

    a [T, K], bt [F, K], ids [T/V, Kc]. ``tma``: load a through a TMA descriptor (None: see
    tma_for); with ``chunk`` >= 16 also bt, as in gather_k_mm (configs whose BLOCK_N divides chunk).
    ``persistent``: one program per SM walking the tiles (None: PERSISTENT_DEFAULT on CUDA).
    ``chunk``: as in gather_k_mm (bt may then be a transposed view: W2^T as ``w2.t()``).
    ``tile_sums``: also return the float32 column sums of the output over each tile of R rows,
    [T/R, Kc] (R = the tuned BLOCK_M, a divisor of V; row i sums output rows [i R, (i+1) R)), from
    the epilogue: db1's per-block sums without another read of the output.
    ``square_out`` [T, Kc] (contiguous, a's dtype; needs r or act): the epilogue also writes
    round(r * r) into it, H~ for B2, from the r it loads anyway (one more [T, Kc] write, no read).
    ``act`` (no r, no tile_sums): the activation epilogue, relu(round(product + bias[ids])) with
    ``bias`` [F] (or None) gathered by the ids: R~ of F1 on the kept chunks (X, W1), and with
    square_out, H~ = round(R~^2).
    """
    tensors = {"a": a, "bt": bt, "ids": ids} | ({"r": r} if r is not None else {})
    if act and (r is not None or tile_sums):
        raise ValueError("gather_n_mm: act=True (the activation epilogue) takes no r and no tile_sums")
    if bias is not None and (
        not act or bias.shape != (bt.shape[0],) or bias.dtype != a.dtype or not bias.is_contiguous()
    ):
        raise ValueError(
            f"gather_n_mm: bias {tuple(bias.shape)} {bias.dtype} needs act=True and a contiguous [{bt.shape[0]}] "
            f"tensor of {a.dtype} (act={act})"
        )
    bt_t = _check("gather_n_mm", v, "bt", chunk, **tensors)
    t, k = a.shape
    kc = ids.shape[1]
    if t % v or ids.shape[0] != t // v or bt.shape[1] != k or (r is not None and r.shape != (t, kc)):
        raise ValueError(
            f"gather_n_mm: shapes do not match V={v}: a {tuple(a.shape)}, bt {tuple(bt.shape)}, ids {tuple(ids.shape)}"
        )
    if square_out is not None and (
        (r is None and not act)
        or square_out.shape != (t, kc)
        or square_out.dtype != a.dtype
        or not square_out.is_contiguous()
    ):
        got = f"{tuple(square_out.shape)} {square_out.dtype}, r {'given' if r is not None else 'None'}, act={act}"
        raise ValueError(
            f"gather_n_mm: square_out must be contiguous [{t}, {kc}] of {a.dtype} with r given or act; got {got}"
        )
    out = torch.empty(t, kc, device=a.device, dtype=a.dtype)
    # rows for the narrowest row tile of any config; the tuned one fills the first T/BLOCK_M
    sums = torch.empty(t // _MIN_BLOCK_M, kc, device=a.device, dtype=torch.float32) if tile_sums else out

    use_tma = tma_for(a, tma)
    b_desc, run = _run_operand(bt, bt_t, use_tma, chunk)
    persist = _persistent(a, persistent)
    _N_STORE.load(a.device)
    _GATHER_N[_grid(t, kc, a.device, persist)](
        a, _a_operand(a, use_tma), bt, b_desc, ids, r if r is not None else a, out, sums,
        square_out if square_out is not None else out, bias if bias is not None else out,
        t, kc, k, v, a.stride(0), bt.stride(1) if bt_t else bt.stride(0), ids.stride(0),
        r.stride(0) if r is not None else 0, out.stride(0),
        HAS_R=r is not None, IEEE=a.dtype == torch.float32, USE_TMA=use_tma, PERSISTENT=persist,
        B_T=bt_t, CHUNK=min(chunk, _MIN_ID_TILE), RUN=run, SUMS=tile_sums, SQ=square_out is not None,
        ACT=act, HAS_BIAS=bias is not None,
    )  # fmt: skip
    _N_STORE.save(a.device)
    if not tile_sums:
        return out
    return out, sums[: t // _gather_n_kernel.best_config.kwargs["BLOCK_M"]]
