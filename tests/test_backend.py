"""The compiled model: sparse numerics vs the oracle, dense phase bit-identical, no recompiles."""

import copy
import dataclasses
import json
import logging
import os
import subprocess
import sys

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import sparse_compile
from sparse_compile import SparsityConfig, compile_reports, dense_phase
from sparse_compile.kernels import transposable_24_mask
from sparse_compile.options import BackendOptions

from .oracle import oracle_keep


class Block(nn.Module):
    def __init__(self, d: int, h: int) -> None:
        super().__init__()
        self.fc = nn.Linear(d, h)
        self.proj = nn.Linear(h, d)

    def forward(self, x):
        return x + self.proj(torch.relu(self.fc(x)).square())


class Stack(nn.Module):
    """Two residual relu² FFNs: the op's inputs are bit-identical in eager and compiled runs."""

    def __init__(self, d: int = 32, h: int = 128) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.blocks = nn.Sequential(Block(d, h), Block(d, h))

    def forward(self, x):
        return self.blocks(x)


def oracle_forward(model: Stack, x: torch.Tensor, config: SparsityConfig) -> torch.Tensor:
    """Eager masked math; straight-through weights as w + (w*M - w).detach(); masks held constant."""

    def ste(w):
        return w + (w * transposable_24_mask(w) - w).detach() if config.weights else w

    for b in model.blocks:
        z = F.linear(x, ste(b.fc.weight), b.fc.bias)
        h = (torch.relu(z) ** 2).to(z.dtype)  # H in the compute dtype (CUDA autocast runs pow in fp32)
        pattern = config.activation_pattern
        h2 = h.reshape(-1, h.shape[-1])
        if pattern is not None and h2.shape[0] % pattern[0] == 0:
            seq = (h.shape[-2] if h.dim() >= 3 else h2.shape[0]) if config.causal else None
            h = h * oracle_keep(h2.detach(), config, seq).reshape(h.shape)
        x = x + F.linear(h, ste(b.proj.weight), b.proj.bias)
    return x


def grads(model):
    return {k: p.grad.clone() for k, p in model.named_parameters()}


def autocast_step(options: dict, x: torch.Tensor):
    """A fresh Stack() compiled with ``options``, one forward under CPU bf16 autocast and the backward
    of sum(y^2): (y, grads, the compile's report)."""
    model = Stack()
    compiled = torch.compile(model, backend="sparse", options=options)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = compiled(x)
    y.float().square().sum().backward()
    return y, grads(model), compile_reports()[-1]


def assert_compiled_matches_oracle(config: SparsityConfig, x: torch.Tensor, tol: float):
    """torch.compile(Stack(), backend="sparse") with ``config`` against the eager oracle: the output
    and every gradient of sum(y^2) equal to ``tol``. Returns the compile's report."""
    model, ref_model = Stack().to(x.device), Stack().to(x.device)
    compiled = torch.compile(model, backend="sparse", options=dataclasses.asdict(config))
    y = compiled(x)
    y.square().sum().backward()
    y_ref = oracle_forward(ref_model, x, config)
    y_ref.square().sum().backward()
    torch.testing.assert_close(y, y_ref, rtol=tol, atol=tol)
    for k, g in grads(ref_model).items():
        torch.testing.assert_close(grads(model)[k], g, rtol=tol, atol=tol, msg=k)
    return compile_reports()[-1]


