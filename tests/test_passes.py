"""Match coverage of the FFN pass: every spelling matches, look-alikes don't, counts are exact."""

import re

import pytest
import torch

from bench.model import GPT, GPTConfig
from sparse_compile import SparsityConfig, explain
from sparse_compile.passes import find_ffn_sites, sparsify_ffns

from . import ffn_zoo


def dynamo_graphs(model, *inputs) -> list[torch.fx.GraphModule]:
    graphs = []

    def capture(gm, _):
        graphs.append(gm)
        return gm.forward

    torch.compile(model, backend=capture)(*inputs)
    return graphs


@pytest.mark.parametrize("module", ffn_zoo.MATCHING, ids=lambda m: m.__name__)
@pytest.mark.parametrize("rank", [2, 3, 4])
def test_every_spelling_matches(module, rank):
    x = torch.randn(*[2] * (rank - 2), 64, ffn_zoo.D)
    (gm,) = dynamo_graphs(module(), x)
    matches, misses = find_ffn_sites(gm.graph)
    assert (len(matches), len(misses)) == (1, 0)


@pytest.mark.parametrize("module, reason", ffn_zoo.NOT_MATCHING, ids=lambda m: getattr(m, "__name__", ""))
def test_look_alikes_do_not_match_and_say_why(module, reason):
    model = module()
    x = torch.randn(64, ffn_zoo.D)
    (gm,) = dynamo_graphs(model, x)
    matches, misses = find_ffn_sites(gm.graph)
    assert matches == []
    assert len(misses) == 1 and reason in misses[0].reason
    report = explain(model, x)
    assert len(report.sparse_sites) == 0
    assert [reason in s.record.reason for s in report.dense_sites] == [True]


def test_multi_ffn_model_rewrites_two_sites_in_place():
    x = torch.randn(64, ffn_zoo.D)
    (gm,) = dynamo_graphs(ffn_zoo.MultiFFN(), x)
    records = sparsify_ffns(gm, SparsityConfig.preset("venom"))
    assert [(r.module, r.sparse) for r in records] == [("a", True), ("b", True), ("c", False)]
    targets = [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]
    assert targets.count("sparse_compile.sqrelu_ffn.default") == 2
    assert targets.count("sparse_compile.sparsify_weight.default") == 4
    for node in gm.graph.nodes:
        if "sparse_compile" in str(node.target):
            assert "example_value" in node.meta and node.meta.get("stack_trace")


def test_nanogpt_gets_every_block():
    model = GPT(GPTConfig(block_size=128, n_layer=4, n_head=4, n_embd=128))  # hidden 512: one group of 8 chunks
    idx = torch.randint(0, 256, (2, 128))
    report = explain(model, idx)  # the default options
    assert [s.record.module for s in report.sparse_sites] == [f"blocks.{i}.mlp" for i in range(4)]
    assert report.dense_sites == []
    text = str(report)
    assert "4 sparse FFN site(s), 0 dense" in text and "blocks.3.mlp" in text and "model.py" in text
    # hidden 512 is not a multiple of M * 128 = 2048: every site falls back to chunks of 32 (512 = 16 * 32)
    assert "activations=128:4:16, chunk=128, causal," in text and "A128:4:16c32 causal" in text
    assert [s.record.chunk for s in report.sparse_sites] == [32] * 4
    assert "chunks of 32, not 128: hidden 512 is not divisible by M * 128 = 2048" in text


