import triton
import triton.language as tl

from sparse_compile.kernels.activation_select_triton import _four, _keep_n, _relu


@triton.jit
def _cols4(norms, j):
    """top-4 column indices per group as four [G] tensors (ascending)."""
    left = j[None, None, :] < j[None, :, None]
    a = norms[:, :, None]
    b = norms[:, None, :]
    chosen = tl.sum(((b > a) | ((b == a) & left)).to(tl.int32), axis=2) < 4
    pos = tl.sum((chosen[:, None, :] & left).to(tl.int32), axis=2)
    c0 = tl.sum(tl.where(chosen & (pos == 0), j[None, :], 0), axis=1)
    c1 = tl.sum(tl.where(chosen & (pos == 1), j[None, :], 0), axis=1)
    c2 = tl.sum(tl.where(chosen & (pos == 2), j[None, :], 0), axis=1)
    c3 = tl.sum(tl.where(chosen & (pos == 3), j[None, :], 0), axis=1)
    return c0, c1, c2, c3


@triton.jit
def _take(z, c, g0, b_ptr, HAS_BIAS: tl.constexpr, V: tl.constexpr, BLOCK_G: tl.constexpr, M: tl.constexpr):
    col = c + tl.arange(0, BLOCK_G) * M
    zk = tl.gather(z, tl.broadcast_to(col[None, :], (V, BLOCK_G)), axis=1)
    bias = tl.load(b_ptr + g0 * M + col).to(tl.float32)[None, :] if HAS_BIAS else 0.0
    return _relu(zk, bias, HAS_BIAS), col


@triton.jit
def split_kernel(
    z_ptr, b_ptr, hc_ptr, rc_ptr, ids_ptr,
    G, stride_z, stride_c, stride_ids,
    V: tl.constexpr, N: tl.constexpr, M: tl.constexpr, BLOCK_G: tl.constexpr, HAS_BIAS: tl.constexpr,
):  # fmt: skip
    tb = tl.program_id(0)
    g0 = tl.program_id(1) * BLOCK_G
    C: tl.constexpr = BLOCK_G * M
    rows = tb * V + tl.arange(0, V)
    cols = g0 * M + tl.arange(0, C)
    dtype = hc_ptr.dtype.element_ty
    z = tl.load(z_ptr + rows[:, None].to(tl.int64) * stride_z + cols[None, :])
    bias = tl.load(b_ptr + cols).to(tl.float32)[None, :] if HAS_BIAS else 0.0
    r = _relu(z, bias, HAS_BIAS)
    norms = tl.reshape(tl.sum((r * r).to(dtype).to(tl.float32), axis=0), (BLOCK_G, M))
    c0, c1, c2, c3 = _cols4(norms, tl.arange(0, M))
    r0, i0 = _take(z, c0, g0, b_ptr, HAS_BIAS, V, BLOCK_G, M)
    r1, i1 = _take(z, c1, g0, b_ptr, HAS_BIAS, V, BLOCK_G, M)
    r2, i2 = _take(z, c2, g0, b_ptr, HAS_BIAS, V, BLOCK_G, M)
    r3, i3 = _take(z, c3, g0, b_ptr, HAS_BIAS, V, BLOCK_G, M)
    h0 = (r0 * r0).to(dtype).to(tl.float32)
    h1 = (r1 * r1).to(dtype).to(tl.float32)
    h2 = (r2 * r2).to(dtype).to(tl.float32)
    h3 = (r3 * r3).to(dtype).to(tl.float32)
    if N < 4:
        k0 = ((h1 > h0).to(tl.int32) + (h2 > h0).to(tl.int32) + (h3 > h0).to(tl.int32)) < N
        k1 = ((h0 >= h1).to(tl.int32) + (h2 > h1).to(tl.int32) + (h3 > h1).to(tl.int32)) < N
        k2 = ((h0 >= h2).to(tl.int32) + (h1 >= h2).to(tl.int32) + (h3 > h2).to(tl.int32)) < N
        k3 = ((h0 >= h3).to(tl.int32) + (h1 >= h3).to(tl.int32) + (h2 >= h3).to(tl.int32)) < N
        h0 = tl.where(k0, h0, 0.0)
        h1 = tl.where(k1, h1, 0.0)
        h2 = tl.where(k2, h2, 0.0)
        h3 = tl.where(k3, h3, 0.0)
        r0 = tl.where(k0, r0, 0.0)
        r1 = tl.where(k1, r1, 0.0)
        r2 = tl.where(k2, r2, 0.0)
        r3 = tl.where(k3, r3, 0.0)
    out = g0 * 4 + tl.arange(0, 4 * BLOCK_G)
    ids = _four(i0[None, :], i1[None, :], i2[None, :], i3[None, :])
    tl.store(ids_ptr + tb.to(tl.int64) * stride_ids + out[None, :], (ids + g0 * M).to(tl.int32))
    dst = rows[:, None].to(tl.int64) * stride_c + out[None, :]
    tl.store(hc_ptr + dst, _four(h0.to(dtype), h1.to(dtype), h2.to(dtype), h3.to(dtype)))
    tl.store(rc_ptr + dst, _four(r0.to(dtype), r1.to(dtype), r2.to(dtype), r3.to(dtype)))


