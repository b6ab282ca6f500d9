"""Neuron chunks: the chunked V:N:M pattern (reference), its selection and weight-gradient kernels
(Triton interpreter, fp16/fp32), the config field and the FFN op against the oracle."""

import dataclasses
import itertools

import pytest
import torch
import triton
import triton.language as tl

from sparse_compile import SparsityConfig
from sparse_compile.kernels.activation_mask import vnm_compact_ref, vnm_mask
from sparse_compile.kernels.chunk_wgrad_triton import _tail_plan
from sparse_compile.kernels.gather_reference import vnm_scatter_ref

PATTERNS = [(32, 2, 8, 16), (16, 1, 4, 32), (32, 4, 8, 16), (64, 2, 16, 16)]  # (V, N, M, c)


def _brute_mask(h: torch.Tensor, v: int, n: int, m: int, c: int) -> torch.Tensor:
    """The chunked pattern by loops: chunk norms in float64, stable descending sorts."""
    t, f = h.shape
    keep = torch.zeros(t, f, dtype=torch.bool)
    for b, g in itertools.product(range(t // v), range(f // (m * c))):
        rows = slice(b * v, (b + 1) * v)
        base = g * m * c
        norms = [h[rows, base + j * c : base + (j + 1) * c].double().sum().item() for j in range(m)]
        chosen = sorted(sorted(range(m), key=lambda j: -norms[j])[:4])  # sorted() is stable: ties to lower j
        for r in range(b * v, (b + 1) * v):
            for o in range(c):
                vals = [h[r, base + j * c + o].item() for j in chosen]
                for i in sorted(range(4), key=lambda i: -vals[i])[:n]:
                    keep[r, base + chosen[i] * c + o] = True
    return keep


@pytest.mark.parametrize("v,n,m,c", [(4, 2, 4, 2), (2, 1, 8, 3), (4, 4, 8, 2), (8, 2, 4, 4)])
def test_reference_matches_a_loop_and_keeps_chunks_whole(v, n, m, c):
    torch.manual_seed(v * 100 + c)
    h = torch.randn(2 * v, 2 * m * c).relu().square()
    mask = vnm_mask(h, v, n, m, c)
    assert torch.equal(mask, _brute_mask(h, v, n, m, c))
    blocks = mask.reshape(2, v, 2, m, c)
    chunk_used = blocks.any(dim=(1, 4))  # [T/V, groups, M]
    assert (chunk_used.sum(-1) <= 4).all()  # at most 4 chunks per group and block
    assert (blocks.sum(dim=3) <= n).all()  # at most N of the group per row and offset
    # a unit is nonzero only in the blocks that kept its chunk: the structure B2/B4 skip work on
    assert not (blocks & ~chunk_used[:, None, :, :, None]).any()


def test_top_k_mask_ranks_by_count_ties_to_the_lower_index():
    """top_k_mask against its definition: an entry is kept where fewer than k entries are larger or
    equal at a lower index; on integer values with many ties, k from 1 to the width."""
    from sparse_compile.kernels.activation_mask import top_k_mask

    torch.manual_seed(3)
    values = torch.randint(0, 4, (50, 3, 8)).float()
    a, b = values.unsqueeze(-1), values.unsqueeze(-2)
    idx = torch.arange(8)
    ahead = ((b > a) | ((b == a) & (idx < idx[:, None]))).sum(-1)
    for k in range(1, 9):
        assert torch.equal(top_k_mask(values, k), ahead < k), k


def test_chunk_one_is_the_plain_pattern():
    h = torch.randn(64, 64).relu().square()
    assert torch.equal(vnm_mask(h, 16, 2, 8, 1), vnm_mask(h, 16, 2, 8))
    z = torch.randn(64, 64)
    for a, b in zip(vnm_compact_ref(z, None, 16, 2, 8, 1), vnm_compact_ref(z, None, 16, 2, 8), strict=True):
        assert torch.equal(a, b)


def test_config_validates_chunk():
    assert SparsityConfig(activations="128:2:16", chunk=32).op_spec().endswith(";chunk=32")
    assert "chunk" not in SparsityConfig(activations="128:2:16").op_spec()
    for bad in (0, -1, True, 2.0, "32"):
        with pytest.raises(ValueError, match=r"SparsityConfig.chunk=.*expected an int >= 1"):
            SparsityConfig(activations="128:2:16", chunk=bad)
    for act in ("2:4", "1:2:8", None):
        with pytest.raises(
            ValueError,
            match=rf"chunk=32 needs V:N:M activations with V > 1, or per token .*1:4:M; got activations={act!r}",
        ):
            SparsityConfig(weights="2:4", activations=act, chunk=32)
    assert SparsityConfig(activations="1:4:16", chunk=32, permute=True).op_spec().endswith(";chunk=32")


def test_per_token_chunks_keep_each_tokens_own_top_chunks():
    """1:4:M in chunks: each token (a block of one) keeps the 4 of every M chunks of largest L1 norm
    over its own units; checked against the loop, and causal: a token's mask is a function of its own
    row alone (changing the later rows changes no earlier row's mask)."""
    torch.manual_seed(7)
    h = torch.randn(24, 2 * 8 * 4).relu().square()
    mask = vnm_mask(h, 1, 4, 8, 4)
    assert torch.equal(mask, _brute_mask(h, 1, 4, 8, 4))
    assert (mask.reshape(24, 2, 8, 4).any(-1).sum(-1) == 4).all()  # 4 whole chunks per group and token
    later = h.clone()
    later[10:] = torch.randn(14, h.shape[1]).relu().square()
    assert torch.equal(vnm_mask(later, 1, 4, 8, 4)[:10], mask[:10])


@pytest.mark.parametrize("v,n,m,c", PATTERNS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_select_kernel_matches_reference(interpreter, v, n, m, c, dtype):
    from sparse_compile.kernels.chunk_select_triton import vnm_select_chunks

    torch.manual_seed(c + m)
    h = 2 * m * c
    z = torch.randn(2 * v, h, dtype=dtype)
    bias = torch.randn(h, dtype=dtype)
    for b in (None, bias):
        for got, want in zip(vnm_select_chunks(z, b, v, n, m, c), vnm_compact_ref(z, b, v, n, m, c), strict=True):
            assert torch.equal(got, want)


@pytest.mark.parametrize("v,n,m,c,seq", [(16, 2, 8, 16, 32), (32, 4, 8, 16, 64), (16, 1, 8, 2, 16)])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_causal_select_kernel_matches_reference(interpreter, v, n, m, c, seq, dtype):
    """The causal chunked selection (each block scored by the previous block of its sequence, a
    sequence's first block by its first row) equals the reference, with and without bias; and it
    is not the plain pattern."""
    from sparse_compile.kernels.chunk_select_triton import vnm_select_chunks

    torch.manual_seed(seq + c)
    h = 2 * m * c
    z = torch.randn(128, h, dtype=dtype)
    for b in (None, torch.randn(h, dtype=dtype)):
        got = vnm_select_chunks(z, b, v, n, m, c, seq)
        for name, a, r in zip(("h_c", "r_c", "ids"), got, vnm_compact_ref(z, b, v, n, m, c, seq), strict=True):
            assert torch.equal(a, r), name
        assert not torch.equal(got[2], vnm_compact_ref(z, b, v, n, m, c)[2])
    with pytest.raises(ValueError, match="sequences of 24 tokens"):
        vnm_select_chunks(z, None, v, n, m, c, 24)


def test_causal_chunked_mask_never_looks_ahead():
    g = torch.Generator().manual_seed(3)
    h = torch.rand(128, 128, generator=g) ** 4
    later = h.clone()
    later[40:] = torch.rand(88, 128, generator=g) ** 4  # token 40 sits inside block 2 (V=16)
    assert torch.equal(vnm_mask(h, 16, 2, 8, 4, seq=64)[:40], vnm_mask(later, 16, 2, 8, 4, seq=64)[:40])
    assert not torch.equal(vnm_mask(h, 16, 2, 8, 4)[32:40], vnm_mask(later, 16, 2, 8, 4)[32:40])


@pytest.mark.parametrize("tma", [False, True], ids=["pointers", "TMA"])
@pytest.mark.parametrize("units_m", [False, True])
@pytest.mark.parametrize("dtype,tol", [(torch.float16, 2e-3), (torch.float32, 1e-5)])
def test_weight_grad_kernel_matches_reference(interpreter, dtype, tol, units_m, tma):
    """Both tile orientations (units_m: the chunk's units along the MMA's M) and both loads (pointer
    tiles or TMA descriptors) against the reference; d = 48 leaves a partial d tile (BLOCK_D 32 on
    the CPU: TMA zero-fills past d, the stores are masked)."""
    from sparse_compile.kernels.chunk_wgrad_triton import chunk_wgrad, chunk_wgrad_ref

    torch.manual_seed(1)
    t, h, d, v, n, m, c = 128, 512, 48, 32, 2, 8, 16
    _, r_c, ids = vnm_compact_ref(torch.randn(t, h, dtype=dtype), None, v, n, m, c)
    b = torch.randn(t, d, dtype=dtype)
    for square in (False, True):
        want = chunk_wgrad_ref(r_c, ids, b, v, h, square=square).float()
        if square and units_m and tma:
            with pytest.raises(ValueError, match="tma=True with square=True and units_m=True is not built"):
                chunk_wgrad(r_c, ids, b, v, c, h, square=square, units_m=units_m, tma=tma)
            continue
        got = chunk_wgrad(r_c, ids, b, v, c, h, square=square, units_m=units_m, tma=tma).float()
        assert (got - want).norm() / want.norm() < tol
        got_t = chunk_wgrad(r_c, ids, b, v, c, h, square=square, transpose=True, units_m=units_m, tma=tma)
        assert got_t.is_contiguous() and torch.equal(got_t.t().float(), got)
    with pytest.raises(ValueError, match="c=8 must be a power of two >= 16"):
        chunk_wgrad(r_c, ids, b, v, 8, h)


def test_chunk_order_puts_the_most_kept_chunks_first():
    """Longest programs first: chunks by how many blocks keep them, descending, ties by chunk id."""
    from sparse_compile.kernels.chunk_wgrad_triton import chunk_csr_ref, chunk_order

    torch.manual_seed(4)
    t, h, v, n, m, c = 512, 512, 16, 2, 8, 16
    z = torch.randn(t, h) * torch.linspace(0.2, 3.0, h)[torch.randperm(h)]  # uneven popularity
    _, _, ids = vnm_compact_ref(z, None, v, n, m, c)
    offsets = chunk_csr_ref(ids, c, h)[0]
    kept = offsets.diff().tolist()
    want = sorted(range(h // c), key=lambda j: (-kept[j], j))
    got = chunk_order(offsets)
    assert got.dtype == torch.int32 and got.tolist() == want
    assert len(set(kept)) > 2  # the order is not the identity by accident


@pytest.mark.parametrize("group_d", [1, 2, None])
def test_weight_grad_kernel_any_program_order_gives_the_same_product(interpreter, group_d):
    """The program order (chunks in any order, D tiles grouped by 1, 2 or all) changes which program
    runs when, never a value: each output tile is one program's sum in the same K order."""
    from sparse_compile.kernels.chunk_wgrad_triton import chunk_csr, chunk_order, chunk_wgrad, chunk_wgrad_ref

    torch.manual_seed(5)
    t, h, d, v, n, m, c = 128, 256, 80, 32, 2, 8, 16
    z = torch.randn(t, h) * torch.linspace(0.2, 3.0, h)
    _, r_c, ids = vnm_compact_ref(z.half(), None, v, n, m, c)
    b = torch.randn(t, d).half()
    want = chunk_wgrad_ref(r_c, ids, b, v, h).float()
    default = chunk_wgrad(r_c, ids, b, v, c, h, group_d=group_d)
    assert (default.float() - want).norm() / want.norm() < 2e-3
    reverse = chunk_order(chunk_csr(ids, c, h)[0]).flip(0).contiguous()
    assert torch.equal(chunk_wgrad(r_c, ids, b, v, c, h, order=reverse, group_d=group_d), default)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("v,c", [(32, 16), (16, 32), (48, 16)])
def test_colsum_kernel_matches_the_scattered_sum(interpreter, dtype, v, c):
    """db1 = scatter(dZ_c).sum(0) from the compact operand, chunk by chunk over the csr lists (V = 48:
    rows in steps of 16, three per block; c = 32 at V = 16: several entries per step, the last masked)."""
    from sparse_compile.kernels.chunk_wgrad_triton import chunk_colsum

    torch.manual_seed(3)
    t, h, n, m = 240 if v == 48 else 256, 512, 2, 8
    _, r_c, ids = vnm_compact_ref(torch.randn(t, h, dtype=dtype), None, v, n, m, c)
    a = torch.randn_like(r_c) * (r_c != 0)  # dZ~: any values, zero where R~ is
    want = vnm_scatter_ref(a, ids, v, h).double().sum(0)
    got = chunk_colsum(a, ids, v, c, h)
    assert got.shape == (h,) and got.dtype == dtype
    assert torch.allclose(got.double(), want, rtol=1e-3 if dtype == torch.float16 else 1e-6, atol=1e-3)
    assert (want != 0).float().mean() > 0.5  # most units kept by some block: a real check
    with pytest.raises(ValueError, match="c=8"):
        chunk_colsum(a, ids, v, 8, h)


@pytest.mark.parametrize("rows", [16, 48])
def test_colsum_takes_the_row_tile_sums(interpreter, rows):
    """db1 from B1's row-tile column sums (R = 16 or 48 rows, 3 or 1 tiles per 48-row block) equals
    db1 from dZ~ itself; sums of the wrong shape or dtype are refused by name."""
    from sparse_compile.kernels.chunk_wgrad_triton import chunk_colsum

    torch.manual_seed(4)
    t, v, h, c = 240, 48, 512, 16
    _, r_c, ids = vnm_compact_ref(torch.randn(t, h), None, v, 2, 8, c)
    a = torch.randn_like(r_c) * (r_c != 0)
    sums = a.view(t // rows, rows, -1).sum(1)
    want = vnm_scatter_ref(a, ids, v, h).double().sum(0)
    got = chunk_colsum(a, ids, v, c, h, tile_sums=sums)
    assert torch.allclose(got.double(), want, rtol=1e-6, atol=1e-4)
    assert torch.allclose(got, chunk_colsum(a, ids, v, c, h), rtol=1e-6, atol=1e-5)
    for bad in (sums.double(), sums[:-1], a.view(t // 15, 15, -1).sum(1)):
        with pytest.raises(ValueError, match="tile_sums"):
            chunk_colsum(a, ids, v, c, h, tile_sums=bad)


@pytest.mark.parametrize(
    "t,v,m,c,h", [(128, 32, 8, 16, 512), (4096, 16, 8, 16, 1024), (512, 16, 16, 32, 2048), (160, 32, 8, 16, 1536)]
)
def test_chunk_csr_kernel_equals_the_torch_reference(interpreter, t, v, m, c, h):
    """One launch instead of nine: the same offsets, blocks and columns (E = T/V x Kc/c entries:
    64, 2048 (two BLOCK_E tiles), 512 and 240 (96 chunks in 128 histogram bins, lanes past E)),
    including chunks no block kept; with the order, also chunk_order's ranking of the chunks."""
    from sparse_compile.kernels.chunk_wgrad_triton import _csr, chunk_csr, chunk_csr_ref, chunk_order

    g = torch.Generator().manual_seed(t + c)
    z = torch.randn(t, h, generator=g)
    z[:, : 4 * c] += 3.0  # the first chunks are kept by every block; with M*c < h some are never kept
    _, _, ids = vnm_compact_ref(z, None, v, 2, m, c)
    got, want = chunk_csr(ids, c, h), chunk_csr_ref(ids, c, h)
    for name, a, b in zip(("offsets", "blocks", "cols"), got, want, strict=True):
        assert a.dtype == torch.int32 and torch.equal(a, b), name
    counts = want[0].diff()  # the boosted chunks: kept by all T/V blocks; their group's others: by none
    assert counts.max() == t // v and (counts == 0).any()
    csr, order = _csr(ids, c, h, ordered=True)
    for a, b in zip(csr, want, strict=True):
        assert torch.equal(a, b)
    assert order.dtype == torch.int32 and torch.equal(order, chunk_order(want[0]))
    assert len(set(counts.tolist())) > 2  # ties and distinct counts both ranked
    with pytest.raises(ValueError, match="int32"):
        chunk_csr(ids.long(), c, h)


@pytest.mark.parametrize("split", [2, 3, 8])
@pytest.mark.parametrize("units_m", [False, True])
def test_weight_grad_kernel_split_k_matches_reference(interpreter, split, units_m):
    """split programs per output tile, each summing its share of the K steps into float32 partials:
    the same product (8 > the 4 K steps of some chunks: programs with no steps write zeros)."""
    from sparse_compile.kernels.chunk_wgrad_triton import chunk_wgrad, chunk_wgrad_ref

    torch.manual_seed(2)
    t, h, d, v, n, m, c = 128, 256, 40, 32, 2, 8, 16
    _, r_c, ids = vnm_compact_ref(torch.randn(t, h, dtype=torch.float16), None, v, n, m, c)
    b = torch.randn(t, d, dtype=torch.float16)
    for square, transpose in ((True, True), (False, False)):
        want = chunk_wgrad_ref(r_c, ids, b, v, h, square=square).float()
        got = chunk_wgrad(r_c, ids, b, v, c, h, square=square, transpose=transpose, split=split, units_m=units_m)
        assert got.dtype == torch.float16 and got.is_contiguous()
        got = got.t().float() if transpose else got.float()
        assert (got - want).norm() / want.norm() < 2e-3
        one = chunk_wgrad(r_c, ids, b, v, c, h, square=square, transpose=transpose, split=1)
        assert (got - (one.t() if transpose else one).float()).abs().max() <= 2e-3 * want.abs().max()
    with pytest.raises(ValueError, match="split=0"):
        chunk_wgrad(r_c, ids, b, v, c, h, split=0)


def _kept_selection(static: bool, t: int, h: int, v: int, m: int, c: int, dtype=torch.float16):
    """(r_c, ids) of a chunked selection: ``static``, every block keeps the same 4 chunks of the first
    two groups of M (as a training step from initialization keeps the same chunks everywhere) and
    random ones of the others; else chunks kept at random."""
    z = torch.randn(t, h)
    if static:
        z[:, : 4 * c] += 5.0
        z[:, 8 * c : 12 * c] += 5.0
    _, r_c, ids = vnm_compact_ref(z.to(dtype), None, v, 2, m, c)
    return r_c, ids


@pytest.mark.parametrize("static,programs", [(True, 4), (True, 9), (True, 13), (False, 5), (False, 12), (False, 17)])
def test_weight_grad_tail_schedule_matches_reference(interpreter, static, programs):
    """The TAIL schedule: the heavy tiles past the last full wave of ``programs`` SMs split into
    1-8 pieces (float32 partials, summed in a fixed order), every other tile (light chunks': kept by
    under half the blocks of the most-kept one; unkept chunks': zeros) one program in the grid;
    the product equals the reference and the one-program-per-tile grid to rounding, and every unit
    of an unkept chunk is exactly 0 in memory that held NaN."""
    from sparse_compile.kernels.chunk_wgrad_triton import chunk_csr, chunk_wgrad, chunk_wgrad_ref, tail_plan

    torch.manual_seed(programs)
    t, h, d, v, m, c = 128, 512, 80, 16, 8, 16
    r_c, ids = _kept_selection(static, t, h, v, m, c)
    b = torch.randn(t, d, dtype=torch.float16)
    counts = chunk_csr(ids, c, h)[0].diff()
    nh, whole, tail, pieces = tail_plan(counts.tolist(), 3, programs)  # BLOCK_D 32 on the CPU: 3 D tiles
    assert tail > 0 and pieces > 1 and nh < int((counts > 0).sum())  # a split tail, and light chunks
    assert (counts == 0).any() == static
    for square, transpose in ((True, True), (False, False)):
        want = chunk_wgrad_ref(r_c, ids, b, v, h, square=square).float()
        torch.full((h * d * 4,), float("nan"), dtype=torch.float16)  # freed: the output may reuse it
        got = chunk_wgrad(r_c, ids, b, v, c, h, square=square, transpose=transpose, tail=True, programs=programs)
        got = got.t().float() if transpose else got.float()
        assert torch.isfinite(got).all()
        assert (got - want).norm() / want.norm() < 2e-3
        grid = chunk_wgrad(r_c, ids, b, v, c, h, square=square, transpose=transpose, tail=False)
        grid = grid.t().float() if transpose else grid.float()
        assert (got - grid).abs().max() <= 2e-3 * want.abs().max()
        unkept = (counts == 0).repeat_interleave(c)
        assert torch.equal(got[unkept], torch.zeros_like(got[unkept]))


def test_tail_plan_splits_only_a_partly_filled_last_wave():
    """The schedule's numbers on 132 SMs: 2.7B's B2 / B4 with every block keeping the same 24 of 96
    chunks (12 D tiles): 264 tiles in two full waves, the last 24 in 5 pieces each, the same with
    light chunks besides (a step's: 40 kept by 2 blocks); with every chunk kept about as often, or
    1.3B's 16 of 64 chunks (8 D tiles: 128 tiles, one wave), or a full last wave: no split; 350M's
    8 of 32 (4 D tiles): all 32 tiles in 4 pieces; never more than 8 pieces."""
    from sparse_compile.kernels.chunk_wgrad_triton import tail_plan

    assert tail_plan([128] * 24 + [0] * 72, 12, 132) == (24, 264, 24, 5)
    assert tail_plan([128] * 20 + [70] * 4 + [2] * 40 + [0] * 32, 12, 132) == (24, 264, 24, 5)
    assert tail_plan([46, 23] + [32] * 94, 12, 132) == (96, 1152, 0, 1)
    assert tail_plan([32] * 96, 12, 132) == (96, 1152, 0, 1)
    assert tail_plan([128] * 16 + [0] * 48, 8, 132) == (16, 128, 0, 1)
    assert tail_plan([128] * 33 + [0] * 63, 12, 132) == (33, 396, 0, 1)
    assert tail_plan([128] * 8 + [0] * 24, 4, 132) == (8, 0, 32, 4)
    assert tail_plan([128] + [0] * 31, 4, 132) == (1, 0, 4, 8)


@triton.jit
def _plan_kernel(offsets_ptr, out_ptr, NCH, ND, P, NCP: tl.constexpr, MOST: tl.constexpr):
    """The four numbers of chunk_wgrad's _tail_plan into out_ptr[0:4]."""
    nh, whole, tail, pieces = _tail_plan(offsets_ptr, NCH, ND, P, NCP, MOST)
    tl.store(out_ptr + 0, nh)
    tl.store(out_ptr + 1, whole)
    tl.store(out_ptr + 2, tail)
    tl.store(out_ptr + 3, pieces)


def test_tail_plan_on_the_gpu_side_equals_the_host_mirror(interpreter):
    """_tail_plan (what every TAIL program computes from the csr offsets) against tail_plan (the host
    mirror the tests and benches read) on random kept counts: many chunks or one, a step's (a
    quarter kept by nearly every block), all kept alike, at each D-tile and SM count below (a draw
    where no chunk is kept is run, not compared: the host mirror needs a kept chunk)."""
    from sparse_compile.kernels.chunk_wgrad_triton import _MOST_PIECES, tail_plan

    g = torch.Generator().manual_seed(6)
    cases = 0
    for nch in (1, 24, 96, 128):
        for trial in range(4):
            counts = torch.randint(0, 129, (nch,), generator=g)
            if trial == 1:  # a step's: a quarter kept by nearly every block, the rest by a few or none
                counts = torch.where(torch.rand(nch, generator=g) < 0.25, 128 - counts % 4, counts % 3)
            if trial == 2:
                counts = torch.full((nch,), 32)
            offsets = torch.cat([torch.zeros(1, dtype=torch.long), counts.cumsum(0)]).to(torch.int32)
            for nd, p in ((12, 132), (8, 132), (3, 7), (4, 5)):
                out = torch.zeros(4, dtype=torch.int32)
                _plan_kernel[(1,)](offsets, out, nch, nd, p, NCP=triton.next_power_of_2(nch), MOST=_MOST_PIECES)
                if counts.max() > 0:
                    assert tuple(out.tolist()) == tail_plan(counts.tolist(), nd, p), (nch, trial, nd, p)
                    cases += 1
    assert cases >= 56


def test_weight_grad_tail_refuses_what_it_does_not_run(interpreter):
    from sparse_compile.kernels.chunk_wgrad_triton import chunk_wgrad

    r_c, ids = _kept_selection(False, 64, 256, 16, 8, 16)
    b = torch.randn(64, 32, dtype=torch.float16)
    for kw, what in (({"split": 2}, "split=2"), ({"units_m": True}, "units_m=True"), ({"programs": 0}, "programs=0")):
        with pytest.raises(ValueError, match=what):
            chunk_wgrad(r_c, ids, b, 16, 16, 256, tail=True, **kw)


def test_weight_grad_tail_with_no_tokens_is_zero(interpreter):
    """T = 0: no chunk kept anywhere (no heavy chunk, no tail); the product is all zeros."""
    from sparse_compile.kernels.chunk_wgrad_triton import chunk_wgrad

    a = torch.empty((0, 64), dtype=torch.float16)
    out = chunk_wgrad(a, torch.empty((0, 64), dtype=torch.int32), torch.empty((0, 32), dtype=torch.float16),
                      16, 16, 256, tail=True, programs=5)  # fmt: skip
    assert out.shape == (256, 32) and torch.equal(out, torch.zeros_like(out))


def test_split_is_the_smallest_power_of_two_with_four_programs_per_sm(monkeypatch):
    import sparse_compile.kernels.chunk_wgrad_triton as cw

    monkeypatch.setattr(cw, "sm_count", lambda index: 132)  # an H100
    cuda = torch.device("cuda")
    # (d, h) = (1024, 4096), c = 64, BLOCK_D = 256: 64 x 4 = 256 tiles -> 4; 1.3B (2048, 8192): 1024 -> 1
    assert [cw.split_for(tiles, cuda) for tiles in (256, 1024, 144, 1, 528, 527)] == [4, 1, 4, 8, 1, 2]
    assert cw.split_for(1, torch.device("cpu")) == 1


@pytest.mark.parametrize("kernels", ["reference", "triton"])
def test_compiled_model_matches_oracle(interpreter, kernels):
    """torch.compile(backend='sparse') with chunks: reference op on CPU, or the gather path with the
    chunked selection and block-sparse B2/B4 kernels under the interpreter; numbers = the oracle."""
    from sparse_compile.planning.plan import GATHER

    from .test_backend import assert_compiled_matches_oracle

    config = SparsityConfig(activations="16:2:8", chunk=16, kernels=kernels)
    report = assert_compiled_matches_oracle(config, torch.randn(2, 32, 32), 1e-4)
    assert len(report.sparse_sites) == 2
    if kernels == "triton":
        assert [s.kernel for s in report.sparse_sites] == [GATHER, GATHER]
    assert report.sparse_sites[0].patterns["B2"] == "A16:2:8c16"


def test_per_token_chunks_compiled_match_the_oracle_on_the_reference():
    """1:4:8 in chunks of 16 (per token) through torch.compile: the reference op (no gather kernel
    takes V = 1; the report says why), its output and gradients equal to the oracle's."""
    from .test_backend import assert_compiled_matches_oracle

    config = SparsityConfig(activations="1:4:8", chunk=16)
    report = assert_compiled_matches_oracle(config, torch.randn(2, 32, 32), 1e-4)
    assert [s.kernel for s in report.sparse_sites] == ["reference", "reference"]
    assert report.sparse_sites[0].patterns["F2"] == "A1:4:8c16"


def test_causal_chunks_compiled_match_the_oracle(interpreter):
    """chunk + causal through torch.compile on the gather path (interpreter): the oracle's output
    and gradients (the oracle: masked dense math with the causal chunked mask)."""
    from sparse_compile.planning.plan import GATHER

    from .test_backend import assert_compiled_matches_oracle

    config = SparsityConfig(activations="16:2:8", chunk=16, causal=True, kernels="triton")
    report = assert_compiled_matches_oracle(config, torch.randn(2, 32, 32), 1e-4)
    assert [s.kernel for s in report.sparse_sites] == [GATHER, GATHER]
    assert report.sparse_sites[0].patterns["B2"] == "A16:2:8c16 causal"


def test_chunks_the_kernels_cannot_take_run_the_reference():
    from sparse_compile.planning.plan import plan_kernels

    for config in (
        SparsityConfig(activations="128:2:16", chunk=8),
        SparsityConfig(activations="128:2:12", chunk=16),
        SparsityConfig(activations="128:2:16", chunk=32, weight_grad="tokens:128:2:16"),
    ):
        plan = plan_kernels(torch.device("cpu"), torch.float16, 256, dataclasses.replace(config, kernels="triton"))
        assert plan.kernel == "reference" and plan.why.startswith(f"chunks of {config.chunk}: the gather path needs")


def test_select_kernel_tilings_give_the_same_answer(interpreter):
    """Other rows per step of each pass and warps (bench.chunk_kernels --select-sweep) change no
    output, causal included; rows that are not powers of two dividing V are refused."""
    from sparse_compile.kernels.chunk_select_triton import select_tiling, vnm_select_chunks

    torch.manual_seed(5)
    v, n, m, c, seq = 16, 2, 8, 16, 32
    z = torch.randn(64, 2 * m * c, dtype=torch.float16)
    want = vnm_compact_ref(z, None, v, n, m, c, seq)
    assert select_tiling(m, c) == (16, 16, 4) and select_tiling(16, 128) == (4, 16, 8)
    for tiling in ((1, 4, 4), (4, 16, 8), (16, 2, 4)):
        got = vnm_select_chunks(z, None, v, n, m, c, seq, tiling)
        for name, a, b in zip(("h_c", "r_c", "ids"), got, want, strict=True):
            assert torch.equal(a, b), (tiling, name)
    for bad in ((3, 4, 4), (4, 32, 4)):
        with pytest.raises(ValueError, match="rows must be powers of two dividing V=16"):
            vnm_select_chunks(z, None, v, n, m, c, seq, bad)