def test_the_report_says_what_a_run_gains_from_its_step():
    """A report with sparse sites names the default schedule's sparse share and Amdahl's law over the steps;
    the formula it prints is bench.whole_run's at equal steps (k = 1), and it follows the phase defaults; it
    names the measured alternative under a warm-up-stable-decay lr."""
    from bench.whole_run import projected_speedup
    from sparse_compile.phase import FINAL_DENSE_FRAC, WARMUP_FRAC
    from sparse_compile.report import run_line

    model = GPT(GPTConfig(block_size=128, n_layer=1, n_head=4, n_embd=128))
    text = str(explain(model, torch.randint(0, 256, (2, 128))))
    line = run_line()
    assert line in text.splitlines() and text.index(line) < text.index("blocks.0.mlp")
    sparse = 1 - WARMUP_FRAC - FINAL_DENSE_FRAC
    assert f"runs {sparse:.0%} of the steps sparse" in line
    for warmup, final in ((0.1, 0.4), (0.1, 0.1), (0.05, 0.15), (0.1, 0.65)):
        dense, frac = re.search(r"1 / \(([\d.]+) \+ ([\d.]+) / s\)", run_line(warmup, final)).groups()
        for s in (1.2, 1.475, 3.0):
            printed = 1 / (float(dense) + float(frac) / s)
            assert printed == pytest.approx(projected_speedup(1 - warmup - final, s)), (warmup, final, s)
        assert f"dense the first {warmup:.0%} and the last {final:.0%}" in run_line(warmup, final)
    # the opt-in for a warm-up-stable-decay lr is named with the condition it was measured under, not as the default
    assert "under a warm-up-stable-decay lr, PhaseSchedule.until_lr_decay" in line
    assert line.index("the default recipe") < line.index("until_lr_decay")
    # and the caveat of the runs those gains come from: short ones, and a longer run needs relatively more steps
    assert "runs far shorter than a full pre-training run" in line and "a longer run needed" in line
    with pytest.raises(ValueError, match="warmup=0.7, final_dense=0.4"):
        run_line(0.7, 0.4)
    short = explain(GPT(GPTConfig(block_size=64, n_layer=1, n_head=4, n_embd=128)), torch.randint(0, 256, (2, 64)))
    assert short.sparse_sites == [] and "a run:" not in str(short)  # nothing runs sparse: nothing to gain


@pytest.mark.parametrize(("hidden", "chunk"), [(4096, 128), (3072, 64), (11008, 16), (1536, 32)])
def test_a_site_takes_the_largest_chunk_its_hidden_size_allows(hidden, chunk):
    """hidden % (M * c) == 0 with M = 16: 4096 takes 128; 3072 = 3 * 1024 takes 64; 11008 = 43 * 256
    (Llama-7B's) takes 16; 1536 = 3 * 512 takes 32. The op's spec carries the site's chunk."""

    class Wide(ffn_zoo._Two):
        def __init__(self) -> None:
            super().__init__(d=32, h=hidden, d_out=32)

        def forward(self, x):
            return self.proj(torch.relu(self.fc(x)) ** 2)

    x = torch.randn(2, 128, 32)
    (gm,) = dynamo_graphs(Wide(), x)
    (record,) = sparsify_ffns(gm, SparsityConfig(activations="128:4:16", chunk=128, causal=True))
    assert record.sparse and record.chunk == chunk
    assert (f"chunks of {chunk}, not 128" in record.reason) == (chunk != 128)
    specs = [n.args[-1] for n in gm.graph.nodes if "sqrelu_ffn" in str(n.target)]
    assert len(specs) == 1 and f";chunk={chunk};" in specs[0] + ";"


def test_default_leaves_what_it_cannot_take_dense_with_reason():
    short = explain(GPT(GPTConfig(block_size=64, n_layer=1, n_head=4, n_embd=128)), torch.randint(0, 256, (2, 64)))
    assert short.sparse_sites == [] and len(short.dense_sites) == 1
    assert "need the sequence length (x's second-to-last dim) to be a multiple of V=128" in str(short)
    narrow = explain(GPT(GPTConfig(block_size=128, n_layer=1, n_head=4, n_embd=32)), torch.randint(0, 256, (2, 128)))
    assert narrow.sparse_sites == [] and len(narrow.dense_sites) == 1
    # hidden 128 < M * 16 = 256, the smallest chunk there is to fall back to
    assert "in chunks of 128 need hidden % (M * chunk) == 0; got hidden=128, M * chunk=2048" in str(narrow)


