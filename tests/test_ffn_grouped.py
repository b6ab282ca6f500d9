"""Per-token chunks on grouped GEMMs (kernels/ffn_grouped.py, ops/ffn_grouped.py, the plan's "grouped GEMM"):
the choice against the token-by-token definition, ties included; the row sort and its inverse exact;
forward and gradients against the masked dense reference on random data, an unchosen chunk included;
the compiled model against the oracle and against the reference kernels after a re-clustering;
causality by perturbation; the plan's choices and reasons. torch._grouped_mm runs on CPU in float32."""

import copy

import pytest
import torch

import sparse_compile
from sparse_compile import SparsityConfig, compile_reports
from sparse_compile.kernels import sqrelu_ffn_backward_ref, sqrelu_ffn_forward_ref
from sparse_compile.kernels.ffn_grouped import (
    choice_mask,
    chunk_choice,
    chunk_rows,
    grouped_ffn_backward,
    grouped_ffn_forward,
)
from sparse_compile.planning.plan import GROUPED, plan_kernels

from .oracle import score_units_loop
from .test_backend import assert_compiled_matches_oracle
from .test_causal import _FFN, outputs_up_to


def _leaves(t: int, d: int, h: int, d_out: int, seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    r = lambda *s, scale=1.0: torch.randn(*s, generator=g) * scale  # noqa: E731
    return r(t, d), r(h, d, scale=d**-0.5), r(h, scale=0.3), r(d_out, h, scale=h**-0.5), r(d_out)


@pytest.mark.parametrize(("m", "c", "r"), [(8, 4, 1), (16, 8, 3), (8, 16, None), (8, 8, 2)])
def test_choice_is_each_tokens_chunks_by_their_first_units(m, c, r):
    x, w1, b1, _, _ = _leaves(40, 16, 2 * m * c, 8, m + c)
    choice = chunk_choice(x, w1, b1, m, c, r)
    assert choice.shape == (40, 2 * 4)  # two runs of M chunks, 4 kept in each
    h = torch.relu(torch.nn.functional.linear(x, w1, b1)) ** 2
    assert torch.equal(choice_mask(choice, 2 * m * c, c), score_units_loop(h, m, c, r or c))


def test_ties_go_to_the_lower_chunk():
    """Units pushed below zero by their bias score 0: many chunks tie, and the lower ones win."""
    x, w1, b1, _, _ = _leaves(32, 16, 128, 8, 1)
    b1[torch.rand(128, generator=torch.Generator().manual_seed(2)) < 0.7] = -50.0
    h = torch.relu(torch.nn.functional.linear(x, w1, b1)) ** 2
    for r in (1, 2, 8):
        scores = h.view(32, 16, 8)[..., :r].sum(-1)
        assert (scores == 0).sum(-1).max() > 4  # more than 4 chunks tie at zero for some token
        assert torch.equal(choice_mask(chunk_choice(x, w1, b1, 16, 8, r), 128, 8), score_units_loop(h, 16, 8, r))


def test_rows_are_sorted_by_chunk_and_inv_undoes_the_sort():
    choice = torch.stack([torch.randperm(12, generator=torch.Generator().manual_seed(i))[:3] for i in range(20)])
    src, chunk, offs, inv = chunk_rows(choice, 12)
    assert torch.equal(chunk, choice.reshape(-1)[torch.argsort(choice.reshape(-1), stable=True)])
    assert torch.equal(offs.long(), torch.bincount(choice.reshape(-1), minlength=12).cumsum(0))
    assert torch.equal(choice.reshape(-1)[src * 3 + (inv.argsort() % 3)], chunk)  # row i is (src[i], chunk[i])
    assert torch.equal(src[inv].view(20, 3), torch.arange(20)[:, None].expand(20, 3))
    for e in range(12):  # tokens ascending within a chunk: the sort is stable
        rows = src[(chunk == e).nonzero().squeeze(1)]
        assert torch.equal(rows, rows.sort().values)


@pytest.mark.parametrize(("m", "c", "r"), [(16, 8, 3), (8, 16, None)])
def test_forward_and_gradients_match_the_masked_reference(m, c, r):
    t, d, h, d_out = 48, 16, 2 * m * c, 24
    x, w1, b1, w2, b2 = _leaves(t, d, h, d_out, m * c)
    b1[:c] = -50.0  # chunk 0 scores 0 for every token: no token keeps it, its group is empty
    choice = chunk_choice(x, w1, b1, m, c, r)
    assert not (choice == 0).any()
    y, rp, src, offs, inv = grouped_ffn_forward(x, w1, b1, w2, b2, choice, c)
    y_ref, r_masked = sqrelu_ffn_forward_ref(x, w1, b1, w2, b2, (1, 4, m), c, score_units=r)
    torch.testing.assert_close(y, y_ref, rtol=1e-5, atol=1e-5)
    assert rp.shape == (t * 2 * 4, c) and offs[0] == 0
    dy = torch.randn(t, d_out, generator=torch.Generator().manual_seed(9))
    got = grouped_ffn_backward(dy, x, w1, w2, rp, src, offs, inv, c)
    want = sqrelu_ffn_backward_ref(dy, x, w1, w2, r_masked)
    for name, a, b in zip(("dx", "dw1", "db1", "dw2", "db2"), got, want, strict=True):
        assert a.shape == b.shape, name
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5, msg=name)
    assert got[1][:c].abs().max() == 0 and got[3][:, :c].abs().max() == 0  # the empty chunk's gradients
    # the mask matters: every token's dense output differs
    dense = torch.nn.functional.linear(torch.relu(torch.nn.functional.linear(x, w1, b1)) ** 2, w2, b2)
    assert ((y - dense).abs().amax(1) > 1e-3).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_triton_sums_equal_torchs(interpreter, dtype):
    """token_sum (with and without b2) and segment_colsum (about 110 rows per chunk: every one of its
    3 parts has rows) against torch, an empty chunk included; no tokens at all."""
    from sparse_compile.kernels.grouped_sums_triton import segment_colsum, token_sum

    g = torch.Generator().manual_seed(7)
    t, e, k = 400, 12, 3
    choice = torch.stack([torch.randperm(11, generator=g)[:k] for _ in range(t)])  # chunk 11: no row
    _, chunk, offs, inv = chunk_rows(choice, e)
    rows = torch.randn(t * k, 100, generator=g).to(dtype)
    bias = torch.randn(100, generator=g).to(dtype)
    want = rows.float().index_select(0, inv).view(t, k, 100).sum(1)
    tol = {"rtol": 1e-2, "atol": 2e-2} if dtype == torch.bfloat16 else {"rtol": 1e-3, "atol": 1e-3}
    torch.testing.assert_close(token_sum(rows, inv, k).float(), want, **tol)
    torch.testing.assert_close(token_sum(rows, inv, k, bias).float(), want + bias.float(), **tol)
    cols = torch.randn(t * k, 48, generator=g).to(dtype)
    assert torch.diff(offs, prepend=offs.new_zeros(1))[:11].min() > 2 * 32  # more rows than one part's block
    got = segment_colsum(cols, offs, split=3)
    torch.testing.assert_close(got, torch.zeros(e, 48).index_add_(0, chunk, cols.float()), rtol=1e-4, atol=1e-4)
    assert got[11].abs().max() == 0
    assert token_sum(rows[:0], inv[:0], k).shape == (0, 100)


