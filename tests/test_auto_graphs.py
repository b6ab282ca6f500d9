"""small_ffn='graphs' (the default): a CUDA site that pays only with CUDA graphs runs sparse and its
graph (both variants) runs as CUDA graphs; where the options, permute or several processes rule
them out the site stays dense and the report says why. The sites here are on the CPU, treated as
CUDA sites and scaled down to the bounds below (the rule's decisions; a GPU run is in tests/gpu)."""

import logging

import pytest
import torch
import torch.nn as nn

import sparse_compile.backend as backend
import sparse_compile.cuda_graphs as cuda_graphs
import sparse_compile.passes as passes
import sparse_compile.report as report
from sparse_compile import SparsityConfig, explain
from sparse_compile.passes import size_rule
from sparse_compile.report import AUTO_GRAPHS_NOTE, NO_GRAPHS_NOTE

from .ffn_zoo import SquaredReLU

WORK = 4 * 16 * 32 * 128  # T x d x h of the model below: 2**18


@pytest.fixture
def as_cuda(monkeypatch):
    """Sites on the CPU decided as CUDA sites, with bounds 2**20 without graphs and 2**18 with them:
    the model's 2**18 pays only with CUDA graphs."""
    monkeypatch.setattr(size_rule, "SMALL_FFN", {False: (2**20, 2**18), True: (2**20, 2**18)})
    monkeypatch.setattr(passes, "small_site_reason", lambda work, device, graphs, chunked: size_rule.small_site_reason(
        work, "cuda", graphs, chunked))  # fmt: skip
    for module in (cuda_graphs, report):
        monkeypatch.setattr(module, "graphs_pay", lambda work, device, chunked: size_rule.graphs_pay(
            work, "cuda", chunked))  # fmt: skip


def _model() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 128), SquaredReLU(), nn.Linear(128, 32)), torch.randn(4, 16, 32)


def test_the_rule_s_parts():
    assert SparsityConfig(activations="16:2:8").small_ffn == "graphs"
    blocker = cuda_graphs.auto_graphs_blocker
    assert blocker(None, {}, False, 1) is None and blocker("default", None, False, 1) is None
    assert blocker(None, {"triton.cudagraphs": False}, False, 1) == "the inductor option triton.cudagraphs=False"
    assert "max-autotune-no-cudagraphs" in blocker("max-autotune-no-cudagraphs", {}, False, 1)
    assert "permute=True" in blocker(None, {}, True, 1)
    assert "a run of 2 processes" in blocker(None, {}, False, 2)
    dynamic = "dynamic shapes (cudagraph trees record one graph per size; not measured)"
    assert blocker(None, {}, False, 1, True) == dynamic
    with_graphs = cuda_graphs.bounds_with_graphs
    assert with_graphs("graphs", None, {}, False, 1, True) == (False, dynamic)
    assert with_graphs("graphs", "reduce-overhead", {}, False, 1, True) == (True, None)
    assert with_graphs("dense", "reduce-overhead", {}, True, 4) == (True, None)  # the mode's graphs
    assert with_graphs("sparse", None, {}, False, 1) == (False, None)
    assert with_graphs("dense", None, {}, False, 1) == (False, None)
    assert with_graphs("graphs", None, {}, False, 1) == (True, None)
    eight = "a run of 8 processes (DDP and FSDP2 under CUDA graphs are not measured)"
    assert with_graphs("graphs", None, {}, False, 8) == (False, eight)
    # 350M (2**36) and 125M (3.9e10) pay only with graphs in chunks; 1.3B does without; plain 125M does not
    assert size_rule.graphs_pay(2**36, "cuda", True) and size_rule.graphs_pay(16 * 1024 * 768 * 3072, "cuda", True)
    assert not size_rule.graphs_pay(2**36, "cpu", True) and not size_rule.graphs_pay(2.7e11, "cuda", True)
    assert size_rule.graphs_pay(2**36, "cuda", False) and not size_rule.graphs_pay(3.9e10, "cuda", False)
    assert not size_rule.graphs_pay(float("inf"), "cuda", True)
    # under the bound with graphs the reason is what was measured to pay with them, not host work
    graphs_reason = size_rule.small_site_reason(3.3e10, "cuda", True, chunked=True)
    assert "under the smallest size measured to pay with them (bench/RESULTS.md, section 2)" in graphs_reason
    assert "host work" not in graphs_reason and "host work" in size_rule.small_site_reason(3.3e10, "cuda", False)
    with pytest.raises(ValueError, match=r"small_ffn='auto': expected one of \('graphs', 'dense', 'sparse'\)"):
        SparsityConfig(activations="16:2:8", small_ffn="auto")