CONFIGS = {
    "weights": {"weights": "2:4"},
    "act24": {"activations": "2:4"},
    "act64:2:8": {"activations": "64:2:8"},
    "act32:4:16": {"activations": "32:4:16"},
    "venom": {"preset": "venom"},
    "causal32:2:8": {"activations": "32:2:8", "causal": True},
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_sparse_phase_matches_oracle(name):
    options = CONFIGS[name]
    config = BackendOptions.parse(options).config
    model = Stack()
    ref = copy.deepcopy(model)
    x = torch.randn(2, 64, 32)
    gy = torch.randn(2, 64, 32)
    compiled = torch.compile(model, backend="sparse", options=options)
    y = compiled(x)
    (y * gy).sum().backward()
    y_ref = oracle_forward(ref, x, config)
    (y_ref * gy).sum().backward()
    torch.testing.assert_close(y, y_ref, rtol=1e-5, atol=1e-5)
    g, g_ref = grads(model), grads(ref)
    for k in g:
        torch.testing.assert_close(g[k], g_ref[k], rtol=1e-5, atol=1e-5, msg=f"grad {k}")
    assert len(compile_reports()[-1].sparse_sites) == 2
    # The dense answer differs: the sparse phase really computed something else.
    assert not torch.allclose(y, Stack()(x), rtol=1e-3, atol=1e-3)


def test_dense_phase_is_bit_identical_to_default_compile_and_flips_never_recompile():
    model = Stack()
    baseline = copy.deepcopy(model)
    compiled = torch.compile(model, backend="sparse")
    default = torch.compile(baseline)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    opt_base = torch.optim.SGD(baseline.parameters(), lr=0.1)
    x = torch.randn(2, 64, 32)
    compiled(x).square().mean().backward()  # compile once (sparse + dense variants)
    model.zero_grad()
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    outs = []
    for step in range(10):
        x = torch.randn(2, 64, 32)
        if step % 2 == 0:
            with dense_phase():
                y = compiled(x)
                y.square().mean().backward()
            y_base = default(x)
            y_base.square().mean().backward()
            assert torch.equal(y, y_base), f"step {step}: dense output differs from default torch.compile"
            for (k, p), q in zip(model.named_parameters(), baseline.parameters(), strict=True):
                assert torch.equal(p.grad, q.grad), f"step {step}: grad {k} differs"
            opt_base.step()
            opt_base.zero_grad()
        else:
            y = compiled(x)
            y.square().mean().backward()
            # keep the baseline's weights equal: apply the same update to both
            for p, q in zip(model.parameters(), baseline.parameters(), strict=True):
                q.grad = p.grad.clone()
            opt_base.step()
            opt_base.zero_grad()
        outs.append(y.detach())
        opt.step()
        opt.zero_grad()
    # The only new Dynamo graph is the default-backend baseline's; the sparse model never recompiled.
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == graphs + 1
    assert sum(torch._dynamo.utils.counters["recompiles"].values()) == 0


def test_dynamic_batch_and_dense_fallback_for_odd_token_counts():
    model = Stack()
    ref = copy.deepcopy(model)
    config = SparsityConfig(activations="64:2:8")
    compiled = torch.compile(model, backend="sparse", options={"activations": "64:2:8"}, dynamic=True)
    sparse_compile.ops.spec.warn_dense_fallback.cache_clear()
    for batch in (2, 4, 3):
        x = torch.randn(batch, 32, 32)
        if batch == 3:
            with pytest.warns(UserWarning, match="T=96 tokens.*V=64"):
                y = compiled(x)
        else:
            y = compiled(x)
        torch.testing.assert_close(y, oracle_forward(ref, x, config), rtol=1e-5, atol=1e-5)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1
    report = compile_reports()[-1]
    assert all("calls with T % 64 != 0 run activations dense" in s.record.reason for s in report.sparse_sites)


def test_graph_without_ffn_compiles_once_plainly(monkeypatch, caplog):
    """A graph without FFN sites: one Dynamo graph and one Inductor compile, of the graph as traced and
    without the sparse variant's pass; the plain compiled function, no PhaseDispatcher; no warning.
    Later calls, in either phase, compile nothing more."""
    caplog.set_level(logging.WARNING, logger="sparse_compile")
    compiles, dispatchers = [], []
    compile_fx = sparse_compile.backend.compile_fx

    def counting(gm, inputs, config_patches=None, **kw):
        compiles.append((gm, dict(config_patches or {})))
        return compile_fx(gm, inputs, config_patches=config_patches, **kw)

    monkeypatch.setattr(sparse_compile.backend, "compile_fx", counting)
    monkeypatch.setattr(sparse_compile.backend, "PhaseDispatcher", lambda *fns: dispatchers.append(fns))
    model = nn.Sequential(nn.Linear(8, 8), nn.Tanh())
    x = torch.randn(4, 8)
    compiled = torch.compile(model, backend="sparse")
    y = compiled(x)
    torch.testing.assert_close(y, model(x))
    with dense_phase():
        torch.testing.assert_close(compiled(x), y)
    torch.testing.assert_close(compiled(x), y)
    report = compile_reports()[-1]
    assert len(report) == 0 and len(compile_reports()) == 1
    assert torch._dynamo.utils.counters["sparse_compile"]["sites_sparse"] == 0
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1
    ((gm, patches),) = compiles  # once: the dense variant only
    assert "post_grad_custom_post_pass" not in patches
    assert not any("sparse_compile" in str(n.target) for n in gm.graph.nodes)
    assert dispatchers == []  # plainly: Inductor's function itself
    assert [r for r in caplog.records if r.name == "sparse_compile"] == []


def _sparse_compile_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "sparse_compile" and r.levelno == logging.WARNING]