def test_an_empty_chunks_gradients_are_zero_even_where_the_gemm_left_nan():
    from sparse_compile.kernels.ffn_grouped import _nonempty

    grad = torch.randn(3, 4, 5)
    grad[1] = float("nan")  # what a grouped GEMM may leave in a group no row fell in
    got = _nonempty(grad, torch.tensor([2, 2, 7], dtype=torch.int32))
    assert torch.equal(got[1], torch.zeros(4, 5)) and torch.equal(got[::2], grad[::2])


def test_no_tokens():
    x, w1, b1, w2, b2 = _leaves(0, 16, 128, 24, 3)
    choice = chunk_choice(x, w1, b1, 8, 16, 2)
    assert choice.shape == (0, 4)
    y, rp, src, offs, inv = grouped_ffn_forward(x, w1, b1, w2, b2, choice, 16)
    assert y.shape == (0, 24) and rp.shape == (0, 16) and offs.tolist() == [0] * 8
    dx, dw1, db1, dw2, db2 = grouped_ffn_backward(torch.zeros(0, 24), x, w1, w2, rp, src, offs, inv, 16)
    assert dx.shape == (0, 16) and not dw1.any() and not db1.any() and not dw2.any() and not db2.any()


def test_the_ops_fake_matches_the_real_op():
    from sparse_compile.contract import op_spec

    x, w1, b1, w2, b2 = _leaves(32, 16, 128, 16, 4)
    spec = op_spec(SparsityConfig(activations="1:4:8", chunk=16, score_units=4, kernels="triton"))
    torch.library.opcheck(torch.ops.sparse_compile.sqrelu_ffn_grouped, (x.view(2, 16, 16), w1, b1, w2, b2, spec))
    with pytest.raises(ValueError, match=r"needs activations 1:4:M in chunks of c > 1"):
        torch.ops.sparse_compile.sqrelu_ffn_grouped(x, w1, b1, w2, b2, op_spec(SparsityConfig(activations="16:4:8")))


@pytest.mark.parametrize("score_units", [4, None])
def test_compiled_model_on_grouped_gemms_matches_the_oracle(score_units):
    config = SparsityConfig(activations="1:4:8", chunk=16, score_units=score_units, kernels="triton")
    x = torch.randn(2, 32, 32, generator=torch.Generator().manual_seed(5))
    report = assert_compiled_matches_oracle(config, x, 1e-4)
    assert [s.kernel for s in report.sparse_sites] == [GROUPED, GROUPED]
    assert "grouped GEMMs" in str(report)