@triton.jit
def _top4_2d(norms, j):
    """[G, 4] of the kept column indices (within group), ascending."""
    left = j[None, None, :] < j[None, :, None]
    a = norms[:, :, None]
    b = norms[:, None, :]
    chosen = tl.sum(((b > a) | ((b == a) & left)).to(tl.int32), axis=2) < 4
    pos = tl.sum((chosen[:, None, :] & left).to(tl.int32), axis=2)  # [G, M]
    k = tl.arange(0, 4)
    hit = chosen[:, :, None] & (pos[:, :, None] == k[None, None, :])  # [G, M, 4]
    return tl.sum(tl.where(hit, j[None, :, None], 0), axis=1)  # [G, 4]


@triton.jit
def g3_kernel(
    z_ptr, b_ptr, hc_ptr, rc_ptr, ids_ptr,
    G, stride_z, stride_c, stride_ids,
    V: tl.constexpr, N: tl.constexpr, M: tl.constexpr, BLOCK_G: tl.constexpr, HAS_BIAS: tl.constexpr,
):  # fmt: skip
    tb = tl.program_id(0)
    g0 = tl.program_id(1) * BLOCK_G
    C: tl.constexpr = BLOCK_G * M
    rows = tb * V + tl.arange(0, V)
    cols = g0 * M + tl.arange(0, C)
    dtype = hc_ptr.dtype.element_ty
    z = tl.load(z_ptr + rows[:, None].to(tl.int64) * stride_z + cols[None, :])
    bias = tl.load(b_ptr + cols).to(tl.float32)[None, :] if HAS_BIAS else 0.0
    r = _relu(z, bias, HAS_BIAS)
    norms = tl.reshape(tl.sum((r * r).to(dtype).to(tl.float32), axis=0), (BLOCK_G, M))
    c = _top4_2d(norms, tl.arange(0, M))  # [G, 4]
    z3 = tl.reshape(z, (V, BLOCK_G, M))
    zg = tl.gather(z3, tl.broadcast_to(c[None, :, :], (V, BLOCK_G, 4)), axis=2)  # [V, G, 4]
    zg = tl.reshape(zg, (V, 4 * BLOCK_G))
    col = tl.reshape(c + (tl.arange(0, BLOCK_G) * M)[:, None], (4 * BLOCK_G,))
    bias_c = tl.load(b_ptr + g0 * M + col).to(tl.float32)[None, :] if HAS_BIAS else 0.0
    r = _relu(zg, bias_c, HAS_BIAS)
    h = (r * r).to(dtype).to(tl.float32)
    if N < 4:
        keep = _keep_n(h, N)
        h = tl.where(keep, h, 0.0)
        r = tl.where(keep, r, 0.0)
    out = g0 * 4 + tl.arange(0, 4 * BLOCK_G)
    tl.store(ids_ptr + tb.to(tl.int64) * stride_ids + out, (col + g0 * M).to(tl.int32))
    dst = rows[:, None].to(tl.int64) * stride_c + out[None, :]
    tl.store(hc_ptr + dst, h.to(dtype))
    tl.store(rc_ptr + dst, r.to(dtype))