def test_a_site_that_pays_with_graphs_runs_sparse_under_them(as_cuda):
    model, x = _model()
    report = explain(model, x, config={"activations": "16:2:8"})
    assert len(report.sparse_sites) == 1 and report.cuda_graphs and report.auto_graphs == 1
    assert report.notes[0] == AUTO_GRAPHS_NOTE.format(n=1, bound=2**20) and report.notes[0] in str(report)
    assert "a later call overwrites a compiled call's outputs" in report.notes[0]
    dense = explain(model, x, config={"activations": "16:2:8", "small_ffn": "dense"})
    assert not dense.sparse_sites and not dense.cuda_graphs and not dense.notes
    assert dense.dense_sites[0].record.reason.startswith("small FFN: T x d x h = 2.6e+05 < 1e+06 without CUDA graphs")
    # the compile mode's graphs: the same site sparse, CUDA graphs on, but not turned on by the rule
    mode = explain(model, x, config={"activations": "16:2:8", "small_ffn": "dense", "mode": "reduce-overhead"})
    assert len(mode.sparse_sites) == 1 and mode.cuda_graphs and not mode.auto_graphs and not mode.notes


@pytest.mark.parametrize(
    "options,processes,why",
    [
        ({"inductor": {"triton.cudagraphs": False}}, 1, "the inductor option triton.cudagraphs=False"),
        ({"mode": "max-autotune-no-cudagraphs"}, 1, "mode='max-autotune-no-cudagraphs'"),
        ({"permute": True}, 1, "permute=True"),
        ({}, 2, "a run of 2 processes"),
    ],
)
def test_where_graphs_are_ruled_out_the_site_stays_dense_and_the_report_says_why(
    as_cuda, monkeypatch, options, processes, why
):
    monkeypatch.setattr(cuda_graphs, "processes", lambda: processes)
    model, x = _model()
    report = explain(model, x, config={"activations": "16:2:8", **options})
    assert not report.sparse_sites and not report.cuda_graphs and not report.auto_graphs
    assert report.dense_sites[0].record.reason.startswith("small FFN: T x d x h = 2.6e+05 < 1e+06 without CUDA graphs")
    assert len(report.notes) == 1 and why in report.notes[0]
    assert report.notes[0].startswith(NO_GRAPHS_NOTE.split("{")[0])
    assert report.notes[0].endswith(
        "so 1 CUDA site(s) that pay with them stay dense by the size rule without CUDA graphs"
    )
    # a site under the bound with graphs too (T x d x h = 2**17) gets no such note: graphs would not have helped
    tiny = explain(model, x[:2], config={"activations": "16:2:8", **options}, dynamic=False)
    assert not tiny.sparse_sites and not tiny.notes


