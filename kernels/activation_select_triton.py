"""Fused squared-ReLU V:N:M selection in Triton: Z -> compact H~, compact relu(Z), column ids.

One program owns one block of V tokens x BLOCK_G groups of M hidden units, in two passes over
its rows (ROWS at a time):
  1. read Z, R = relu(Z + b), H = R^2 (each rounded to Z's dtype, as the reference does), and
     sum the column L1 norms of H over the V tokens (float32); keep the 4 columns of largest norm
     per M-group (rank = #larger + #equal at a lower index): 4 column ids c_0 < c_1 < c_2 < c_3;
  2. read only the kept columns of Z again (a gather at the ids just found, straight into the
     compact layout; from L2 when the tile is still there, see EVICT_DEFAULT), keep per row the N
     largest of each group's 4 (ties to the lower column), and store [ROWS, 4*BLOCK_G] row
     segments of h_c and r_c.
Bytes per call: read T*F (+F bias), write 2 * T*F*4/M values + (T/V)*F*4/M int32 ids. At M=8,
2 + 2 bytes per element of Z in bf16: the kernel should run at copy speed.
The one-read kernel (_vnm_select_onchip_kernel) loads the whole [V, BLOCK_G*M] tile once, keeps it
in registers, and takes the kept columns from it with tl.gather instead of reading them again;
where that measured faster (ONCHIP_DEFAULT: 128:x:8, 128:x:16, 64:x:8) it is the default.
Same answer as kernels/activation_mask.py:vnm_compact_ref (ties included; column norms are
summed in a different order, so only norms equal to within rounding can pick differently).
"""

import torch
import triton
import triton.language as tl

from sparse_compile.kernels.activation_mask import _check

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
# Pass 2 re-reads the tile pass 1 just read; with ~9 programs of 64 KB tiles per SM the tiles in
# flight exceed L2 and the re-read goes to DRAM. L2 eviction hints on the two reads keep the tile
# for the re-read (same output; never slower in the tilings swept).
EVICT_DEFAULT = True
# (V, M) -> groups per program of the one-read kernel where it is the default (faster than the
# two-read kernel there), 4 warps
ONCHIP_DEFAULT = {(128, 8): 8, (128, 16): 4, (64, 8): 16}


@triton.jit
def _four(a, b, c, d):
    """Four [ROWS, G] tensors -> [ROWS, 4*G] interleaved: a0 b0 c0 d0 a1 b1 ..."""
    x = tl.join(tl.join(a, c), tl.join(b, d))  # [ROWS, G, 2, 2]: x[..., i, k] = (a, b, c, d)[2 i + k]
    return tl.reshape(x, (a.shape[0], a.shape[1] * 4))


@triton.jit
def _relu(z, bias, HAS_BIAS: tl.constexpr):
    """relu(Z + b) as float32, Z + b rounded to Z's dtype first, as the reference does."""
    zf = z.to(tl.float32)
    if HAS_BIAS:
        zf = zf + bias
    return tl.maximum(zf.to(z.dtype).to(tl.float32), 0.0)


@triton.jit
def _chosen(norms, j, col_ok):
    """Which columns are among the 4 of largest norm per group ([BLOCK_G, M_P] bool) and each chosen
    column's place among them (0..3, ascending column); a column is "behind" each larger or
    equal-and-left one. norms [BLOCK_G, M_P], j = arange(M_P)."""
    left = j[None, None, :] < j[None, :, None]  # [1, M_P(this), M_P(other)]: other is left of this
    a = norms[:, :, None]
    b = norms[:, None, :]
    chosen = (tl.sum(((b > a) | ((b == a) & left)).to(tl.int32), axis=2) < 4) & col_ok
    pos = tl.sum((chosen[:, None, :] & left).to(tl.int32), axis=2)
    return chosen, pos


@triton.jit
def _top4(norms, j, col_ok):
    """The 4 columns of largest norm per group, ascending, flat [4 * BLOCK_G]: c0 c1 c2 c3 of group 0,
    then of group 1, ... (within-group indices)."""
    chosen, pos = _chosen(norms, j, col_ok)
    c0 = tl.sum(tl.where(chosen & (pos == 0), j[None, :], 0), axis=1)
    c1 = tl.sum(tl.where(chosen & (pos == 1), j[None, :], 0), axis=1)
    c2 = tl.sum(tl.where(chosen & (pos == 2), j[None, :], 0), axis=1)
    c3 = tl.sum(tl.where(chosen & (pos == 3), j[None, :], 0), axis=1)
    return tl.reshape(_four(c0[None, :], c1[None, :], c2[None, :], c3[None, :]), (4 * norms.shape[0],))