@pytest.mark.parametrize(
    "options, shape, dtype, reason",
    [
        (
            {"chunk": 48},
            (1, 128, 32),
            torch.float32,
            "activations 128:4:16 in chunks of 48 need hidden % (M * chunk) == 0; got hidden=128, M * chunk=768",
        ),
        (
            {"chunk": 3000},
            (1, 128, 32),
            torch.float32,
            "activations 128:4:16 in chunks of 3000 need hidden % (M * chunk) == 0; got hidden=128, M * chunk=48000",
        ),
        (None, (1, 128, 32), torch.float64, "dtype float64 is not one of float16, bfloat16, float32"),
        (
            None,
            (1, 100, 32),
            torch.float32,
            "causal activations 128:4:16 need the sequence length (x's second-to-last dim) to be a multiple of "
            "V=128; got x (1, 100, 32)",
        ),
        (
            {"activations": "3:2:8"},
            (1, 512, 32),
            torch.float32,
            "T=512 is not a multiple of V=3 (x (1, 512, 32)): activations 3:2:8 would run dense at every call, and "
            "with weights=None and weight_grad='dense' nothing else is sparse",
        ),
    ],
    ids=["chunk48", "chunk3000", "float64", "seq100", "3:2:8-T512"],
)
def test_a_found_ffn_that_runs_dense_warns_once_per_compile(options, shape, dtype, reason, caplog):
    """Each reason a found FFN runs dense is logged once per compile (logger sparse_compile, WARNING),
    naming its sites; the report's status says dense with the same reason."""
    caplog.set_level(logging.WARNING, logger="sparse_compile")
    compiled = torch.compile(Stack().to(dtype), backend="sparse", options=options)
    x = torch.randn(shape, dtype=dtype)
    compiled(x)
    compiled(x)
    report = compile_reports()[-1]
    assert not report.sparse_sites and [s.record.reason for s in report.dense_sites] == [reason, reason]
    assert str(report).startswith("sparse_compile report: 0 sparse FFN site(s), 2 dense")
    sites = [f"{s.record.module} at {s.record.source}" for s in report.sites]
    assert sites[0].startswith("blocks.0 at test_backend.py:") and sites[1].startswith("blocks.1 at test_backend.py:")
    graph = report.sites[0].graph
    assert _sparse_compile_warnings(caplog) == [
        f"sparse_compile, graph {graph}: 2 FFNs ({', '.join(sites)}) run dense: {reason}"
    ]


def test_a_site_with_dense_activations_warns_and_reports_its_weights_sparse(caplog):
    """With "3:2:8" and 2:4 weights at T=512 the weights run sparse, the activations dense at every call."""
    caplog.set_level(logging.WARNING, logger="sparse_compile")
    torch.compile(Stack(), backend="sparse", options={"activations": "3:2:8", "weights": "2:4"})(torch.randn(512, 32))
    report = compile_reports()[-1]
    assert len(report.sparse_sites) == 2 and all(s.patterns["F2"] == "W2:4" for s in report.sites)
    sites = ", ".join(f"{s.record.module} at {s.record.source}" for s in report.sites)
    assert _sparse_compile_warnings(caplog) == [
        f"sparse_compile, graph {report.sites[0].graph}: 2 FFNs ({sites}) run sparse with dense activations: "
        "T=512 is not a multiple of V=3"
    ]