def _recording_compiles(monkeypatch, accept_graphs: bool, skip_message: str | None = None) -> list[dict]:
    """backend.compile_fx wrapped: the config patches of every call. On the CPU Inductor declines CUDA
    graphs (its cudagraph_skips counter rises); ``accept_graphs`` takes that rise back, as where
    Inductor runs the graph under them; ``skip_message`` is logged as Inductor logs a CUDA graph's skip."""
    from torch._dynamo.utils import counters
    from torch._inductor.cudagraph_utils import log_cudagraph_skip_and_bump_counter

    patches = []
    compile_fx = backend.compile_fx

    def recording(gm, inputs, config_patches=None, **kw):
        patches.append(dict(config_patches or {}))
        before = counters["inductor"]["cudagraph_skips"]
        fn = compile_fx(gm, inputs, config_patches=config_patches, **kw)
        if accept_graphs:
            counters["inductor"]["cudagraph_skips"] = before
        elif skip_message is not None:
            log_cudagraph_skip_and_bump_counter(skip_message)
        return fn

    for module in (backend, cuda_graphs):  # the dense and plain sparse compiles, the one under CUDA graphs
        monkeypatch.setattr(module, "compile_fx", recording)
    return patches


def test_dynamic_shapes_are_sized_at_their_hints_and_get_no_graphs(as_cuda):
    """A graph traced with dynamic shapes: a site's T x d x h is taken at the sizes the graph is
    compiled for (Dynamo's hints), not as unbounded; small_ffn='graphs' does not turn CUDA graphs on
    for it (cudagraph trees would record one graph per size), so a site that pays only under graphs
    stays dense and the report says why; the compile mode's graphs and larger sites are unchanged."""
    model, x = _model()
    report = explain(model, x, config={"activations": "16:2:8"}, dynamic=True)
    assert not report.sparse_sites and not report.cuda_graphs and not report.auto_graphs
    record = report.dense_sites[0].record
    assert record.work == WORK and record.input_shape != str(tuple(x.shape))  # symbolic, at its hint
    assert record.reason.startswith("small FFN: T x d x h = 2.6e+05 < 1e+06 without CUDA graphs")
    blocker = "dynamic shapes (cudagraph trees record one graph per size; not measured)"
    assert report.notes == [NO_GRAPHS_NOTE.format(n=1, blocker=blocker)]
    static = explain(model, x, config={"activations": "16:2:8"}, dynamic=False)
    assert static.auto_graphs == 1 and static.sparse_sites[0].record.input_shape == str(tuple(x.shape))
    mode = explain(model, x, config={"activations": "16:2:8", "mode": "reduce-overhead"}, dynamic=True)
    assert len(mode.sparse_sites) == 1 and mode.cuda_graphs and not mode.notes
    big = explain(model, torch.randn(16, 16, 32), config={"activations": "16:2:8"}, dynamic=True)  # 2**20
    assert len(big.sparse_sites) == 1 and big.sparse_sites[0].record.work == 2**20 and not big.cuda_graphs


def test_the_backend_turns_graphs_on_for_both_variants(as_cuda, monkeypatch, caplog):
    """Both variants compile with triton.cudagraphs=True (one memory pool for the two phases) where
    Inductor runs the sparse one under them, and the backend warns that it did (logger
    sparse_compile); on the CPU Inductor runs the graph without them, and the output is the
    reference op's."""
    caplog.set_level(logging.INFO, logger="sparse_compile")
    patches = _recording_compiles(monkeypatch, accept_graphs=True)
    torch._dynamo.reset()
    model, x = _model()
    y = torch.compile(model, backend="sparse", options={"activations": "16:2:8", "kernels": "reference"})(x)
    report = backend.compile_reports()[-1]
    assert report.auto_graphs == 1 and report.cuda_graphs
    logged = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "sparse_compile"]
    note = AUTO_GRAPHS_NOTE.format(n=1, bound=2**20)
    assert report.warnings == [note]
    assert logged == [(logging.INFO, str(report)),
                      (logging.WARNING, f"sparse_compile, graph {report.sites[0].graph}: {note}")]  # fmt: skip
    assert len(patches) == 2 and patches[0]["triton.cudagraphs"] is patches[1]["triton.cudagraphs"] is True
    assert "post_grad_custom_post_pass" in patches[0]  # the sparse variant first: it decides for both
    forced = torch.compile(model, backend="sparse", options={"activations": "16:2:8", "kernels": "reference",
                                                              "small_ffn": "sparse"})  # fmt: skip
    torch._dynamo.reset()
    assert torch.equal(y, forced(x))
    assert not any("triton.cudagraphs" in p for p in patches[2:]) and not backend.compile_reports()[-1].cuda_graphs