@triton.jit
def _mux(z3, c, j3):
    """[V, G, M] tile, per-group column c [G] -> [V, G]: z3[:, g, c[g]] (one nonzero per sum)."""
    return tl.max(tl.where(j3 == c[None, :, None], z3, float("-inf")), axis=2)


@triton.jit
def mux_kernel(
    z_ptr, b_ptr, hc_ptr, rc_ptr, ids_ptr,
    G, stride_z, stride_c, stride_ids,
    V: tl.constexpr, N: tl.constexpr, M: tl.constexpr, BLOCK_G: tl.constexpr, HAS_BIAS: tl.constexpr,
):  # fmt: skip
    tb = tl.program_id(0)
    g0 = tl.program_id(1) * BLOCK_G
    rows = tb * V + tl.arange(0, V)
    gg = tl.arange(0, BLOCK_G)
    j = tl.arange(0, M)
    cols = (g0 + gg)[:, None] * M + j[None, :]  # [G, M]
    dtype = hc_ptr.dtype.element_ty
    z3 = tl.load(z_ptr + rows[:, None, None].to(tl.int64) * stride_z + cols[None, :, :])
    bias = tl.load(b_ptr + cols).to(tl.float32)[None, :, :] if HAS_BIAS else 0.0
    r3 = _relu(z3, bias, HAS_BIAS)
    norms = tl.sum((r3 * r3).to(dtype).to(tl.float32), axis=0)  # [G, M]
    c0, c1, c2, c3 = _cols4(norms, j)
    j3 = j[None, None, :]
    if HAS_BIAS:
        bz = tl.load(b_ptr + cols)[None, :, :]
        r3b = tl.maximum((z3.to(tl.float32) + bz.to(tl.float32)).to(dtype), 0.0)
    else:
        r3b = tl.maximum(z3, 0.0)
    r0 = _mux(r3b, c0, j3).to(tl.float32)
    r1 = _mux(r3b, c1, j3).to(tl.float32)
    r2 = _mux(r3b, c2, j3).to(tl.float32)
    r3_ = _mux(r3b, c3, j3).to(tl.float32)
    h0 = (r0 * r0).to(dtype).to(tl.float32)
    h1 = (r1 * r1).to(dtype).to(tl.float32)
    h2 = (r2 * r2).to(dtype).to(tl.float32)
    h3 = (r3_ * r3_).to(dtype).to(tl.float32)
    if N < 4:
        k0 = ((h1 > h0).to(tl.int32) + (h2 > h0).to(tl.int32) + (h3 > h0).to(tl.int32)) < N
        k1 = ((h0 >= h1).to(tl.int32) + (h2 > h1).to(tl.int32) + (h3 > h1).to(tl.int32)) < N
        k2 = ((h0 >= h2).to(tl.int32) + (h1 >= h2).to(tl.int32) + (h3 > h2).to(tl.int32)) < N
        k3 = ((h0 >= h3).to(tl.int32) + (h1 >= h3).to(tl.int32) + (h2 >= h3).to(tl.int32)) < N
        h0 = tl.where(k0, h0, 0.0)
        h1 = tl.where(k1, h1, 0.0)
        h2 = tl.where(k2, h2, 0.0)
        h3 = tl.where(k3, h3, 0.0)
        r0 = tl.where(k0, r0, 0.0)
        r1 = tl.where(k1, r1, 0.0)
        r2 = tl.where(k2, r2, 0.0)
        r3_ = tl.where(k3, r3_, 0.0)
    out = g0 * 4 + tl.arange(0, 4 * BLOCK_G)
    ids = _four(c0[None, :], c1[None, :], c2[None, :], c3[None, :]) + (out // 4 * M)[None, :]
    tl.store(ids_ptr + tb.to(tl.int64) * stride_ids + out[None, :], ids.to(tl.int32))
    dst = rows[:, None].to(tl.int64) * stride_c + out[None, :]
    tl.store(hc_ptr + dst, _four(h0.to(dtype), h1.to(dtype), h2.to(dtype), h3.to(dtype)))
    tl.store(rc_ptr + dst, _four(r0.to(dtype), r1.to(dtype), r2.to(dtype), r3_.to(dtype)))


def launch(kernel, z, bias, v, n, m, block_g, num_warps=4):
    """(h_c, r_c, ids) from one of the variant kernels above; same contract as vnm_select_compact."""
    import torch

    t, f = z.shape
    kc = f * 4 // m
    h_c = torch.empty(t, kc, device=z.device, dtype=z.dtype)
    r_c = torch.empty_like(h_c)
    ids = torch.empty(t // v, kc, device=z.device, dtype=torch.int32)
    kernel[(t // v, f // m // block_g)](
        z, bias if bias is not None else z, h_c, r_c, ids, f // m, z.stride(0), h_c.stride(0), ids.stride(0),
        V=v, N=n, M=m, BLOCK_G=block_g, HAS_BIAS=bias is not None, num_warps=num_warps,
    )  # fmt: skip
    return h_c, r_c, ids


@triton.jit
def _sqrelu_x2(z, b):
    """relu(z + b)^2 in bf16, two per instruction: fma.rn(z, 1, b), max with 0, fma.rn(r, r, -0)."""
    return tl.inline_asm_elementwise(
        "{ .reg .b32 one, zero, nzero, t; mov.b32 one, 0x3F803F80; mov.b32 zero, 0; mov.b32 nzero, 0x80008000; "
        "fma.rn.bf16x2 t, $1, one, $2; max.bf16x2 t, t, zero; fma.rn.bf16x2 $0, t, t, nzero; }",
        "=r,r,r",
        [z, b],
        dtype=tl.bfloat16,
        is_pure=True,
        pack=2,
    )


@triton.jit
def g3a_kernel(
    z_ptr, b_ptr, hc_ptr, rc_ptr, ids_ptr,
    G, stride_z, stride_c, stride_ids,
    V: tl.constexpr, N: tl.constexpr, M: tl.constexpr, BLOCK_G: tl.constexpr, HAS_BIAS: tl.constexpr,
):  # fmt: skip
    tb = tl.program_id(0)
    g0 = tl.program_id(1) * BLOCK_G
    C: tl.constexpr = BLOCK_G * M
    rows = tb * V + tl.arange(0, V)
    cols = g0 * M + tl.arange(0, C)
    dtype = hc_ptr.dtype.element_ty
    z = tl.load(z_ptr + rows[:, None].to(tl.int64) * stride_z + cols[None, :])
    if HAS_BIAS:
        zb = tl.broadcast_to(tl.load(b_ptr + cols)[None, :], (V, C))
    else:
        zb = tl.zeros((V, C), dtype=dtype)
    h16 = _sqrelu_x2(z, zb)
    norms = tl.reshape(tl.sum(h16.to(tl.float32), axis=0), (BLOCK_G, M))
    c = _top4_2d(norms, tl.arange(0, M))  # [G, 4]
    z3 = tl.reshape(z, (V, BLOCK_G, M))
    zg = tl.gather(z3, tl.broadcast_to(c[None, :, :], (V, BLOCK_G, 4)), axis=2)  # [V, G, 4]
    zg = tl.reshape(zg, (V, 4 * BLOCK_G))
    col = tl.reshape(c + (tl.arange(0, BLOCK_G) * M)[:, None], (4 * BLOCK_G,))
    bias_c = tl.load(b_ptr + g0 * M + col).to(tl.float32)[None, :] if HAS_BIAS else 0.0
    r = _relu(zg, bias_c, HAS_BIAS)
    h = (r * r).to(dtype).to(tl.float32)
    if N < 4:
        keep = _keep_n(h, N)
        h = tl.where(keep, h, 0.0)
        r = tl.where(keep, r, 0.0)
    out = g0 * 4 + tl.arange(0, 4 * BLOCK_G)
    tl.store(ids_ptr + tb.to(tl.int64) * stride_ids + out, (col + g0 * M).to(tl.int32))
    dst = rows[:, None].to(tl.int64) * stride_c + out[None, :]
    tl.store(hc_ptr + dst, h.to(dtype))
    tl.store(rc_ptr + dst, r.to(dtype))


@triton.jit
def _sqrelu_x2_f32(z, b):
    """relu(z + b)^2 rounded to bf16, two per instruction, returned as float32 (the bf16 bits shifted up)."""
    return tl.inline_asm_elementwise(
        "{ .reg .b32 one, zero, nzero, t; mov.b32 one, 0x3F803F80; mov.b32 zero, 0; mov.b32 nzero, 0x80008000; "
        "fma.rn.bf16x2 t, $2, one, $3; max.bf16x2 t, t, zero; fma.rn.bf16x2 t, t, t, nzero; "
        "shl.b32 $0, t, 16; and.b32 $1, t, 0xFFFF0000; }",
        "=r,=r,r,r",
        [z, b],
        dtype=tl.float32,
        is_pure=True,
        pack=2,
    )


@triton.jit
def g3b_kernel(
    z_ptr, b_ptr, hc_ptr, rc_ptr, ids_ptr,
    G, stride_z, stride_c, stride_ids,
    V: tl.constexpr, N: tl.constexpr, M: tl.constexpr, BLOCK_G: tl.constexpr, HAS_BIAS: tl.constexpr,
):  # fmt: skip
    tb = tl.program_id(0)
    g0 = tl.program_id(1) * BLOCK_G
    C: tl.constexpr = BLOCK_G * M
    rows = tb * V + tl.arange(0, V)
    cols = g0 * M + tl.arange(0, C)
    dtype = hc_ptr.dtype.element_ty
    z = tl.load(z_ptr + rows[:, None].to(tl.int64) * stride_z + cols[None, :])
    if HAS_BIAS:
        zb = tl.broadcast_to(tl.load(b_ptr + cols)[None, :], (V, C))
    else:
        zb = tl.zeros((V, C), dtype=dtype)
    norms = tl.reshape(tl.sum(_sqrelu_x2_f32(z, zb), axis=0), (BLOCK_G, M))
    c = _top4_2d(norms, tl.arange(0, M))  # [G, 4]
    z3 = tl.reshape(z, (V, BLOCK_G, M))
    zg = tl.gather(z3, tl.broadcast_to(c[None, :, :], (V, BLOCK_G, 4)), axis=2)  # [V, G, 4]
    zg = tl.reshape(zg, (V, 4 * BLOCK_G))
    col = tl.reshape(c + (tl.arange(0, BLOCK_G) * M)[:, None], (4 * BLOCK_G,))
    bias_c = tl.load(b_ptr + g0 * M + col).to(tl.float32)[None, :] if HAS_BIAS else 0.0
    r = _relu(zg, bias_c, HAS_BIAS)
    h = (r * r).to(dtype).to(tl.float32)
    if N < 4:
        keep = _keep_n(h, N)
        h = tl.where(keep, h, 0.0)
        r = tl.where(keep, r, 0.0)
    out = g0 * 4 + tl.arange(0, 4 * BLOCK_G)
    tl.store(ids_ptr + tb.to(tl.int64) * stride_ids + out, (col + g0 * M).to(tl.int32))
    dst = rows[:, None].to(tl.int64) * stride_c + out[None, :]
    tl.store(hc_ptr + dst, h.to(dtype))
    tl.store(rc_ptr + dst, r.to(dtype))