@pytest.mark.parametrize(
    "options, error, message",
    [
        ("fast", TypeError, "sparse_compile: options='fast' is a str, not a mapping; expected a dict"),
        ({"activations": "128:5:16"}, ValueError, "SparsityConfig.activations='128:5:16': N=5 must be 1, 2 or 4;"),
        ({"activations": "128:4:10"}, ValueError, "='128:4:10': M=10 must be a multiple of 4 larger than N=4;"),
        ({"activations": "2-4"}, ValueError, "='2-4': 1 part(s) separated by ':', not 2 (N:M, e.g. '2:4') or 3"),
        ({"activations": 128}, ValueError, "SparsityConfig.activations=128: not a string (int);"),
        ({"weight_grad": "tokens:64:3:8"}, ValueError, "SparsityConfig.weight_grad='tokens:64:3:8': N=3 must be"),
    ],
)
def test_bad_options_fail_at_the_first_call_with_the_project_s_message(options, error, message):
    """torch.compile keeps a custom backend's options (torch 2.13: _TorchCompileWrapper) and hands them
    to it only when Dynamo first compiles a graph, so torch.compile returns and the first call raises
    Dynamo's BackendCompilerFailed, which quotes our error (its inner_exception); ours leads with
    "sparse_compile: "."""
    from torch._dynamo.exc import BackendCompilerFailed

    compiled = torch.compile(Stack(), backend="sparse", options=options)
    with pytest.raises(BackendCompilerFailed) as info:
        compiled(torch.randn(64, 32))
    inner = info.value.inner_exception
    assert type(inner) is error and str(inner).startswith("sparse_compile: ") and message in str(inner)
    assert f"{error.__name__}: sparse_compile: " in str(info.value)


def test_dump_dir_writes_graphs_and_report(tmp_path):
    model = Stack()
    opts = {"preset": "venom", "dump_dir": str(tmp_path)}
    torch.compile(model, backend="sparse", options=opts)(torch.randn(64, 32))
    names = sorted(p.name for p in tmp_path.iterdir())
    gid = names[0].split("_")[1]
    assert names == [f"graph_{gid}_after.py", f"graph_{gid}_before.py", f"graph_{gid}_report.txt"]
    after = (tmp_path / f"graph_{gid}_after.py").read_text()
    before = (tmp_path / f"graph_{gid}_before.py").read_text()
    assert after.count("torch.ops.sparse_compile.sqrelu_ffn.default(") == 2 and "sqrelu_ffn" not in before
    assert "2 sparse FFN site(s)" in (tmp_path / f"graph_{gid}_report.txt").read_text()


def test_trace_structured_emits_the_graphs(tmp_path):
    code = (
        "import torch, torch.nn as nn\n"
        "m = nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 32))\n"
        "class S(nn.Module):\n"
        "    def __init__(s): super().__init__(); s.a = nn.Linear(32, 128); s.b = nn.Linear(128, 32)\n"
        "    def forward(s, x): return s.b(torch.relu(s.a(x)) ** 2)\n"
        "torch.compile(S(), backend='sparse')(torch.randn(64, 32))\n"
    )
    env = dict(os.environ, TORCH_TRACE=str(tmp_path))
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=300)
    records = [
        json.loads(line[line.index("] ") + 2 :])
        for f in tmp_path.iterdir()
        for line in f.read_text().splitlines()
        if '"artifact"' in line and "sparse_compile_" in line
    ]
    names = {rec["artifact"]["name"] for rec in records}
    assert {"sparse_compile_before_py", "sparse_compile_after_py", "sparse_compile_report_txt"} <= names