def test_shapes_the_kernels_cannot_take_stay_dense_with_reason():
    class Odd(ffn_zoo._Two):
        def __init__(self) -> None:
            super().__init__(d=30, h=120, d_out=30)

        def forward(self, x):
            return self.proj(torch.relu(self.fc(x)) ** 2)

    x = torch.randn(64, 30)
    weights = explain(Odd(), x, config={"weights": "2:4"})
    assert "multiples of 4" in weights.dense_sites[0].record.reason
    acts = explain(Odd(), x, config={"activations": "64:2:16"})
    assert "hidden % M == 0" in acts.dense_sites[0].record.reason
    ok = explain(Odd(), x, config={"activations": "64:2:8"})
    assert len(ok.sparse_sites) == 1
    small = explain(Odd(), x, config={"activations": "2:4", "min_hidden": 256})
    assert "min_hidden=256" in small.dense_sites[0].record.reason


def test_float64_model_stays_dense_with_reason():
    model = ffn_zoo.TorchReluSquare().double()
    report = explain(model, torch.randn(64, ffn_zoo.D, dtype=torch.float64))
    assert "dtype float64 is not one of" in report.dense_sites[0].record.reason


def test_model_without_ffn_reports_zero_sites():
    report = explain(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh()), torch.randn(4, 8))
    assert len(report) == 0
    assert str(report).startswith("sparse_compile report: 0 sparse FFN site(s), 0 dense")
    # the default's options in the head line: chunks scored on 16 rows, weights cast inside the op
    head = str(report).splitlines()[0]
    assert "chunk=128, causal, score_rows=16, weight_copies=recompute, weight_grad=dense" in head


def test_autocast_square_in_float32_still_matches():
    """CUDA autocast runs square (pow) in float32 between bf16 linears; emulate that dtype pattern on CPU."""
    model = ffn_zoo.TorchReluSquare()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        (gm,) = dynamo_graphs(model, torch.randn(64, ffn_zoo.D))
    (match,), _ = find_ffn_sites(gm.graph)
    ev = match.square.meta["example_value"]
    with ev.fake_mode:
        match.square.meta["example_value"] = ev.float()
    (record,) = sparsify_ffns(gm, SparsityConfig.preset("venom"))
    assert record.sparse and "cast to bfloat16" in record.reason
    (gm2,) = dynamo_graphs(ffn_zoo.TorchReluSquare(), torch.randn(64, ffn_zoo.D))
    (m2,), _ = find_ffn_sites(gm2.graph)
    ev2 = m2.relu.meta["example_value"]
    with ev2.fake_mode:
        m2.relu.meta["example_value"] = ev2.half()
    (dense,) = sparsify_ffns(gm2, SparsityConfig.preset("venom"))
    assert not dense.sparse and "chain changes dtype" in dense.reason


def test_chain_cut_by_a_graph_boundary_says_so():
    class Broken(ffn_zoo._Two):
        def forward(self, x):
            r = torch.relu(self.fc(x))
            torch._dynamo.graph_break()
            return self.proj(r.square())

    report = explain(Broken(), torch.randn(64, ffn_zoo.D))
    assert len(report.sparse_sites) == 0
    (site,) = report.dense_sites
    assert "relu is an output of this graph" in site.record.reason and "optimize_ddp" in site.record.reason