@triton.jit
def _top4_groups(norms, j):
    """The same 4 columns as [BLOCK_G, 4] (M a power of two, no padding)."""
    chosen, pos = _chosen(norms, j, (j < norms.shape[1])[None, :])
    hit = chosen[:, :, None] & (pos[:, :, None] == tl.arange(0, 4)[None, None, :])  # [BLOCK_G, M, 4]
    return tl.sum(tl.where(hit, j[None, :, None], 0), axis=1)


def _sqrelu_ptx(kind: str, bias: bool) -> tl.constexpr:
    """PTX for relu($1 + $2)^2 on a register of two packed 16-bit values (``kind`` bf16x2 or f16x2;
    without ``bias``, relu($1)^2): fma.rn(z, 1, b), max(., 0), fma.rn(r, r, -0), each rounded once."""
    one = {"bf16x2": "0x3F803F80", "f16x2": "0x3C003C00"}[kind]
    relu = f"fma.rn.{kind} t, $1, one, $2; max.{kind} t, t, zero; " if bias else f"max.{kind} t, $1, zero; "
    return tl.constexpr(
        f"{{ .reg .b32 one, zero, nzero, t; mov.b32 one, {one}; mov.b32 zero, 0; mov.b32 nzero, 0x80008000; "
        f"{relu}fma.rn.{kind} $0, t, t, nzero; }}"
    )


_PTX_BF16, _PTX_BF16_BIAS = _sqrelu_ptx("bf16x2", False), _sqrelu_ptx("bf16x2", True)
_PTX_F16, _PTX_F16_BIAS = _sqrelu_ptx("f16x2", False), _sqrelu_ptx("f16x2", True)


@triton.jit
def _sqrelu16(z, b, HAS_BIAS: tl.constexpr):
    """relu(z + b)^2 in z's 16-bit dtype, two elements per PTX instruction (sm80+, _sqrelu_ptx). Each
    step rounds once to the 16-bit type, which gives the same bits as _relu's float32 arithmetic
    rounded to it (float32 has at least 2p + 2 bits for p = 8 and 11).
    b: the bias broadcast to z's shape (unused without HAS_BIAS)."""
    if z.dtype == tl.bfloat16:
        if HAS_BIAS:
            h = tl.inline_asm_elementwise(_PTX_BF16_BIAS, "=r,r,r", [z, b], tl.bfloat16, is_pure=True, pack=2)
        else:
            h = tl.inline_asm_elementwise(_PTX_BF16, "=r,r", [z], tl.bfloat16, is_pure=True, pack=2)
    else:
        if HAS_BIAS:
            h = tl.inline_asm_elementwise(_PTX_F16_BIAS, "=r,r,r", [z, b], tl.float16, is_pure=True, pack=2)
        else:
            h = tl.inline_asm_elementwise(_PTX_F16, "=r,r", [z], tl.float16, is_pure=True, pack=2)
    return h