def test_entry_point_in_a_fresh_process():
    code = (
        "import sys, torch, torch.nn as nn\n"
        "class S(nn.Module):\n"
        "    def __init__(s): super().__init__(); s.a = nn.Linear(32, 128); s.b = nn.Linear(128, 32)\n"
        "    def forward(s, x): return s.b(torch.relu(s.a(x)) ** 2)\n"
        "y = torch.compile(S(), backend='sparse', options={'preset': 'venom'})(torch.randn(64, 32))\n"
        "assert 'sparse_compile' in sys.modules\n"
        "print(torch._dynamo.utils.counters['sparse_compile']['sites_sparse'])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, timeout=300)
    assert out.stdout.strip() == "1"


def test_mode_and_inductor_options_are_honored():
    model = Stack()
    x = torch.randn(64, 32)
    y = torch.compile(model, backend="sparse", mode="max-autotune-no-cudagraphs")(x)
    y2 = torch.compile(copy.deepcopy(model), backend="sparse", options={"inductor": {"max_autotune": False}})(x)
    torch.testing.assert_close(y, y2)
    with pytest.raises(Exception, match="unknown option"):
        torch.compile(model, backend="sparse", options={"bogus": 1})(x)


def test_autocast_sites_stay_sparse_with_autocast_casts():
    model = Stack()
    ref = copy.deepcopy(model)
    baseline = copy.deepcopy(model)
    config = SparsityConfig(weights="2:4", activations="64:2:8")
    x = torch.randn(2, 64, 32)
    compiled = torch.compile(model, backend="sparse", options={"preset": "venom"})
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = compiled(x)
        y_ref = oracle_forward(ref, x, config)
        with dense_phase():
            y_dense = compiled(x)
        y_default = torch.compile(baseline)(x)
    report = compile_reports()[-1]
    assert len(report.sparse_sites) == 2
    assert "inputs cast to bfloat16 as autocast does" in report.sparse_sites[0].record.reason
    assert y.dtype == y_ref.dtype == torch.float32  # the residual add promotes, as in eager
    torch.testing.assert_close(y, y_ref, rtol=2e-2, atol=2e-2)
    y.float().sum().backward()
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in model.parameters())
    assert torch.equal(y_dense, y_default)


def test_report_notes_small_cuda_sites_run_sparse_by_request():
    """With small_ffn='sparse', CUDA sites under the size rule's bound (2**37 without CUDA graphs,
    2**36 with them) run sparse and get the host-bound note; large, CPU, dense and symbolic-shape
    sites do not."""
    import math

    from sparse_compile.cuda_graphs import uses_cuda_graphs
    from sparse_compile.passes import SiteRecord
    from sparse_compile.report import HOST_HINT, Report

    def site(work: float, device: str = "cuda", sparse: bool = True) -> SiteRecord:
        where = ("blocks.0.mlp", "model.py:62", "(8, 2048, 1024)", "4096", "bfloat16")
        return SiteRecord(*where, device, sparse, "", "triton gather", work=work)

    config = SparsityConfig(activations="128:4:16", small_ffn="sparse")
    small = site(8 * 2048 * 1024 * 4096)  # 350M: 2**36
    tiny = site(16 * 1024 * 768 * 3072)  # 125M: 3.9e10
    without = {"bound": 2**37, "graphs": "without"}
    for mode, records, want, kw in [
        (None, [small, site(8 * 2048 * 2048 * 8192)], 1, without),  # 1.3B: 2.7e11, no note for it
        ("default", [small, small], 2, without),
        ("reduce-overhead", [small], 0, {}),  # 2**36 is not under the CUDA-graph bound
        ("reduce-overhead", [small, tiny], 1, {"bound": 2**36, "graphs": "with"}),
        ("max-autotune", [tiny], 1, {"bound": 2**36, "graphs": "with"}),
        (None, [site(small.work, device="cpu")], 0, {}),
        (None, [site(small.work, sparse=False)], 0, {}),
        (None, [site(math.inf)], 0, {}),  # a symbolic dim
    ]:
        report = Report.from_records(config, 0, records, uses_cuda_graphs(mode))
        assert report.notes == ([HOST_HINT.format(n=want, **kw)] if want else []), (mode, want)
        assert (bool(report.notes) and report.notes[0] in str(report)) == bool(want)
    assert "small_ffn='sparse'" in HOST_HINT and "bench/RESULTS.md section 2" in HOST_HINT


