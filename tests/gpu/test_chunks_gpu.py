"""Neuron chunks on a real GPU: the chunked selection bit-exact at full size, the block-sparse
weight-gradient kernel against the dense product, the op against the reference op and the oracle,
and a compiled GPT that trains on it like on the reference kernels. Run by hand on H100/H200."""

import pytest
import torch

from sparse_compile import SparsityConfig
from sparse_compile.kernels.activation_mask import vnm_compact_ref
from sparse_compile.kernels.gather_reference import gather_k_mm_ref, gather_n_mm_ref, vnm_scatter_ref
from sparse_compile.planning.plan import GATHER

from ..oracle import oracle_ffn
from .test_cuda_reference import _rel, assert_trains_like_reference, train_gpt
from .test_gather_gpu import _poison, ffn_leaves, run_with_grads

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (the CPU path is in tests/)")


CHUNK_PATTERNS = [
    (128, 2, 16, 32), (128, 2, 16, 64), (128, 4, 16, 64), (128, 4, 8, 64), (128, 2, 8, 32), (64, 2, 8, 16)
]  # fmt: skip


@pytest.mark.parametrize("v,n,m,c", CHUNK_PATTERNS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("seq", [None, 2048], ids=["plain", "causal"])
def test_chunk_selection_is_bit_exact_at_full_size(v, n, m, c, dtype, seq):
    from sparse_compile.kernels.chunk_select_triton import vnm_select_chunks

    g = torch.Generator(device="cuda").manual_seed(c)
    z = torch.randn(16384, 8192, device="cuda", generator=g).to(dtype)
    bias = (0.1 * torch.randn(8192, device="cuda", generator=g)).to(dtype)
    _poison()
    got = vnm_select_chunks(z, bias, v, n, m, c, seq)
    want = vnm_compact_ref(z, bias, v, n, m, c, seq)
    for name, a, b in zip(("h_c", "r_c", "ids"), got, want, strict=True):
        assert torch.equal(a, b), name


@pytest.mark.parametrize("c", [32, 64, 128])
@pytest.mark.parametrize("tma", [False, True], ids=["pointers", "TMA"])
@pytest.mark.parametrize("units_m", [False, True], ids=["d-x-units", "units-x-d"])
@pytest.mark.parametrize("square,transpose", [(True, True), (False, False)], ids=["B2", "B4"])
def test_chunk_wgrad_matches_the_dense_product(c, tma, units_m, square, transpose):
    """d = 2000: the last 256-wide d tile is partial (masked stores; TMA zero-fills the loads)."""
    from sparse_compile.kernels.chunk_wgrad_triton import chunk_wgrad, chunk_wgrad_ref

    t, h, d = 16384, 8192, 2000
    g = torch.Generator(device="cuda").manual_seed(c)
    _, r_c, ids = vnm_compact_ref(torch.randn(t, h, device="cuda", generator=g).bfloat16(), None, 128, 4, 8, c)
    b = torch.randn(t, d, device="cuda", generator=g).bfloat16()
    _poison()
    if tma and square and units_m:
        with pytest.raises(ValueError, match="not built"):
            chunk_wgrad(r_c, ids, b, 128, c, h, square=square, transpose=transpose, tma=tma, units_m=units_m)
        return
    got = chunk_wgrad(r_c, ids, b, 128, c, h, square=square, transpose=transpose, tma=tma, units_m=units_m)
    want = chunk_wgrad_ref(r_c, ids, b, 128, h, square=square)
    assert torch.isfinite(got).all()
    assert _rel(got.t() if transpose else got, want) < 1e-2


@pytest.mark.parametrize("kept", [24, 48, 96], ids=["24-static", "48-two-halves", "random"])
@pytest.mark.parametrize("square,transpose", [(True, True), (False, False)], ids=["B2", "B4"])
def test_chunk_wgrad_tail_schedule_at_the_2_7b_shape(kept, square, transpose):
    """(T, d, h) = (16384, 3072, 12288), 128:4:16 in chunks of 128 (6 groups of 16 chunks): every
    block keeping the same 4 chunks of each group (24 chunks: 2 waves + 24 tiles in 5 pieces on 132
    SMs), the first half of the blocks 4 and the second half 4 others (48: 4 waves + 48 tiles in 2
    pieces), or random chunks (on an H100 93 heavy ones: 8 waves + 60 tiles in 2 pieces); the TAIL
    schedule (the default) gives the dense product and the one-program-per-tile grid's to rounding,
    and exact zeros for the chunks no block keeps."""
    from sparse_compile.kernels.chunk_wgrad_triton import chunk_csr, chunk_wgrad, chunk_wgrad_ref, tail_plan
    from sparse_compile.kernels.gather_gemm_triton import sm_count

    t, d, h, c = 16384, 3072, 12288, 128
    g = torch.Generator(device="cuda").manual_seed(kept)
    z = torch.randn(t, h, device="cuda", generator=g).view(t, h // (16 * c), 16, c)
    if kept < 96:  # chunks 0-3 of every group far above the rest; with 48, chunks 4-7 in the second half
        z[:, :, :4] += 8.0
        if kept == 48:
            z[t // 2 :, :, :4] -= 8.0
            z[t // 2 :, :, 4:8] += 8.0
    _, r_c, ids = vnm_compact_ref(z.reshape(t, h).bfloat16(), None, 128, 4, 16, c)
    del z
    b = torch.randn(t, d, device="cuda", generator=g).bfloat16()
    counts = chunk_csr(ids, c, h)[0].diff()
    plan = tail_plan(counts.tolist(), d // 256, sm_count(None))
    print(f"kept {kept}: {int((counts > 0).sum())} chunks kept by some block; (nh, whole, tail, pieces) {plan}")
    _poison()
    got = chunk_wgrad(r_c, ids, b, 128, c, h, square=square, transpose=transpose)
    _poison()
    grid = chunk_wgrad(r_c, ids, b, 128, c, h, square=square, transpose=transpose, tail=False)
    want = chunk_wgrad_ref(r_c, ids, b, 128, h, square=square)
    got, grid = (got.t(), grid.t()) if transpose else (got, grid)
    assert torch.isfinite(got).all()
    assert _rel(got, want) < 1e-2
    assert _rel(got, grid) < 5e-3
    unkept = (counts == 0).repeat_interleave(c)
    assert torch.equal(got[unkept], torch.zeros_like(got[unkept]))


@pytest.mark.parametrize("score", [16, 32])
def test_f1_on_the_scoring_rows_at_the_2_7b_shape(score):
    """f1_scored_chunks (Z on the scoring rows by cuBLAS, R~ and H~ on the kept chunks by the
    gather-N GEMM's activation epilogue) at (16384, 3072, 12288), causal 128:4:16 in chunks of 128,
    sequences of 2048, bf16, outputs poisoned: against the selection kernel on the full Z, the same
    chunks for >= 98% of the (block, group) choices (Z's rows come from cuBLAS on fewer rows: chunk
    norms a rounding apart may swap), and R~, H~ to bf16 rounding wherever the units agree."""
    import torch.nn.functional as F

    from sparse_compile.kernels.chunk_score_triton import f1_scored_chunks
    from sparse_compile.kernels.chunk_select_triton import vnm_select_chunks

    t, d, h, c = 16384, 3072, 12288, 128
    g = torch.Generator(device="cuda").manual_seed(score)
    x = torch.randn(t, d, device="cuda", generator=g).bfloat16()
    w1 = (torch.randn(h, d, device="cuda", generator=g) * d**-0.5).bfloat16()
    b1 = (torch.randn(h, device="cuda", generator=g) * 0.1).bfloat16()
    _poison()
    h_c, r_c, ids, _ = f1_scored_chunks(x, w1, b1, 128, 16, c, 2048, score)
    want_h, want_r, want_ids = vnm_select_chunks(F.linear(x, w1, b1), None, 128, 4, 16, c, 2048, score_rows=score)
    groups = (ids == want_ids).view(t // 128, -1, 4 * c).all(-1)  # [blocks, groups]
    print(f"score {score}: {groups.float().mean().item():.4f} of the (block, group) choices agree")
    assert groups.float().mean().item() >= 0.98
    same = (ids == want_ids).repeat_interleave(128, dim=0)
    assert torch.isfinite(r_c).all() and (r_c >= 0).all()
    assert _rel(r_c[same], want_r[same]) < 1e-2 and _rel(h_c[same], want_h[same]) < 1e-2
    assert torch.equal(h_c, (r_c.float() * r_c.float()).bfloat16())


@pytest.mark.parametrize("c", [16, 32, 64, 128])
@pytest.mark.parametrize("persistent", [False, True])
def test_gathers_read_w2_in_place(c, persistent):
    """F2 and B1 on W2 [d, h] read in place (w2.t(), vector loads along the chunk runs; at c = 128
    each run's slab through a TMA descriptor) agree with the same kernels on a contiguous W2^T as
    plain gathered rows to bf16 rounding (autotuned apart, the tiles may differ; a wrong run hint or
    slab origin reads other units' weights: an O(1) difference), and B3's gather of W1's rows
    along the runs with the reference."""
    from sparse_compile.kernels.chunk_select_triton import vnm_select_chunks
    from sparse_compile.kernels.gather_gemm_triton import gather_k_mm, gather_n_mm

    t, h, d = 16384, 8192, 2048
    g = torch.Generator(device="cuda").manual_seed(c)
    h_c, r_c, ids = vnm_select_chunks(torch.randn(t, h, device="cuda", generator=g).bfloat16(), None, 128, 4, 16, c)
    w2 = torch.randn(d, h, device="cuda", generator=g).bfloat16()
    dy = torch.randn(t, d, device="cuda", generator=g).bfloat16()
    b2 = torch.randn(d, device="cuda", generator=g).bfloat16()
    w2t = w2.t().contiguous()
    _poison()
    y = gather_k_mm(h_c, ids, w2.t(), 128, b2, chunk=c)
    assert _rel(y, gather_k_mm(h_c, ids, w2t, 128, b2)) < 5e-3
    dz = gather_n_mm(dy, w2.t(), ids, 128, r_c, persistent=persistent, chunk=c)
    assert _rel(dz, gather_n_mm(dy, w2t, ids, 128, r_c, persistent=persistent)) < 5e-3
    assert _rel(y, gather_k_mm_ref(h_c, ids, w2t, 128, b2)) < 1e-2
    assert _rel(dz, gather_n_mm_ref(dy, w2t, ids, 128, r_c)) < 1e-2
    w1 = torch.randn(h, d, device="cuda", generator=g).bfloat16()
    dx = gather_k_mm(dz, ids, w1, 128, chunk=c)
    assert _rel(dx, gather_k_mm_ref(dz, ids, w1, 128)) < 1e-2


@pytest.mark.parametrize("h,c", [(4096, 64), (8192, 64), (8192, 32), (12288, 64), (4096, 128), (12288, 128)])
def test_chunk_csr_kernel_equals_torch_at_full_size(h, c):
    """The csr lists, and for the c = 128 tile (chunk_plan) the chunks' order from the same launch."""
    from sparse_compile.kernels.chunk_wgrad_triton import chunk_csr_ref, chunk_order, chunk_plan

    g = torch.Generator(device="cuda").manual_seed(h + c)
    _, _, ids = vnm_compact_ref(torch.randn(16384, h, device="cuda", generator=g).bfloat16(), None, 128, 4, 16, c)
    _poison()
    (csr, order), want = chunk_plan(ids, c, h), chunk_csr_ref(ids, c, h)
    for name, a, b in zip(("offsets", "blocks", "cols"), csr, want, strict=True):
        assert torch.equal(a, b), name
    assert (order is None) == (c < 128)
    if order is not None:
        assert torch.equal(order, chunk_order(want[0]))


@pytest.mark.parametrize("split", [None, 1, 2, 8])
@pytest.mark.parametrize("square,transpose", [(True, True), (False, False)], ids=["B2", "B4"])
def test_chunk_wgrad_split_k_at_the_350m_shape(split, square, transpose):
    """(T, d, h) = (16384, 1024, 4096), c = 64: 256 output tiles, where split-K applies (None: the
    default rule, 4 on an H100); every split gives the dense product."""
    from sparse_compile.kernels.chunk_wgrad_triton import chunk_wgrad, chunk_wgrad_ref

    t, h, d, c = 16384, 4096, 1024, 64
    g = torch.Generator(device="cuda").manual_seed(7)
    _, r_c, ids = vnm_compact_ref(torch.randn(t, h, device="cuda", generator=g).bfloat16(), None, 128, 4, 16, c)
    b = torch.randn(t, d, device="cuda", generator=g).bfloat16()
    _poison()
    got = chunk_wgrad(r_c, ids, b, 128, c, h, square=square, transpose=transpose, split=split)
    want = chunk_wgrad_ref(r_c, ids, b, 128, h, square=square)
    assert torch.isfinite(got).all()
    assert _rel(got.t() if transpose else got, want) < 1e-2


@pytest.mark.parametrize("h,c", [(4096, 64), (8192, 64), (8192, 32)])
def test_chunk_colsum_at_full_size(h, c):
    """B4's db1 from the compact dZ~ against the dense column sums, causal chunks of 2048-token sequences."""
    from sparse_compile.kernels.chunk_select_triton import vnm_select_chunks
    from sparse_compile.kernels.chunk_wgrad_triton import chunk_colsum

    g = torch.Generator(device="cuda").manual_seed(h + c)
    z = torch.randn(16384, h, device="cuda", generator=g).bfloat16()
    _, r_c, ids = vnm_select_chunks(z, None, 128, 4, 16, c, 2048)
    dz_c = (torch.randn(r_c.shape, device="cuda", generator=g) * (r_c != 0)).bfloat16()
    _poison()
    got = chunk_colsum(dz_c, ids, 128, c, h)
    want = vnm_scatter_ref(dz_c, ids, 128, h).float().sum(0)
    assert torch.isfinite(got).all()
    assert _rel(got, want) < 5e-3


@pytest.mark.parametrize("persistent", [False, True])
def test_b1_tile_sums_give_db1_at_full_size(persistent):
    """B1 with its epilogue's row-tile column sums (1.3B shape, causal 128:4:16, c = 64): the same
    dZ~ as without them, sums equal to dZ~'s own, and db1 from them equal to the dense column sums."""
    from sparse_compile.kernels.chunk_select_triton import vnm_select_chunks
    from sparse_compile.kernels.chunk_wgrad_triton import chunk_colsum
    from sparse_compile.kernels.gather_gemm_triton import gather_n_mm

    t, h, d, c = 16384, 8192, 2048, 64
    g = torch.Generator(device="cuda").manual_seed(11)
    z = torch.randn(t, h, device="cuda", generator=g).bfloat16()
    _, r_c, ids = vnm_select_chunks(z, None, 128, 4, 16, c, 2048)
    w2 = (torch.randn(d, h, device="cuda", generator=g) * d**-0.5).bfloat16()
    dy = torch.randn(t, d, device="cuda", generator=g).bfloat16()
    _poison()
    dz, sums = gather_n_mm(dy, w2.t(), ids, 128, r_c, persistent=persistent, chunk=c, tile_sums=True)
    rows = t // sums.shape[0]
    assert 128 % rows == 0 and torch.isfinite(sums).all()
    assert _rel(dz, gather_n_mm(dy, w2.t(), ids, 128, r_c, persistent=persistent, chunk=c)) < 5e-3
    assert _rel(sums, dz.float().view(-1, rows, dz.shape[1]).sum(1)) < 1e-5
    db1 = chunk_colsum(dz, ids, 128, c, h, tile_sums=sums)
    assert _rel(db1, vnm_scatter_ref(dz, ids, 128, h).float().sum(0)) < 5e-3
    # and H~ = round(r_c^2) for B2, bit-exact, dZ~ as without it (the op's call: sums and H~ together)
    sq = torch.full_like(r_c, float("nan"))
    dz_sq, sums_sq = gather_n_mm(
        dy, w2.t(), ids, 128, r_c, persistent=persistent, chunk=c, tile_sums=True, square_out=sq
    )
    assert torch.equal(sq, (r_c.float() * r_c.float()).bfloat16())
    assert _rel(dz_sq, dz) < 5e-3 and _rel(sums_sq, sums) < 5e-3  # tuned apart: tiles may differ


@pytest.mark.parametrize("activations,chunk", [("128:2:16", 32), ("128:2:16", 64), ("128:4:16", 128)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_chunk_op_matches_reference_op_and_oracle(activations, chunk, dtype):
    config = SparsityConfig(activations=activations, chunk=chunk)
    leaves = ffn_leaves(2, dtype)
    ops = torch.ops.sparse_compile
    outs = {}
    for name, op in (("gather", ops.sqrelu_ffn_vnm), ("reference", ops.sqrelu_ffn)):
        _poison()
        outs[name] = run_with_grads(op, leaves, None, config.op_spec())
        assert all(torch.isfinite(o).all() for o in outs[name]), name
    y_ref, _ = oracle_ffn(*(t.detach() for t in leaves), config)
    for i, (a, b) in enumerate(zip(outs["gather"], outs["reference"], strict=True)):
        assert _rel(a, b) < 1e-2, f"output {i}: chunked gather vs reference op"
    assert _rel(outs["gather"][0], y_ref) < 1e-2


@pytest.mark.parametrize("h", [8192, 12288])
def test_mass_dz_kernel_at_full_size(h):
    """kernels/mass_dz_triton.py at the 1.3B / 2.7B shapes (T = 16384, causal 128:4:16 in chunks of 128, 16 scoring
    rows, sequences of 2048), bf16, output poisoned: against mass_dz_ref, the same support, to bf16 rounding."""
    from sparse_compile.kernels.mass_dz_triton import mass_dz
    from sparse_compile.kernels.scored_mass_loss import mass_dz_ref

    t, v, s, seq = 16384, 128, 16, 2048
    g = torch.Generator(device="cuda").manual_seed(h)
    z = torch.randn(t, h, device="cuda", generator=g).bfloat16()
    _, _, ids = vnm_compact_ref(z, None, v, 4, 16, 128, seq, s)
    zs = torch.randn(t // v * s + t // seq, h, device="cuda", generator=g).bfloat16()
    zs[3] = -1.0  # a row without mass
    _poison()
    got, want = mass_dz(zs, ids, v, s, seq, 0.1), mass_dz_ref(zs, ids, v, s, seq, 0.1)
    assert torch.isfinite(got).all() and got[3].abs().sum() == 0
    assert torch.equal(got != 0, want != 0)
    torch.testing.assert_close(got.float(), want.float(), rtol=1e-2, atol=0)  # each element: one bf16 rounding apart


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_mass_loss_on_the_scoring_rows_matches_the_reference_op(dtype):
    """mass_loss_rows='scoring' on the chunked path (causal 128:4:16 in chunks of 128 scored on 16 rows: dZ on
    the scoring rows from the forward's Z, its own GEMMs in the backward, kernels/scored_mass_loss.py) against
    the reference op, outputs poisoned: every output without and with the term, and the term's own share of dX,
    dW1, db1 (with minus without); lambda so large that the share outweighs the rest (its rounding then small)."""
    options = {"activations": "128:4:16", "chunk": 128, "causal": True, "score_rows": 16}
    leaves = ffn_leaves(3, dtype)
    ops = torch.ops.sparse_compile
    outs = {}
    for lam in (0.0, 1e6):
        extra = {"mass_loss": lam, "mass_loss_rows": "scoring"} if lam else {}
        spec = SparsityConfig(**options, **extra).op_spec()
        for name, op in (("gather", ops.sqrelu_ffn_vnm), ("reference", ops.sqrelu_ffn)):
            _poison()
            outs[name, lam] = run_with_grads(op, leaves, None, spec)
            assert all(torch.isfinite(o).all() for o in outs[name, lam]), (name, lam)
        for i, (a, b) in enumerate(zip(outs["gather", lam], outs["reference", lam], strict=True)):
            assert _rel(a, b) < 1e-2, f"output {i}, lambda {lam}: gather vs reference op"
    for i in (1, 2, 3):  # dx, dw1, db1
        got = outs["gather", 1e6][i].float() - outs["gather", 0.0][i].float()
        want = outs["reference", 1e6][i].float() - outs["reference", 0.0][i].float()
        assert want.norm() > outs["reference", 0.0][i].float().norm(), f"output {i}: the term outweighs the rest"
        assert _rel(got, want) < 2e-2, f"output {i}: the term's share"
    assert torch.equal(outs["gather", 1e6][4], outs["gather", 0.0][4])  # dW2 sees the kept H alone


@pytest.mark.parametrize(
    "options",
    [
        {"activations": "128:2:16", "chunk": 32},
        {},
        {"score_rows": None},
        {"mass_loss": 0.1, "mass_loss_rows": "scoring"},
    ],
    ids=["128:2:16-c32", "default", "all-rows", "mass-loss-scoring"],
)
def test_gpt_trains_on_chunk_kernels_like_on_reference_kernels(options):
    """The chunk kernels' curve against the reference kernels' (assert_trains_like_reference); {} is
    the default options (causal 128:4:16 in chunks of 128, or the largest chunk the hidden size takes,
    scored on the previous block's last 16 rows: F1 on those rows and the kept chunks on the fast
    path); all-rows: the same pattern scored on all 128 rows (F1 in full, then the selection);
    mass-loss-scoring: the default with the mass loss on its scoring rows (kernels/scored_mass_loss.py)."""
    fast, kernels, _ = train_gpt({**options, "kernels": "auto"})
    assert kernels == {GATHER}
    assert_trains_like_reference(fast, options)


def test_fast_launch_is_bit_equal_to_triton_s_launch_path():
    """The chunked FFN's forward and backward kernels (causal 128:4:16 in chunks of 128: the c = 128
    tile with its in-kernel chunk order; and 128:4:8 in chunks of 64), two shapes interleaved so each
    launcher's signatures alternate (the gather-N's tuned row tile, read after each launch, differs
    between them), through kernels/launch.py and through Triton's own path: equal bit for bit."""
    from sparse_compile.kernels.chunk_wgrad_triton import _csr, chunk_csr_ref, chunk_order
    from sparse_compile.kernels.ffn_gather import sqrelu_ffn_backward_gather, sqrelu_ffn_forward_gather
    from sparse_compile.kernels.launch import triton_path

    g = torch.Generator(device="cuda").manual_seed(0)

    def r(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(*shape, device="cuda", generator=g) * scale).bfloat16()

    cases = []
    for (t, d, h), (v, n, m, c) in (((16384, 1024, 4096), (128, 4, 16, 128)), ((8192, 2048, 8192), (128, 4, 8, 64))):
        x, w1, b1, w2, b2, dy = r(t, d), r(h, d, scale=0.03), r(h, scale=0.1), r(d, h, scale=0.02), r(d), r(t, d)
        cases.append((x, w1, b1, w2, b2, dy, v, n, m, c))

    def run(x, w1, b1, w2, b2, dy, v, n, m, c):
        y, r_c, ids, _ = sqrelu_ffn_forward_gather(x, w1, b1, w2, b2, v, n, m, None, frozenset(), c, 2048)
        return (y, r_c, ids, *sqrelu_ffn_backward_gather(dy, x, w1, w2, r_c, ids, v, m, chunk=c))

    fast = [[run(*case) for case in cases] for _ in range(3)][-1]  # signatures seen: the compiled launchers
    with triton_path():
        slow = [run(*case) for case in cases]
    for got, want in zip(fast, slow, strict=True):
        for name, a, b in zip(("y", "r_c", "ids", "dx", "dw1", "db1", "dw2", "db2"), got, want, strict=True):
            assert torch.equal(a, b), name
    ids = fast[0][2]
    csr, order = _csr(ids, 128, 4096, ordered=True)
    assert torch.equal(order, chunk_order(chunk_csr_ref(ids, 128, 4096)[0]))
