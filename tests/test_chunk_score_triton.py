"""Causal chunked patterns scored on the previous block's last S rows (``score_rows``): the
reference, the selection kernel, F1 on the scoring rows plus the gather GEMM's activation epilogue
(Triton interpreter, fp16/fp32), the config field and the compiled model against the oracle."""

import pytest
import torch
import torch.nn.functional as F

from sparse_compile import SparsityConfig
from sparse_compile.kernels.activation_mask import vnm_compact_ref, vnm_mask


def _h(t: int, f: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.rand(t, f, generator=g) ** 4


def test_scoring_all_rows_is_the_causal_pattern():
    h = _h(128, 128, 0)
    assert torch.equal(vnm_mask(h, 16, 2, 8, 4, seq=64, score_rows=16), vnm_mask(h, 16, 2, 8, 4, seq=64))
    assert not torch.equal(vnm_mask(h, 16, 2, 8, 4, seq=64, score_rows=4), vnm_mask(h, 16, 2, 8, 4, seq=64))


def test_only_the_previous_blocks_last_rows_choose():
    """Block 2 (rows 32-47, V = 16) is chosen from rows 28-31 with score 4: rows 16-27 change
    nothing, row 30 does (it is made to dominate one chunk); no later row changes rows before it."""
    v, s = 16, 4
    h = _h(64, 128, 1)
    base = vnm_mask(h, v, 4, 8, 4, seq=64, score_rows=s)
    early = h.clone()
    early[16:28] = _h(12, 128, 2) * 100
    assert torch.equal(vnm_mask(early, v, 4, 8, 4, seq=64, score_rows=s)[32:48], base[32:48])
    late = h.clone()
    dropped = (~base[32, :32]).nonzero()[0, 0].item() // 4  # a chunk of group 0 that block 2 drops
    late[30, dropped * 4 : dropped * 4 + 4] = 100.0
    assert vnm_mask(late, v, 4, 8, 4, seq=64, score_rows=s)[32:48, dropped * 4].all()
    ahead = h.clone()
    ahead[40:] = _h(24, 128, 3)
    assert torch.equal(vnm_mask(ahead, v, 4, 8, 4, seq=64, score_rows=s)[:40], base[:40])


@pytest.mark.parametrize("bad", [0, 17, True, 2.0])
def test_config_validates_score_rows(bad):
    with pytest.raises(ValueError, match=r"SparsityConfig.score_rows=.*expected None or an int in \[1, V\] \(V=16\)"):
        SparsityConfig(activations="16:4:8", chunk=16, causal=True, score_rows=bad)
    for kw in ({"causal": False, "chunk": 16}, {"causal": True, "chunk": 1}):
        with pytest.raises(ValueError, match=r"with causal=True and chunk > 1"):
            SparsityConfig(activations="16:4:8", score_rows=4, **kw)
    spec = SparsityConfig(activations="16:4:8", chunk=16, causal=True, score_rows=4).op_spec()
    assert spec.endswith(";chunk=16;causal=1;score_rows=4")


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_select_kernel_scores_the_last_rows(interpreter, n, dtype):
    from sparse_compile.kernels.chunk_select_triton import vnm_select_chunks

    torch.manual_seed(n)
    z = torch.randn(128, 256, dtype=dtype)
    for b in (None, torch.randn(256, dtype=dtype)):
        got = vnm_select_chunks(z, b, 16, n, 8, 16, 64, score_rows=4)
        for name, a, r in zip(("h_c", "r_c", "ids"), got, vnm_compact_ref(z, b, 16, n, 8, 16, 64, 4), strict=True):
            assert torch.equal(a, r), name


def test_scored_ids_from_the_scoring_rows_equal_the_reference(interpreter):
    """scoring_rows + scored_ids (Z on T/V x S + T/seq rows) choose what the reference chooses
    from the full Z (float32: F.linear's rows do not depend on the other rows here)."""
    from sparse_compile.kernels.chunk_score_triton import scored_ids, scoring_rows

    g = torch.Generator().manual_seed(5)
    t, d, h, v, m, c, seq = 256, 32, 512, 32, 8, 16, 128
    x, w1, b1 = torch.randn(t, d, generator=g), torch.randn(h, d, generator=g), torch.randn(h, generator=g)
    z = F.linear(x, w1, b1)
    for s in (1, 4, 32):
        rows = torch.cat([(torch.arange(t // v)[:, None] * v + v - s + torch.arange(s)).reshape(-1),
                          torch.arange(t // seq) * seq])  # fmt: skip
        assert torch.equal(scoring_rows(x, v, s, seq), x[rows])
        want = vnm_compact_ref(z, None, v, 4, m, c, seq, s)[2]
        assert torch.equal(scored_ids(z[rows], t, v, m, c, seq, s), want), s
    with pytest.raises(ValueError, match="score_rows=0"):
        scoring_rows(x, v, 0, seq)


@pytest.mark.parametrize("dtype,tol", [(torch.float16, 2e-3), (torch.float32, 1e-5)])
def test_gather_n_activation_epilogue(interpreter, dtype, tol):
    """gather_n_mm(act=True): relu(round(X W1[ids]^T + b1[ids])) and its square, against F.linear
    on the full Z then the kept columns; unkept units never read."""
    from sparse_compile.kernels.gather_gemm_triton import gather_n_mm

    g = torch.Generator().manual_seed(7)
    t, d, h, v, c = 64, 32, 256, 16, 16
    x = torch.randn(t, d, generator=g).to(dtype)
    w1 = torch.randn(h, d, generator=g).to(dtype)
    b1 = torch.randn(h, generator=g).to(dtype)
    ids = vnm_compact_ref(torch.randn(t, h, generator=g), None, v, 4, 8, c)[2]
    rows = ids.long().repeat_interleave(v, dim=0)
    z = F.linear(x.float(), w1.float(), b1.float()).to(dtype)
    for bias in (b1, None):
        want_z = z if bias is not None else F.linear(x.float(), w1.float()).to(dtype)
        want_r = torch.relu(want_z).gather(1, rows)
        sq = torch.full_like(want_r, float("nan"))
        r = gather_n_mm(x, w1, ids, v, chunk=c, act=True, bias=bias, square_out=sq)
        torch.testing.assert_close(r, want_r, rtol=tol, atol=tol)
        torch.testing.assert_close(sq, (r.float() * r.float()).to(dtype), rtol=0, atol=0)
    with pytest.raises(ValueError, match="act=True .* takes no r"):
        gather_n_mm(x, w1, ids, v, r=want_r, chunk=c, act=True)
    with pytest.raises(ValueError, match="bias .* needs act=True"):
        gather_n_mm(x, w1, ids, v, chunk=c, bias=b1)


def test_f1_on_the_scoring_rows_and_kept_chunks_equals_the_selection(interpreter):
    """f1_scored_chunks (no [T, h] Z) gives the (h_c, r_c, ids) the selection kernel gives on the
    full Z, float32 under the interpreter."""
    from sparse_compile.kernels.chunk_score_triton import f1_scored_chunks
    from sparse_compile.kernels.chunk_select_triton import vnm_select_chunks
    from sparse_compile.kernels.scored_mass_loss import scoring_row_index

    g = torch.Generator().manual_seed(9)
    t, d, h, v, m, c, seq = 128, 32, 256, 16, 8, 16, 64
    x, w1, b1 = torch.randn(t, d, generator=g), torch.randn(h, d, generator=g), torch.randn(h, generator=g)
    for s in (2, 8):
        got = f1_scored_chunks(x, w1, b1, v, m, c, seq, s)
        want = vnm_select_chunks(F.linear(x, w1, b1), None, v, 4, m, c, seq, score_rows=s)
        assert torch.equal(got[2], want[2])
        torch.testing.assert_close(got[3], F.linear(x, w1, b1)[scoring_row_index(t, v, s, seq, x.device)])
        for a, b in zip(got[:2], want[:2], strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("n", [2, 4])
def test_compiled_model_scored_on_rows_matches_the_oracle(interpreter, n):
    """torch.compile(backend='sparse') with score_rows on the gather path (N = 4: F1 on the
    scoring rows and the kept chunks; N = 2: the full F1 and the selection kernel): the oracle's
    output and gradients (the oracle: masked dense math, mask from the last 4 rows of each block)."""
    from sparse_compile.planning.plan import GATHER

    from .test_backend import assert_compiled_matches_oracle

    config = SparsityConfig(activations=f"16:{n}:8", chunk=16, causal=True, score_rows=4, kernels="triton")
    report = assert_compiled_matches_oracle(config, torch.randn(2, 32, 32), 1e-4)
    assert [s.kernel for s in report.sparse_sites] == [GATHER, GATHER]
    assert report.sparse_sites[0].patterns["B2"] == f"A16:{n}:8c16 causal s4"


def test_cuda_plan_says_where_f1_runs_on_the_scoring_rows(monkeypatch):
    """On an sm90 GPU the default's plan tells the report that F1 runs on the scoring rows and the kept
    chunks; where the op computes F1 in full (all rows scored, N = 2, or not causal) it says nothing of it."""
    import dataclasses

    from sparse_compile import PRESETS
    from sparse_compile.planning.plan import GATHER, plan_kernels

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    cuda = torch.device("cuda", 0)
    default = PRESETS["chunked"]
    plan = plan_kernels(cuda, torch.bfloat16, 16384, default, 2048, 8192)
    assert plan.kernel == GATHER and plan.f1_alg is None
    assert plan.gemm_why.startswith("chunks of 128: F1 on each block's last 16 rows (cuBLAS) and its kept chunks")
    for other in (
        dataclasses.replace(default, score_rows=None),
        dataclasses.replace(default, score_rows=128),
        dataclasses.replace(default, activations="128:2:16"),
    ):
        assert "F1" not in plan_kernels(cuda, torch.bfloat16, 16384, other, 2048, 8192).gemm_why