def test_small_cuda_sites_stay_dense_by_the_size_rule(monkeypatch):
    """small_ffn='dense' (the default): a CUDA site under the bound stays dense with the rule as its
    reason, in the pass itself (CPU sites never do; the test treats its CPU site as CUDA); 'sparse'
    keeps it sparse; the bound depends on CUDA graphs only through the compile mode."""
    import sparse_compile.passes as passes
    from sparse_compile import cuda_graphs, explain
    from sparse_compile.passes import size_rule

    from .ffn_zoo import SquaredReLU

    assert size_rule.small_site_reason(2**36, "cpu", False) is None
    assert size_rule.small_site_reason(2**37, "cuda", False) is None
    assert "6.9e+10" in size_rule.small_site_reason(2**36 - 1, "cuda", True)
    assert "1.4e+11" in size_rule.small_site_reason(2**36, "cuda", False)
    assert size_rule.small_site_reason(2**36, "cuda", True) is None
    # neuron chunks: the same bound without graphs (350M's 2**36 dense), one lower with them (125M's
    # 3.9e10 sparse)
    assert size_rule.small_site_reason(2**37, "cuda", False, chunked=True) is None
    assert "1.4e+11 without CUDA graphs (neuron chunks)" in size_rule.small_site_reason(2**36, "cuda", False, True)
    assert size_rule.small_site_reason(3.9e10, "cuda", True, chunked=True) is None
    assert "3.4e+10 with CUDA graphs" in size_rule.small_site_reason(3.3e10, "cuda", True, chunked=True)
    assert "lowers the bound to 3.4e+10" in size_rule.small_site_reason(3.9e10, "cuda", False, chunked=True)
    assert cuda_graphs.uses_cuda_graphs("reduce-overhead") and cuda_graphs.uses_cuda_graphs("max-autotune")
    assert not cuda_graphs.uses_cuda_graphs(None) and not cuda_graphs.uses_cuda_graphs("max-autotune-no-cudagraphs")
    assert cuda_graphs.uses_cuda_graphs(None, {"triton.cudagraphs": True})
    assert not cuda_graphs.uses_cuda_graphs("reduce-overhead", {"triton.cudagraphs": False})
    with pytest.raises(ValueError, match="small_ffn='tiny'"):
        SparsityConfig(activations="16:2:8", small_ffn="tiny")

    monkeypatch.setattr(passes, "small_site_reason", lambda work, device, graphs, chunked: size_rule.small_site_reason(
        work, "cuda", graphs, chunked))  # fmt: skip
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 128), SquaredReLU(), nn.Linear(128, 32))
    x = torch.randn(4, 16, 32)
    dense = explain(model, x, config=SparsityConfig(activations="16:2:8"))
    assert not dense.sparse_sites and "small FFN: T x d x h = 2.6e+05" in dense.dense_sites[0].record.reason
    forced = explain(model, x, config=SparsityConfig(activations="16:2:8", small_ffn="sparse"))
    assert len(forced.sparse_sites) == 1 and not forced.dense_sites


def test_site_record_work_is_t_d_h_of_a_static_site():
    from sparse_compile import explain

    from .ffn_zoo import SquaredReLU

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 128), SquaredReLU(), nn.Linear(128, 32))
    report = explain(model, torch.randn(4, 16, 32), config=SparsityConfig(activations="16:2:8"))
    assert [s.record.work for s in report.sparse_sites] == [4 * 16 * 32 * 128]


def test_weight_copies_recompute_gives_the_same_numbers_under_autocast():
    """weight_copies="recompute" moves the casts of the float32 weights into the op (cast again in
    backward): the compiled model's output and every parameter's gradient equal those of "keep", bit
    for bit, and the report says which sites do it."""
    x = torch.randn(2, 128, 32)
    results = {}
    for copies in ("keep", "recompute"):
        y, g, report = autocast_step({"activations": "64:2:8", "weight_copies": copies}, x)
        notes = [site.record.reason for site in report.sparse_sites]
        assert len(notes) == 2 and all(
            ("backward keeps the float32 ones" in n) == (copies == "recompute") for n in notes
        )
        results[copies] = (y, *g.values())
    for a, b in zip(results["keep"], results["recompute"], strict=True):
        assert a.dtype == b.dtype and torch.equal(a, b)