@triton.jit
def _keep_n(h, N: tl.constexpr):
    """[ROWS, 4 G] of each group's 4 kept-column values -> which the row keeps: its N largest
    (value descending, then column ascending)."""
    even, odd = tl.split(tl.reshape(h, (h.shape[0], h.shape[1] // 4, 2, 2)))
    h0, h2 = tl.split(even)
    h1, h3 = tl.split(odd)
    k0 = ((h1 > h0).to(tl.int32) + (h2 > h0).to(tl.int32) + (h3 > h0).to(tl.int32)) < N
    k1 = ((h0 >= h1).to(tl.int32) + (h2 > h1).to(tl.int32) + (h3 > h1).to(tl.int32)) < N
    k2 = ((h0 >= h2).to(tl.int32) + (h1 >= h2).to(tl.int32) + (h3 > h2).to(tl.int32)) < N
    k3 = ((h0 >= h3).to(tl.int32) + (h1 >= h3).to(tl.int32) + (h2 >= h3).to(tl.int32)) < N
    return _four(k0, k1, k2, k3)


@triton.jit
def _zero_all_but_n(h, r, N: tl.constexpr):
    """h, r [ROWS, 4 G] of each group's 4 kept-column values -> both with everything but each row's
    N largest h per group (_keep_n) set to 0."""
    if N < 4:
        keep = _keep_n(h, N)
        h = tl.where(keep, h, 0.0)
        r = tl.where(keep, r, 0.0)
    return h, r


@triton.jit
def _vnm_select_kernel(
    z_ptr, b_ptr, hc_ptr, rc_ptr, ids_ptr,
    G, stride_z, stride_c, stride_ids,
    V: tl.constexpr, N: tl.constexpr, M: tl.constexpr, M_P: tl.constexpr,
    ROWS: tl.constexpr, BLOCK_G: tl.constexpr, HAS_BIAS: tl.constexpr, ABS: tl.constexpr,
    KEEP: tl.constexpr, DROP: tl.constexpr, CAUSAL: tl.constexpr, SEQ_BLOCKS,
):  # fmt: skip
    """ABS: score |Z| instead of relu(Z + b)^2 and keep the signed Z (hc_ptr only; vnm_select_abs).
    KEEP / DROP: cache eviction policies of the first and the second read of the tile.
    CAUSAL: pass 1 scores the previous block of the sequence (SEQ_BLOCKS blocks per sequence), or
    the block's first row in a sequence's first block."""
    tb = tl.program_id(0)  # token block
    if CAUSAL:
        starts = tb % SEQ_BLOCKS == 0
        src = tl.where(starts, tb, tb - 1)  # the block pass 1 scores
        scored = tl.where(starts, 1, V)  # its rows that count
    else:
        src = tb
        scored = V
    g0 = tl.program_id(1) * BLOCK_G  # first M-group of this program
    grp = g0 + tl.arange(0, BLOCK_G)
    j = tl.arange(0, M_P)
    r_idx = tl.arange(0, ROWS)
    col_ok = (grp < G)[:, None] & (j[None, :] < M)  # [BLOCK_G, M_P]
    cols = grp[:, None] * M + j[None, :]  # absolute hidden column
    dtype = hc_ptr.dtype.element_ty
    if HAS_BIAS:
        bias = tl.load(b_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :, :]
    else:
        bias = 0.0

    # pass 1: H summed over the block's V tokens, elementwise per row slot (one cross-thread
    # reduction at the end, not one per step)
    acc = tl.zeros((ROWS, BLOCK_G, M_P), dtype=tl.float32)
    for r0 in range(0, V, ROWS):
        rows = src * V + r0 + r_idx
        ok = ((r0 + r_idx) < scored)[:, None, None] & col_ok[None, :, :]
        ptrs = z_ptr + rows[:, None, None].to(tl.int64) * stride_z + cols[None, :, :]
        z = tl.load(ptrs, mask=ok, other=0.0, eviction_policy=KEEP)
        if ABS:
            acc += tl.abs(z.to(tl.float32))  # masked elements load as 0
        else:
            r = _relu(z, bias, HAS_BIAS)
            acc += tl.where(ok, (r * r).to(dtype).to(tl.float32), 0.0)
    norms = tl.sum(acc, axis=0)

    norms = tl.where(col_ok, norms, float("-inf"))
    local = _top4(norms, j, col_ok)
    out = g0 * 4 + tl.arange(0, 4 * BLOCK_G)  # compact columns of this program
    out_ok = out < G * 4
    ids = local + (out // 4) * M
    tl.store(ids_ptr + tb.to(tl.int64) * stride_ids + out, ids.to(tl.int32), mask=out_ok)

    # pass 2: read only the kept columns (the tile was just read), already in the compact
    # layout; per row keep the N largest H of each group's 4 (value descending, then column
    # ascending) and store contiguous [ROWS, 4*BLOCK_G] row segments of h_c and r_c
    if HAS_BIAS:
        bias_c = tl.load(b_ptr + ids, mask=out_ok, other=0.0).to(tl.float32)[None, :]
    else:
        bias_c = 0.0
    for r0 in range(0, V, ROWS):
        rows = tb * V + r0 + r_idx
        ok = ((r0 + r_idx) < V)[:, None] & out_ok[None, :]
        ptrs = z_ptr + rows[:, None].to(tl.int64) * stride_z + ids[None, :]
        z = tl.load(ptrs, mask=ok, other=0.0, eviction_policy=DROP)
        if ABS:  # r: the kept value, h: its score
            r = z.to(tl.float32)
            h = tl.abs(r)
        else:
            r = _relu(z, bias_c, HAS_BIAS)
            h = (r * r).to(dtype).to(tl.float32)
        h, r = _zero_all_but_n(h, r, N)
        dst = rows[:, None].to(tl.int64) * stride_c + out[None, :]
        if ABS:
            tl.store(hc_ptr + dst, r.to(dtype), mask=ok)
        else:
            tl.store(hc_ptr + dst, h.to(dtype), mask=ok)
            tl.store(rc_ptr + dst, r.to(dtype), mask=ok)


@triton.jit
def _vnm_select_onchip_kernel(
    z_ptr, b_ptr, hc_ptr, rc_ptr, ids_ptr,
    G, stride_z, stride_c, stride_ids,
    V: tl.constexpr, N: tl.constexpr, M: tl.constexpr, BLOCK_G: tl.constexpr, HAS_BIAS: tl.constexpr,
    ASM: tl.constexpr,
):  # fmt: skip
    """The same selection with Z read once: the whole [V, BLOCK_G * M] tile is held on chip and the
    kept columns are taken from it with tl.gather along M of its [V, BLOCK_G, M] view (no second
    read). M a power of two, G % BLOCK_G == 0. ASM: relu^2 for the norms in packed 16-bit PTX
    (_sqrelu16; CUDA, bf16/fp16), else in float32 as the two-read kernel does (same bits)."""
    tb = tl.program_id(0)
    g0 = tl.program_id(1) * BLOCK_G
    C: tl.constexpr = BLOCK_G * M
    rows = tb * V + tl.arange(0, V)
    cols = g0 * M + tl.arange(0, C)
    dtype = hc_ptr.dtype.element_ty
    z = tl.load(z_ptr + rows[:, None].to(tl.int64) * stride_z + cols[None, :])
    if ASM:
        bias = tl.broadcast_to(tl.load(b_ptr + cols)[None, :], (V, C)) if HAS_BIAS else z
        h = _sqrelu16(z, bias, HAS_BIAS).to(tl.float32)
    else:
        bias = tl.load(b_ptr + cols).to(tl.float32)[None, :] if HAS_BIAS else 0.0
        r = _relu(z, bias, HAS_BIAS)
        h = (r * r).to(dtype).to(tl.float32)
    kept = _top4_groups(tl.reshape(tl.sum(h, axis=0), (BLOCK_G, M)), tl.arange(0, M))  # [BLOCK_G, 4]
    local = tl.reshape(kept + (tl.arange(0, BLOCK_G) * M)[:, None], (4 * BLOCK_G,))  # column within the tile
    out = g0 * 4 + tl.arange(0, 4 * BLOCK_G)
    tl.store(ids_ptr + tb.to(tl.int64) * stride_ids + out, (local + g0 * M).to(tl.int32))

    # gathering along M (16 or 8 candidates) rather than along the whole tile row: fewer layout
    # conversions
    index = tl.broadcast_to(kept[None, :, :], (V, BLOCK_G, 4))
    z_k = tl.reshape(tl.gather(tl.reshape(z, (V, BLOCK_G, M)), index, axis=2), (V, 4 * BLOCK_G))
    bias_k = tl.load(b_ptr + g0 * M + local).to(tl.float32)[None, :] if HAS_BIAS else 0.0
    r = _relu(z_k, bias_k, HAS_BIAS)
    h = (r * r).to(dtype).to(tl.float32)
    h, r = _zero_all_but_n(h, r, N)
    dst = rows[:, None].to(tl.int64) * stride_c + out[None, :]
    tl.store(hc_ptr + dst, h.to(dtype))
    tl.store(rc_ptr + dst, r.to(dtype))


def vnm_select_compact(
    z: torch.Tensor,
    bias: torch.Tensor | None,
    v: int,
    n: int,
    m: int,
    block_g: int | None = None,
    rows: int | None = None,
    num_warps: int = 4,
    evict: bool = EVICT_DEFAULT,
    onchip: bool | None = None,
    seq: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Triton version of ``vnm_compact_ref(z, bias, v, n, m, seq=seq)``: (h_c, r_c, ids), same shapes
    and dtypes; ``seq``: the causal pattern over sequences of that many tokens (two-read kernel).

    Tiling (powers of two; the defaults are what bench/select_kernel.py measured): ``block_g`` M-groups
    per program, ``rows`` token rows per step of each pass, ``num_warps``. ``evict``: the first read
    of Z asks L2 to keep it (evict_last) for the second, which releases it (evict_first).
    ``onchip``: the one-read kernel (the whole V-row tile held on chip, kept columns by tl.gather;
    ``rows`` unused), for power-of-two V and M with ``block_g`` dividing F/M; None: where it measured
    faster (ONCHIP_DEFAULT, with its tiling, when neither ``block_g`` nor ``rows`` is given).
    """
    return _select("vnm_select_compact", z, bias, v, n, m, block_g, rows, num_warps, False, evict, onchip, seq)


def vnm_select_abs(x: torch.Tensor, v: int, n: int, m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton version of ``vnm_compact_abs_ref(x, v, n, m)``: the compact V:N:M form of x [R, C]
    scored by |x| (blocks of V rows x M columns): (x_c [R, C*4/M] signed, ids int32 [R/V, C*4/M])."""
    x_c, _, ids = _select("vnm_select_abs", x, None, v, n, m, None, None, 4, abs_score=True)
    return x_c, ids


def _select(name, z, bias, v, n, m, block_g, rows, num_warps, abs_score, evict=EVICT_DEFAULT, onchip=False, seq=None):
    """Check the inputs (errors name ``name``), pick the kernel and tiling, launch; (h_c, r_c, ids)."""
    if not isinstance(z, torch.Tensor) or z.dtype not in _DTYPES:
        raise ValueError(f"{name}: z.dtype={getattr(z, 'dtype', type(z))}; expected one of {_DTYPES}")
    _check(z, v, n, m, seq=seq)
    if seq is not None and onchip:
        raise ValueError(f"{name}(onchip=True): the one-read kernel has no causal variant (seq={seq})")
    if not z.is_contiguous():
        raise ValueError(f"{name}: z must be contiguous (row-major [T, F])")
    t, f = z.shape
    if bias is not None and (bias.shape != (f,) or bias.dtype != z.dtype or not bias.is_contiguous()):
        raise ValueError(f"{name}: bias must be contiguous [{f}] of {z.dtype}; got {tuple(bias.shape)} {bias.dtype}")
    kc = f * 4 // m
    h_c = torch.empty(t, kc, device=z.device, dtype=z.dtype)
    r_c = h_c if abs_score else torch.empty_like(h_c)
    ids = torch.empty(t // v, kc, device=z.device, dtype=torch.int32)
    if onchip is None:
        default_g = ONCHIP_DEFAULT.get((v, m), 0)
        onchip = default_g > 0 and (f // m) % default_g == 0 and block_g is None and rows is None and seq is None
        if onchip:
            block_g = default_g
    if onchip:
        block_g = block_g or ONCHIP_DEFAULT.get((v, m)) or max(1, 64 // m)
        if abs_score or v & (v - 1) or m & (m - 1) or (f // m) % block_g:
            raise ValueError(
                f"{name}(onchip=True): V={v} and M={m} must be powers of two and F/M={f // m} a multiple of "
                f"block_g={block_g} (and no ABS scoring)"
            )
        _vnm_select_onchip_kernel[(t // v, f // m // block_g)](
            z, bias if bias is not None else z, h_c, r_c, ids, f // m, z.stride(0), h_c.stride(0), ids.stride(0),
            V=v, N=n, M=m, BLOCK_G=block_g, HAS_BIAS=bias is not None, ASM=z.is_cuda and z.dtype != torch.float32,
            num_warps=num_warps,
        )  # fmt: skip
        return h_c, r_c, ids
    m_p = triton.next_power_of_2(m)
    # Defaults, the fastest of a sweep at 16384 x 16384 (bench/select_kernel.py): 64 hidden columns x
    # 16 rows per step for M=16, 256 columns x 8 rows for M<=8. V=1 (2:4) has one row per program: 256
    # columns.
    if block_g is None:
        block_g = max(1, min(triton.next_power_of_2(f // m), (256 if v == 1 or m_p <= 8 else 64) // m_p))
    if rows is None:
        rows = max(1, min(triton.next_power_of_2(v), 8 if m_p <= 8 else 16))
    grid = (t // v, triton.cdiv(f // m, block_g))
    _vnm_select_kernel[grid](
        z, bias if bias is not None else z, h_c, r_c, ids,
        f // m, z.stride(0), h_c.stride(0), ids.stride(0),
        V=v, N=n, M=m, M_P=m_p, ROWS=rows, BLOCK_G=block_g, HAS_BIAS=bias is not None, ABS=abs_score,
        KEEP="evict_last" if evict else "", DROP="evict_first" if evict else "", CAUSAL=seq is not None,
        SEQ_BLOCKS=(seq or v) // v, num_warps=num_warps,
    )  # fmt: skip
    return h_c, r_c, ids