@pytest.mark.parametrize(
    "message,why",
    [
        (None, "it gave no reason"),  # the CPU graph's own skip: no warning
        ("skipping cudagraphs due to mutated inputs (1 instances). Found from :\n  File \"m.py\", line 3",
         "skipping cudagraphs due to mutated inputs (1 instances). Found from :"),
    ],
)  # fmt: skip
def test_where_inductor_declines_graphs_the_sites_stay_dense_and_the_report_says_why(
    as_cuda, monkeypatch, caplog, message, why
):
    """A site that pays only under CUDA graphs is not left running sparse without them: where Inductor
    declines to run the sparse variant under graphs, the size rule takes its bounds without them,
    both variants compile without graphs, and the report's note gives Inductor's reason."""
    caplog.set_level(logging.INFO, logger="sparse_compile")
    patches = _recording_compiles(monkeypatch, accept_graphs=False, skip_message=message)
    torch._dynamo.reset()
    model, x = _model()
    y = torch.compile(model, backend="sparse", options={"activations": "16:2:8", "kernels": "reference"})(x)
    report = backend.compile_reports()[-1]
    assert not report.sparse_sites and not report.cuda_graphs and not report.auto_graphs and not report.warnings
    ours = [r for r in caplog.records if r.name == "sparse_compile"]
    assert [(r.levelno, r.getMessage()) for r in ours] == [(logging.INFO, str(report))]
    assert report.dense_sites[0].record.reason.startswith("small FFN: T x d x h = 2.6e+05 < 1e+06 without CUDA graphs")
    assert report.notes == [NO_GRAPHS_NOTE.format(n=1, blocker=f"Inductor declined them: {why}")]
    assert report.notes[0] in str(report)
    # the sparse variant tried under graphs, then only the dense one, without them
    assert len(patches) == 2 and patches[0]["triton.cudagraphs"] is True and "triton.cudagraphs" not in patches[1]
    assert "post_grad_custom_post_pass" in patches[0] and "post_grad_custom_post_pass" not in patches[1]
    torch._dynamo.reset()
    assert torch.allclose(y, torch.compile(model)(x), rtol=1e-5, atol=1e-6)  # the dense model's output


def test_under_the_mode_s_graphs_a_decline_leaves_the_sites_dense_too(as_cuda, monkeypatch):
    """mode='reduce-overhead' asks for CUDA graphs, so the size rule takes its bounds with them; where
    Inductor declines them the sites that pay only with them stay dense as well (the mode stays the
    user's for the dense graph). small_ffn='sparse' runs them sparse regardless: no check."""
    patches = _recording_compiles(monkeypatch, accept_graphs=False)
    torch._dynamo.reset()
    model, x = _model()
    options = {"activations": "16:2:8", "kernels": "reference", "mode": "reduce-overhead"}
    torch.compile(model, backend="sparse", options=options)(x)
    report = backend.compile_reports()[-1]
    assert not report.sparse_sites and not report.cuda_graphs and not report.auto_graphs
    assert report.notes == [NO_GRAPHS_NOTE.format(n=1, blocker="Inductor declined them: it gave no reason")]
    assert len(patches) == 2 and patches[0]["triton.cudagraphs"] is patches[1]["triton.cudagraphs"] is True
    torch._dynamo.reset()
    torch.compile(model, backend="sparse", options={**options, "small_ffn": "sparse"})(x)
    forced = backend.compile_reports()[-1]
    assert len(forced.sparse_sites) == 1 and forced.cuda_graphs and len(patches) == 4