def test_after_a_reclustering_grouped_and_reference_kernels_agree():
    """With permute, both run the site's fitted permutation: outputs and gradients equal, in the units' own order."""
    options = {"activations": "1:4:8", "chunk": 16, "permute": True, "score_units": 2}
    x = torch.randn(4, 32, 32, generator=torch.Generator().manual_seed(6))
    ref_model = _FFN()
    fast_model = copy.deepcopy(ref_model)
    ref = torch.compile(ref_model, backend="sparse", options={**options, "kernels": "reference"})
    fast = torch.compile(fast_model, backend="sparse", options={**options, "kernels": "triton"})
    with sparse_compile.probe_units(), torch.no_grad():
        ref(x)
    assert len(sparse_compile.recluster()) == 1  # both models' site ("") shares the fitted permutation
    (perm,) = sparse_compile.unit_permutations().values()
    assert not torch.equal(perm.cpu(), torch.arange(128))
    y_ref, y_fast = ref(x), fast(x)
    assert compile_reports()[-1].sparse_sites[0].kernel == GROUPED
    torch.testing.assert_close(y_fast, y_ref, rtol=1e-5, atol=1e-5)
    y_ref.square().sum().backward()
    y_fast.square().sum().backward()
    for (name, a), b in zip(fast_model.named_parameters(), ref_model.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-5, msg=name)


def test_compiled_outputs_ignore_later_tokens():
    """Causality by perturbation: tokens after position 40 changed, outputs up to 40 bit-identical."""
    options = {"activations": "1:4:8", "chunk": 16, "score_units": 2, "kernels": "triton"}
    assert outputs_up_to(options) == (True, False)
    assert compile_reports()[-1].sparse_sites[0].kernel == GROUPED


@pytest.mark.parametrize(
    ("fields", "device", "dtype", "cap", "why"),
    [
        ({"chunk": 16, "score_units": 2, "kernels": "auto"}, "cpu", torch.float32, None, ""),
        ({"chunk": 16, "kernels": "reference"}, "cuda", torch.bfloat16, None, ""),
        ({"chunk": 64, "kernels": "auto"}, "cuda", torch.bfloat16, None, "chunks of 64: a chunk's grouped GEMM"),
        ({"chunk": 256, "kernels": "auto"}, "cuda", torch.float16, None, "float16: torch's grouped GEMM runs bf16"),
        ({"chunk": 256, "kernels": "auto"}, "cuda", torch.bfloat16, (8, 0), "sm80: torch's grouped GEMM has kernels"),
        ({"chunk": 256, "kernels": "auto"}, "cuda", torch.bfloat16, (12, 0), "sm120: torch's grouped GEMM has kernels"),
        ({"chunk": 16, "weight_grad": "tokens:16:2:8", "kernels": "triton"}, "cpu", torch.float32, None, "weight_"),
    ],
)
def test_the_plan_says_why_a_site_stays_on_the_reference(monkeypatch, fields, device, dtype, cap, why):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: cap)
    config = SparsityConfig(**{"activations": "1:4:16", **fields})
    plan = plan_kernels(torch.device(device), dtype, 256, config, d=64, h=1024 * 4, d_out=64)
    assert plan.kernel.startswith("reference") and (why in plan.why if why else plan.why == "")


def test_the_plan_checks_the_rows_are_16_bytes():
    config = SparsityConfig(activations="1:4:16", chunk=16, kernels="triton")
    plan = plan_kernels(torch.device("cpu"), torch.float32, 256, config, d=64, h=1024, d_out=20)
    assert plan.why.startswith("chunks of 16, d=64, d_out=20: grouped GEMMs need each a multiple of 8")


@pytest.mark.parametrize("cap", [(9, 0), (10, 0)])
def test_auto_runs_wide_per_token_chunks_grouped_on_sm90_and_sm100(monkeypatch, cap):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: cap)
    config = SparsityConfig(activations="1:4:16", chunk=256, score_units=16)
    plan = plan_kernels(torch.device("cuda"), torch.bfloat16, 16384, config, d=2048, h=8192, d_out=2048)
    assert (plan.kernel, plan.why) == (GROUPED, "")


def test_the_plan_runs_wide_chunks_grouped():
    config = SparsityConfig(activations="1:4:16", chunk=16, score_units=2, kernels="triton")
    plan = plan_kernels(torch.device("cpu"), torch.float32, 256, config, d=64, h=1024)
    assert (plan.kernel, plan.op) == (GROUPED, "sqrelu_ffn_grouped")
    assert plan.gemm_why.endswith("F1 on each chunk's first 2 units to choose, then on the kept chunks")
    dense = plan_kernels(torch.device("cpu"), torch.float32, 256, SparsityConfig(activations="1:4:16", chunk=16,
                                                                                  kernels="triton"))  # fmt: skip
    assert "F1 dense to choose" in dense.gemm_why
