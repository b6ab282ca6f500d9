"""The compact-operand Triton kernels (scatter, gather-K GEMM, gather-N GEMM + dZ epilogue) against
their references: interpreter on CPU (fp16/fp32), the GPU in bf16 too."""

import pytest
import torch

from sparse_compile.kernels import gather_gemm_triton
from sparse_compile.kernels.activation_mask import vnm_compact_ref
from sparse_compile.kernels.compact_scatter_triton import vnm_colsum, vnm_scatter
from sparse_compile.kernels.gather_gemm_triton import gather_k_mm, gather_n_mm
from sparse_compile.kernels.gather_reference import gather_k_mm_ref, gather_n_mm_ref, vnm_scatter_ref

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float16, torch.float32] + ([torch.bfloat16] if DEVICE == "cuda" else [])
# (V, N, M, T/V, groups): awkward but legal; Kc = 4 * groups is not a multiple of the tile
SHAPES = [(16, 2, 8, 2, 5), (32, 1, 12, 1, 3), (16, 4, 16, 3, 4), (64, 2, 8, 1, 8)]
TOL = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2, torch.float32: 1e-5}


def _compact(v, n, m, blocks, groups, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(blocks * v, groups * m, generator=g).to(DEVICE, dtype)
    h_c, r_c, ids = vnm_compact_ref(z, None, v, n, m)
    return h_c, r_c, ids, g


def _close(got, want, dtype):
    assert got.shape == want.shape and got.dtype == want.dtype
    err = (got.float() - want.float()).abs().max().item()
    scale = want.float().abs().max().item()
    assert err <= TOL[dtype] * max(scale, 1.0), f"max error {err:.3g} vs scale {scale:.3g}"


@pytest.mark.parametrize("v, n, m, blocks, groups", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("square", [False, True])
def test_scatter_exact(v, n, m, blocks, groups, dtype, square):
    h_c, r_c, ids, _ = _compact(v, n, m, blocks, groups, dtype, seed=v + m)
    got = vnm_scatter(r_c, ids, v, m, square=square)
    want = vnm_scatter_ref(r_c * r_c if square else r_c, ids, v, groups * m)
    assert torch.equal(got, want)
    if square:  # the squared scatter of r_c is the masked H itself
        assert torch.equal(got, vnm_scatter_ref(h_c, ids, v, groups * m))


@pytest.mark.parametrize("v, n, m, blocks, groups", [*SHAPES, (16, 2, 8, 40, 4), (128, 4, 16, 9, 8)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_colsum_is_the_scattered_column_sum(v, n, m, blocks, groups, dtype):
    """db1 from the compact dZ: scatter(c).sum(0) in float32, one rounding (signed values; groups
    of 5 and 3 take one group per program, 4 and 8 four; 40 blocks of 16 and 9 of 128 take several
    steps of 32 and 4 blocks, the last one partly masked)."""
    _, r_c, ids, g = _compact(v, n, m, blocks, groups, dtype, seed=3 * v + m)
    c = torch.randn(r_c.shape, generator=g).to(DEVICE, dtype)
    got = vnm_colsum(c, ids, v, m)
    want = vnm_scatter_ref(c, ids, v, groups * m).float().sum(0).to(dtype)
    _close(got, want, dtype)
    with pytest.raises(ValueError, match="V=8"):
        vnm_colsum(c, ids, 8, m)


def _tma_ok(t: torch.Tensor) -> bool:
    return (t.stride(0) * t.element_size()) % 16 == 0


@pytest.mark.parametrize("v, n, m, blocks, groups", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("tma", [False, True])
def test_gather_k(v, n, m, blocks, groups, dtype, bias, tma):
    """tma: the compact operand through a TMA descriptor (zero-filled past Kc, which is not a
    multiple of the tile in the fp32 cases); rows not 16-byte aligned are refused."""
    h_c, _, ids, g = _compact(v, n, m, blocks, groups, dtype, seed=3 * v + m)
    cols = 40  # not a multiple of the tile
    b = torch.randn(groups * m, cols, generator=g).to(DEVICE, dtype)
    bb = torch.randn(cols, generator=g).to(DEVICE, dtype) if bias else None
    if tma and not _tma_ok(h_c):
        with pytest.raises(ValueError, match="tma=True needs a 16-byte aligned"):
            gather_k_mm(h_c, ids, b, v, bb, tma=True)
        return
    _close(gather_k_mm(h_c, ids, b, v, bb, tma=tma), gather_k_mm_ref(h_c, ids, b, v, bb), dtype)


@pytest.mark.parametrize("v, n, m, blocks, groups", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("epilogue", [False, True])
@pytest.mark.parametrize("tma", [False, True])
def test_gather_n(v, n, m, blocks, groups, dtype, epilogue, tma):
    _, r_c, ids, g = _compact(v, n, m, blocks, groups, dtype, seed=5 * v + m)
    k = 40  # not a multiple of the tile; rows 16-byte aligned in fp16 and fp32
    a = torch.randn(blocks * v, k, generator=g).to(DEVICE, dtype)
    bt = torch.randn(groups * m, k, generator=g).to(DEVICE, dtype)
    r = r_c if epilogue else None
    got = gather_n_mm(a, bt, ids, v, r, tma=tma)
    _close(got, gather_n_mm_ref(a, bt, ids, v, r), dtype)
    if epilogue:  # zero exactly where the row dropped the entry
        assert (got[r_c == 0] == 0).all()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("persistent", [False, True])
def test_gather_n_tile_sums(dtype, persistent):
    """B1's epilogue also writes the float32 column sums of its stored (rounded) output over each
    row tile, db1's first step: the same output as without them, and sums equal to the output's
    (Kc = 36: the last column tile partly masked; 3 blocks of 32 rows)."""
    _, r_c, ids, g = _compact(32, 2, 8, 3, 9, dtype, seed=17)
    a = torch.randn(96, 40, generator=g).to(DEVICE, dtype)
    bt = torch.randn(72, 40, generator=g).to(DEVICE, dtype)
    out, sums = gather_n_mm(a, bt, ids, 32, r_c, persistent=persistent, tile_sums=True)
    assert torch.equal(out, gather_n_mm(a, bt, ids, 32, r_c, persistent=persistent))
    rows = out.shape[0] // sums.shape[0]
    assert sums.dtype == torch.float32 and sums.shape == (96 // rows, 36) and 32 % rows == 0
    want = out.double().view(-1, rows, 36).sum(1)
    assert torch.allclose(sums.double(), want, rtol=1e-5, atol=1e-4)
    assert (want != 0).float().mean() > 0.9  # the sums are not a zero tensor that matches by accident


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("persistent", [False, True])
def test_gather_n_writes_the_squared_operand(dtype, persistent):
    """square_out: B1's epilogue also writes H~ = round(r_c^2), B2's operand, bit-equal to the
    squared scatter's values (the compact h_c of the selection), without changing dZ~ or the tile
    sums (Kc = 36: the last column tile partly masked; the buffer poisoned first)."""
    h_c, r_c, ids, g = _compact(32, 2, 8, 3, 9, dtype, seed=23)
    a = torch.randn(96, 40, generator=g).to(DEVICE, dtype)
    bt = torch.randn(72, 40, generator=g).to(DEVICE, dtype)
    sq = torch.full_like(r_c, float("nan"))
    out, sums = gather_n_mm(a, bt, ids, 32, r_c, persistent=persistent, tile_sums=True, square_out=sq)
    assert torch.equal(sq, (r_c.float() * r_c.float()).to(dtype)) and torch.equal(sq, h_c)
    assert (sq != 0).float().mean() > 0.3
    want, want_sums = gather_n_mm(a, bt, ids, 32, r_c, persistent=persistent, tile_sums=True)
    assert torch.equal(out, want) and torch.equal(sums, want_sums)
    with pytest.raises(ValueError, match=r"square_out must be .* with r given or act; got \(96, 36\) .* r None"):
        gather_n_mm(a, bt, ids, 32, None, square_out=sq)
    with pytest.raises(ValueError, match=r"square_out must be contiguous \[96, 36\].*got \(96, 35\)"):
        gather_n_mm(a, bt, ids, 32, r_c, square_out=sq[:, :35])


def test_gather_k_64bit_row_offsets(monkeypatch):
    """The 64-bit address path, taken when b's offsets do not fit in int32 (here forced)."""
    monkeypatch.setattr(gather_gemm_triton, "_i32_rows", lambda b: False)
    h_c, _, ids, g = _compact(16, 2, 8, 2, 5, torch.float32, seed=11)
    b = torch.randn(40, 24, generator=g).to(DEVICE)
    _close(gather_k_mm(h_c, ids, b, 16), gather_k_mm_ref(h_c, ids, b, 16), torch.float32)


@pytest.mark.parametrize("v, n, m, blocks, groups", [(16, 2, 8, 5, 9), (32, 1, 12, 2, 7)])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tma", [False, True])
def test_gather_n_persistent(v, n, m, blocks, groups, dtype, tma):
    """Persistent programs walking several tiles each (on the CPU 4 programs for 15-30 tiles),
    with the dZ epilogue, against the reference; and the same answer as one program per tile."""
    _, r_c, ids, g = _compact(v, n, m, blocks, groups, dtype, seed=7 * v + m)
    k = 40
    a = torch.randn(blocks * v, k, generator=g).to(DEVICE, dtype)
    bt = torch.randn(groups * m, k, generator=g).to(DEVICE, dtype)
    got = gather_n_mm(a, bt, ids, v, r_c, tma=tma, persistent=True)
    _close(got, gather_n_mm_ref(a, bt, ids, v, r_c), dtype)
    assert torch.equal(got, gather_n_mm(a, bt, ids, v, r_c, tma=tma, persistent=False))


def test_ids_are_honoured():
    """A wrong id set must change the answer: the kernels really gather."""
    h_c, _, ids, g = _compact(16, 2, 8, 2, 4, torch.float32, seed=1)
    b = torch.randn(32, 24, generator=g).to(DEVICE)
    shifted = (ids + 1) % 32
    assert not torch.allclose(gather_k_mm(h_c, shifted.int(), b, 16), gather_k_mm(h_c, ids, b, 16))


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda c, i, b: gather_k_mm(c.double(), i, b.double(), 16), "one dtype"),
        (lambda c, i, b: gather_k_mm(c, i, b.half(), 16), "one dtype"),
        (lambda c, i, b: gather_k_mm(c, i.long(), b, 16), "ids.dtype=torch.int64"),
        (lambda c, i, b: gather_k_mm(c, i, b, 8), "V=8"),
        (lambda c, i, b: gather_k_mm(c[:16], i, b, 16), "do not match V=16"),
        (lambda c, i, b: gather_k_mm(c, i, b.t().contiguous().t(), 16), "contiguous rows"),
        (lambda c, i, b: gather_n_mm(c, b, i, 16), "do not match V=16"),
        (lambda c, i, b: vnm_scatter(c, i, 16, 6), "M=6"),
        (lambda c, i, b: vnm_scatter(c, i.long(), 16, 8), "int32"),
    ],
)
def test_rejects_bad_input(call, match):
    h_c, _, ids, _ = _compact(16, 2, 8, 2, 4, torch.float32, seed=2)
    b = torch.randn(32, 24, device=DEVICE)
    with pytest.raises(ValueError, match=match):
        call(h_c, ids, b)


@pytest.mark.parametrize("c", [16, 32])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("i32, tma", [(True, False), (False, False), (True, True)])
def test_chunked_ids_read_the_weight_in_place(monkeypatch, c, dtype, i32, tma):
    """Neuron chunks: each block's ids are aligned runs of c units, so F2 and B1 read W2 [d, h] as
    its transposed view w2.t() (no copy; vector loads along the runs), and B3 gathers W1's rows.
    Same products as the reference on a contiguous W2^T, both address widths (i32=False: the 64-bit
    path, forced). tma: the weight's runs copied as whole slabs through a descriptor (the
    interpreter's 16-wide id tile divides c)."""
    if not i32:
        monkeypatch.setattr(gather_gemm_triton, "_i32_rows", lambda b: False)
    v, n, m, blocks, h, d = 16, 2, 8, 3, 512, 48
    g = torch.Generator().manual_seed(c)
    z = torch.randn(blocks * v, h, generator=g).to(DEVICE, dtype)
    h_c, r_c, ids = vnm_compact_ref(z, None, v, n, m, c)
    assert (ids.view(blocks, -1, c).diff(dim=2) == 1).all()  # runs of c consecutive units
    w2 = torch.randn(d, h, generator=g).to(DEVICE, dtype)
    dy = torch.randn(blocks * v, d, generator=g).to(DEVICE, dtype)
    b2 = torch.randn(d, generator=g).to(DEVICE, dtype)
    w2t = w2.t()
    assert w2t.stride() == (1, h)
    want_k = gather_k_mm_ref(h_c, ids, w2t.contiguous(), v, b2)
    _close(gather_k_mm(h_c, ids, w2t, v, b2, tma=tma, chunk=c), want_k, dtype)
    want_n = gather_n_mm_ref(dy, w2t.contiguous(), ids, v, r_c)
    for persistent in (False, True):
        _close(gather_n_mm(dy, w2t, ids, v, r_c, tma=tma, persistent=persistent, chunk=c), want_n, dtype)
        _close(gather_n_mm(dy, w2t.contiguous(), ids, v, r_c, tma=tma, persistent=persistent, chunk=c), want_n, dtype)
    w1 = torch.randn(h, d, generator=g).to(DEVICE, dtype)
    _close(gather_k_mm(h_c, ids, w1, v, tma=tma, chunk=c), gather_k_mm_ref(h_c, ids, w1, v), dtype)


def test_transposed_weight_needs_chunked_ids():
    h_c, r_c, ids, g = _compact(16, 2, 8, 2, 4, torch.float32, seed=5)
    w2t = torch.randn(24, 32, generator=g).to(DEVICE).t()
    with pytest.raises(ValueError, match="b must be 2-D with contiguous rows; got shape"):
        gather_k_mm(h_c, ids, w2t, 16)
    with pytest.raises(ValueError, match="chunk=3; expected a power of two"):
        gather_k_mm(h_c, ids, w2t.contiguous(), 16, chunk=3)
    with pytest.raises(ValueError, match="16 ids per block is not a multiple of chunk=32"):
        gather_n_mm(torch.randn(32, 24).to(DEVICE), w2t, ids, 16, r_c, chunk=32)