@pytest.mark.parametrize(
    "preset, inside",
    [
        ({"activations": "64:2:8", "weight_copies": "recompute"}, True),
        ({"activations": "64:2:8"}, False),
        ("venom", False),
    ],
)
def test_autocast_float32_weights_go_into_the_op_uncast(preset, inside):
    """Under autocast with weight_copies="recompute" the site passes the float32 parameters into the op
    (it casts them, and its backward keeps the parameters, not bf16 copies); by default ("keep") and
    with 2:4 weights the casts stay outside, as autocast's."""
    model = ffn_zoo.TorchReluSquare()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        (gm,) = dynamo_graphs(model, torch.randn(64, ffn_zoo.D))
    config = SparsityConfig(**preset) if isinstance(preset, dict) else SparsityConfig.preset(preset)
    (record,) = sparsify_ffns(gm, config)
    assert record.sparse and "cast to bfloat16" in record.reason
    assert ("backward keeps the float32 ones" in record.reason) == inside
    (op,) = [
        n
        for n in gm.graph.nodes
        if n.op == "call_function" and "sparse_compile" in str(n.target) and "sparsify_weight" not in str(n.target)
    ]
    x, w1, b1, w2, b2 = op.args[:5]
    assert x.meta["example_value"].dtype == torch.bfloat16
    for w in (w1, b1, w2, b2):
        assert w.meta["example_value"].dtype == (torch.float32 if inside else torch.bfloat16)


def test_a_static_token_count_off_v_reports_what_runs():
    """T = 512 tokens with V = 3: every call would run the activations dense. With nothing else sparse
    the site stays dense with the reason (and the backend warns); with 2:4 weights or token-dim weight
    gradients it runs sparse, its pattern columns without the activations; a symbolic T stays the op's
    to decide per call."""
    model = ffn_zoo.TorchReluSquare()
    x = torch.randn(1, 512, ffn_zoo.D)
    dense = explain(model, x, config={"activations": "3:2:8"})
    assert str(dense).startswith("sparse_compile report: 0 sparse FFN site(s), 1 dense")
    (site,) = dense.dense_sites
    assert site.record.warn and site.record.reason == (
        "T=512 is not a multiple of V=3 (x (1, 512, 32)): activations 3:2:8 would run dense at every call, and "
        "with weights=None and weight_grad='dense' nothing else is sparse"
    )
    assert dense.site_warnings == [f"the FFN <root> at {site.record.source} runs dense: {site.record.reason}"]

    weights = explain(model, x, config={"activations": "3:2:8", "weights": "2:4"})
    (site,) = weights.sparse_sites
    assert site.record.dense_activations == "T=512 is not a multiple of V=3" and not site.record.warn
    assert site.patterns == {"F1": "W2:4", "F2": "W2:4", "B1": "W2:4", "B2": "dense", "B3": "W2:4", "B4": "dense"}
    assert weights.site_warnings == [
        f"the FFN <root> at {site.record.source} runs sparse with dense activations: T=512 is not a multiple of V=3"
    ]
    grads = explain(model, x, config={"activations": "3:2:8", "weight_grad": "tokens:64:2:8"})
    (site,) = grads.sparse_sites
    assert site.patterns["F2"] == "dense" and site.patterns["B2"] == "tok64:2:8"

    for ok in (
        explain(model, torch.randn(1, 513, ffn_zoo.D), config={"activations": "3:2:8"}),
        explain(model, x, config={"activations": "3:2:8"}, dynamic=True),  # T symbolic
    ):
        (site,) = ok.sparse_sites
        assert site.patterns["F2"] == "A3:2:8" and not site.record.dense_activations and not ok.site_warnings


def test_only_dense_sites_the_options_did_not_ask_for_warn():
    """min_hidden's sites and near-misses (not relu² FFNs) stay dense without a warning."""
    x = torch.randn(64, ffn_zoo.D)
    small = explain(ffn_zoo.TorchReluSquare(), x, config={"activations": "2:4", "min_hidden": 256})
    assert len(small.dense_sites) == 1 and not small.site_warnings
    miss = explain(ffn_zoo.GeluFFN(), x, config={"activations": "2:4"})
    assert len(miss.dense_sites) == 1 and not miss.site_warnings
    f64 = explain(ffn_zoo.TorchReluSquare().double(), x.double(), config={"activations": "2:4"})
    assert f64.site_warnings == [
        f"the FFN <root> at {f64.sites[0].record.source} runs dense: dtype float64 is not one of float16, bfloat16, "
        "float32"
    ]
