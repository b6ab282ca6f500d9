"""The main job's pieces: corpus, model, and a short run of python -m bench.train on CPU."""

import csv
import importlib
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import sparse_compile
from bench.data import Batches, Corpus, stdlib_files
from bench.model import GPT, GPTConfig
from sparse_compile.report import run_line


def test_corpus_is_deterministic_and_local(tmp_path):
    a = Corpus.load(tmp_path / "a")
    b = Corpus.load(tmp_path / "b")
    assert np.array_equal(a.train, b.train) and np.array_equal(a.val, b.val)
    assert len(a.train) > 1_000_000 and len(a.val) > 100_000
    first = stdlib_files()[0].read_bytes()
    assert bytes(a.val[: len(first)]) == first  # file 0 goes to validation
    cached = Corpus.load(tmp_path / "a")
    assert isinstance(cached.train, np.memmap) and np.array_equal(cached.train, a.train)


def test_batches_repeat_with_the_seed(tmp_path):
    corpus = Corpus.load(tmp_path)
    x1, y1 = Batches(corpus.train, 4, 32, seed=7).next()
    x2, y2 = Batches(corpus.train, 4, 32, seed=7).next()
    assert torch.equal(x1, x2) and torch.equal(y1, y2)
    assert x1.shape == (4, 32) and x1.dtype == torch.int64
    assert torch.equal(x1[:, 1:], y1[:, :-1])


def test_ranks_split_the_global_batch_of_one_process(tmp_path):
    corpus = Corpus.load(tmp_path)
    whole = Batches(corpus.train, 6, 32, seed=3)
    ranks = [Batches(corpus.train, 2, 32, seed=3, rank=r, world=3) for r in range(3)]
    for _ in range(2):
        x, y = whole.next()
        parts = [b.next() for b in ranks]
        assert torch.equal(x, torch.cat([p[0] for p in parts])) and torch.equal(y, torch.cat([p[1] for p in parts]))
    with pytest.raises(ValueError, match="rank=3 must be in"):
        Batches(corpus.train, 2, 32, seed=3, rank=3, world=3)


def _write_log(path, losses: dict) -> None:
    path.parent.mkdir(parents=True)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["run", "step", "loss", "val_loss"])
        w.writeheader()
        for (run, step), (loss, val) in losses.items():
            w.writerow({"run": run, "step": step, "loss": loss, "val_loss": "" if val is None else val})


def test_compare_logs_reports_relative_differences(tmp_path):
    from bench.compare_logs import compare

    base = {("dense", 10): (4.0, None), ("dense", 20): (2.0, 2.5), ("sparse", 20): (2.2, 2.6)}
    other = {
        ("dense", 10): (4.04, None),
        ("dense", 20): (1.99, 2.4),
        ("sparse", 20): (2.2, 2.6),
        ("sparse", 30): (1.0, None),
    }
    _write_log(tmp_path / "a" / "log.csv", base)
    _write_log(tmp_path / "b" / "log.csv", other)
    rows, summary = compare([tmp_path / "a" / "log.csv", tmp_path / "b" / "log.csv"], every=10)
    assert [(r["run"], r["step"]) for r in rows] == [("dense", 10), ("dense", 20), ("sparse", 20)]  # shared steps only
    assert rows[0]["b vs a"] == "+1.00%" and rows[1]["b vs a"] == "-0.50%"
    worst = {w["run"]: w for w in summary}
    assert worst["dense"]["max |diff| train"] == "1.00%" and worst["dense"]["max |diff| val"] == "4.00%"
    assert worst["sparse"]["max |diff| train"] == "0.00%"


def test_compare_logs_by_step_pairs_a_sparse_run_with_its_dense_run(tmp_path, capsys):
    """--by-step: each file's only run, matched by step whatever its name; the val gap per evaluation,
    the base's lr over its peak, the other run's phase; a file with two runs is an error naming them."""
    from bench.compare_logs import compare
    from bench.compare_logs import main as compare_main

    def write(path, run, rows):  # (step, loss, val, lr, phase)
        path.parent.mkdir(parents=True)
        with open(path, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=["run", "step", "phase", "lr", "loss", "val_loss"])
            w.writeheader()
            for step, loss, val, lr, phase in rows:
                w.writerow({"run": run, "step": step, "phase": phase, "lr": lr, "loss": loss, "val_loss": val})

    write(tmp_path / "d" / "log.csv", "dense", [(10, 3.0, 2.9, 4e-4, "dense"), (20, 2.0, 2.5, 1e-4, "dense")])
    write(tmp_path / "s" / "log.csv", "sparse", [(10, 3.3, "", 2e-4, "sparse"), (20, 2.1, 2.55, 2e-4, "dense")])
    rows, _ = compare([tmp_path / "d" / "log.csv", tmp_path / "s" / "log.csv"], every=10, steps_only=True)
    assert [r["step"] for r in rows] == [10, 20]
    assert rows[0]["s vs d"] == "+10.00%" and "val s vs d" not in rows[0]  # the sparse run did not evaluate
    # the base's lr over its peak (the other file's would read 1.00x at both steps), the other run's phase
    assert rows[1]["val s vs d"] == "+2.00%" and rows[1]["lr / peak"] == "0.25x" and rows[1]["phase s"] == "dense"
    assert rows[0]["phase s"] == "sparse" and rows[0]["lr / peak"] == "1.00x"
    assert compare_main([str(tmp_path / "d" / "log.csv"), str(tmp_path / "s" / "log.csv"), "--by-step"]) == 0
    assert "| +2.00%" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="no \\(run, step\\) in common"):  # by name, dense and sparse share none
        compare([tmp_path / "d" / "log.csv", tmp_path / "s" / "log.csv"])
    _write_log(tmp_path / "two" / "log.csv", {("dense", 10): (3.0, None), ("sparse", 10): (3.1, None)})
    with pytest.raises(SystemExit, match=r"has runs \['dense', 'sparse'\]: expected one run per file"):
        compare([tmp_path / "d" / "log.csv", tmp_path / "two" / "log.csv"], steps_only=True)


def test_model_matches_a_plain_eager_forward():
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=32, n_layer=2, n_head=2, n_embd=32))
    idx = torch.randint(0, 256, (2, 32))
    logits, loss = model(idx, idx)
    x = model.wte(idx) + model.wpe(torch.arange(32))
    for b in model.blocks:
        h = b.ln_1(x)
        q, k, v = b.attn.c_attn(h).split(32, dim=2)
        q, k, v = (t.view(2, 32, 2, 16).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-1, -2)) / math.sqrt(16)
        att = att.masked_fill(torch.ones(32, 32).triu(1).bool(), float("-inf")).softmax(-1)
        x = x + b.attn.c_proj((att @ v).transpose(1, 2).reshape(2, 32, 32))
        x = x + b.mlp.c_proj(torch.relu(b.mlp.c_fc(b.ln_2(x))) ** 2)
    expected = model.ln_f(x) @ model.wte.weight.T
    torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-5)
    assert model.lm_head.weight is model.wte.weight


def test_train_smoke_on_cpu(tmp_path):
    out = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "bench.train",
        "--steps",
        "6",
        "--batch-size",
        "2",
        "--seq-len",
        "128",
        "--log-every",
        "2",
        "--eval-every",
        "2",
        "--eval-iters",
        "1",
        "--out",
        str(out),
        "--no-progress",
        "--data-dir",
        str(tmp_path / "data"),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "final val loss" in done.stdout and "speedup, sparse steps" in done.stdout
    rows = list(csv.DictReader(open(out / "log.csv")))
    assert {r["run"] for r in rows} == {"dense", "sparse"} and len(rows) == 6
    for r in rows:
        assert math.isfinite(float(r["loss"])) and float(r["tokens_per_s"]) > 0
        assert 0 <= float(r["h_zero_frac"]) <= 1
    assert any(r["phase"] == "sparse" for r in rows if r["run"] == "sparse")
    assert all(math.isfinite(float(r["val_loss"])) for r in rows if r["val_loss"])
    # the sparse phase's evaluations also run the same weights with dense FFNs: a different number
    both = [r for r in rows if r["val_loss_dense"]]
    assert both and all(r["run"] == "sparse" and r["phase"] == "sparse" for r in both)
    assert all(math.isfinite(float(r["val_loss_dense"])) and r["val_loss_dense"] != r["val_loss"] for r in both)
    assert "val loss sparse / dense FFNs" in done.stdout
    assert (out / "loss.png").stat().st_size > 10_000
    assert "final val loss" in (out / "summary.txt").read_text()


def test_train_evaluates_on_its_cadence_whatever_the_log_cadence(tmp_path):
    """--eval-every 4 with --log-every 3 (4 not a multiple of 3): validation at steps 4, 8 and the
    last, each on a logged row of its own (a 2000-step run's defaults, 62 and 250, are such a pair)."""
    from bench.train import main as train_main

    argv = ["--steps", "10", "--batch-size", "2", "--seq-len", "64", "--log-every", "3", "--eval-every", "4"]
    argv += ["--eval-iters", "1", "--no-progress", "--data-dir", str(tmp_path / "data"), "--runs", "dense"]
    assert train_main([*argv, "--out", str(tmp_path / "run")]) == 0
    rows = list(csv.DictReader(open(tmp_path / "run" / "log.csv")))
    assert [int(r["step"]) for r in rows] == [3, 4, 6, 8, 9, 10]
    assert [int(r["step"]) for r in rows if r["val_loss"]] == [4, 8, 10]
    assert all(float(r["tokens_per_s"]) > 0 for r in rows)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--steps", "0"], "expected an int > 0"),
        (["--warmup-frac", "0.7", "--final-dense-frac", "0.5"], "> 1"),
        (["--sparsity", "bogus"], "preset='bogus'"),
        (["--sparsity", '{"activations": "3:3:3"}'], "SparsityConfig.activations"),
        (["--seq-len", "4096"], "> block size"),
        (["--runs", "dense,fast"], "--runs"),
        (["--time-limit", "0"], "expected seconds > 0"),
        (["--dense-every", "1"], "--dense-every 1: PhaseSchedule.dense_every=1: expected 0 (never) or an int >= 2"),
        (["--final-dense-frac", "-0.1"], "--final-dense-frac: '-0.1': expected a fraction in [0, 1]"),
        (["--lr-warmup-frac", "1.5"], "--lr-warmup-frac: '1.5': expected a fraction in [0, 1]"),
        (["--fsdp-unit", "2"], "--fsdp-* flags apply with --distributed fsdp, not --distributed none"),
        (["--distributed", "fsdp", "--fsdp-unit", "0"], "--fsdp-unit 0: FSDP unit 0: expected blocks per unit >= 1"),
        (["--distributed", "fsdp", "--fsdp-prefetch", "-1"], "FSDP prefetch -1: expected an int >= 0"),
        (["--device", "cpu", "--distributed", "fsdp", "--fsdp-param-dtype", "bfloat16"], "needs --device cuda"),
    ],
)
def test_bad_arguments_exit_non_zero(args, message, capsys):
    from bench.train import parse_args

    with pytest.raises(SystemExit) as e:
        parse_args(args)
    assert e.value.code != 0 and message in capsys.readouterr().err


@pytest.mark.parametrize(("frac", "warm"), [(0.05, 5), (0.5, 50), (0.0, 1)])
def test_learning_rate_warms_up_linearly_then_decays_by_cosine_to_a_tenth(frac, warm):
    """lr(step) = peak (step + 1) / W for step < W = max(1, steps x frac), then peak (0.1 + 0.45 (1 +
    cos(pi (step - W) / (steps - W)))): computed here from the formula, independently of bench.train."""
    from bench.train import _lr, parse_args

    args = parse_args(["--device", "cpu", "--steps", "100", "--lr", "0.002", "--lr-warmup-frac", str(frac)])
    for step in (0, warm - 1, warm, 70, 99):
        want = (
            0.002 * (step + 1) / warm
            if step < warm
            else 0.002 * (0.1 + 0.45 * (1 + math.cos(math.pi * (step - warm) / (100 - warm))))
        )
        assert _lr(step, args) == pytest.approx(want, rel=1e-12), step
    defaults = parse_args(["--device", "cpu"])
    assert (defaults.lr_warmup_frac, defaults.warmup_frac, defaults.final_dense_frac) == (0.5, 0.1, 0.4)


def test_wsd_learning_rate_holds_the_peak_then_decays_linearly_to_a_tenth(capsys):
    """wsd over 100 steps, warm-up 0.2, decay 0.1: lr = peak (step + 1) / 20 below step 20, the peak up to
    step 89, then peak (1 - 0.9 (step - 89) / 10) over steps 90-99, ending at 0.1 x peak."""
    from bench.train import _lr, _lr_text, parse_args

    argv = ["--device", "cpu", "--steps", "100", "--lr", "0.002", "--lr-warmup-frac", "0.2", "--lr-schedule", "wsd"]
    argv += ["--lr-decay-frac", "0.1"]
    args = parse_args(argv)
    want = {0: 0.002 / 20, 19: 0.002, 20: 0.002, 89: 0.002, 90: 0.002 * 0.91, 94: 0.002 * 0.55, 99: 0.0002}
    for step, lr in want.items():
        assert _lr(step, args) == pytest.approx(lr, rel=1e-12), step
    assert "the last 10 steps linear to 0.1x (wsd)" in _lr_text(args)
    assert _lr(50, parse_args([*argv, "--lr-decay-frac", "0.5"])) == pytest.approx(0.002 * (1 - 0.9 * 1 / 50))
    with pytest.raises(SystemExit):
        parse_args([*argv, "--lr-decay-frac", "0.9"])  # 0.2 + 0.9 > 1: no room after the warm-up
    assert "fits after the warm-up" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_args([*argv, "--lr-decay-frac", "0"])
    assert parse_args(["--device", "cpu"]).lr_schedule == "cosine"


@pytest.mark.parametrize(("steps", "decay"), [(3200, None), (150, None), (2400, "0.1"), (97, "0.33")])
def test_phases_default_to_10_40_under_either_lr_schedule(steps, decay):
    """The phase flags default to from_fractions' 10% / 40% under --lr-schedule wsd as under cosine; given,
    --warmup-frac 0.05 and --final-dense-frac at the decay's share run dense from the first step below
    the peak lr on (PhaseSchedule.until_lr_decay's recipe)."""
    from bench.train import _lr, parse_args
    from sparse_compile import PhaseSchedule

    argv = ["--device", "cpu", "--steps", str(steps), "--lr-schedule", "wsd", "--lr-warmup-frac", "0.05"]
    argv += ["--lr-decay-frac", decay] if decay else []
    wsd = parse_args(argv)
    assert wsd.schedule == PhaseSchedule.from_fractions(steps, 0.1, 0.4)  # not until_lr_decay
    assert parse_args(["--device", "cpu", "--steps", str(steps)]).schedule == PhaseSchedule.from_fractions(steps)
    peak = [s for s in range(steps) if _lr(s, wsd) == wsd.lr]
    decay_steps = steps - 1 - peak[-1]  # from the lr itself: every step after the last at the peak
    assert decay_steps == int(steps * float(decay or 0.15) + 1e-9)
    opt_in = parse_args(argv + ["--warmup-frac", "0.05", "--final-dense-frac", str(decay_steps / steps)])
    assert opt_in.schedule == PhaseSchedule.until_lr_decay(steps, decay_steps)
    assert opt_in.schedule.dense_from_step == peak[-1] + 1


def test_bad_argument_exits_non_zero_from_the_command_line():
    done = subprocess.run(
        [sys.executable, "-m", "bench.train", "--steps", "0"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode != 0 and "expected an int > 0" in done.stderr


def test_dense_every_runs_dense_steps_inside_the_sparse_phase(tmp_path):
    """--dense-every 2: the sparse run's log keeps phase 'sparse' through its window (evaluated
    sparse, with the dense twin), and its losses equal the plain schedule's up to the window's first
    step and differ from its second on (run dense: another forward, then other weights)."""
    from bench.train import main as train_main

    common = ["--steps", "8", "--batch-size", "2", "--seq-len", "64", "--log-every", "1", "--eval-every", "4"]
    common += ["--eval-iters", "1", "--no-progress", "--data-dir", str(tmp_path / "data"), "--runs", "sparse"]
    common += ["--sparsity", '{"activations": "16:2:8"}']  # sparse at seq 64 (the default needs 128)
    logs = {}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # bitwise repeatable on the CPU (see the resume test)
    try:
        for name, extra in (("plain", []), ("every2", ["--dense-every", "2"])):
            torch._dynamo.reset()
            assert train_main([*common, *extra, "--out", str(tmp_path / name)]) == 0
            logs[name] = list(csv.DictReader(open(tmp_path / name / "log.csv")))
    finally:
        torch.set_num_threads(threads)
    summary = (tmp_path / "plain" / "summary.txt").read_text()
    assert "4 sparse FFN site(s), 0 dense" in summary
    # one report per compiled graph (training and evaluation), the run line once: it says the same of each
    assert summary.count("sparse_compile report:") >= 2 and summary.count(run_line()) == 1
    plain, every2 = logs["plain"], logs["every2"]
    assert [r["phase"] for r in plain] == [r["phase"] for r in every2]
    window = [i for i, r in enumerate(plain) if r["phase"] == "sparse"]  # steps 1..5 of 8 (warm-up 10%: 1)
    assert window and all(every2[i]["val_loss_dense"] for i in window if every2[i]["val_loss"])
    first = window[0]
    assert [r["loss"] for r in plain[: first + 1]] == [r["loss"] for r in every2[: first + 1]]
    assert plain[first + 1]["loss"] != every2[first + 1]["loss"]  # the window's second step: dense in every2
    assert "with one step in 2 dense" in (tmp_path / "every2" / "summary.txt").read_text()


def test_summary_reports_carry_the_run_line_once():
    """reports_text: the run line in the first report that has it (one with sparse sites), none after; reports
    without sites left out. Reports built from records by hand: a dense-only graph first, then two sparse ones."""
    from bench.train import reports_text
    from sparse_compile import SparsityConfig
    from sparse_compile.config import DEFAULT_PRESET
    from sparse_compile.passes import SiteRecord
    from sparse_compile.report import Report

    def report(sparse: bool) -> Report:
        reason = "" if sparse else "a near miss: GELU"
        record = SiteRecord("blocks.0.mlp", "model.py:1", "(2, 128, 64)", "256", "float32", "cpu", sparse, reason)
        return Report.from_records(SparsityConfig.preset(DEFAULT_PRESET), 0, [record])

    none = Report.from_records(SparsityConfig.preset(DEFAULT_PRESET), 0, [])
    reports = [none, report(False), report(True), report(True)]
    text = reports_text(reports)
    assert text.count("sparse_compile report:") == 3 and text.count(run_line()) == 1
    assert text.index(run_line()) > text.index("1 sparse FFN site(s)")  # in the first sparse report, not the dense one
    assert reports_text([report(False)]).count(run_line()) == 0 and reports_text([]) == ""


def test_resumed_runs_equal_the_uninterrupted_run(tmp_path):
    """--stop-at then --resume, twice (the dense run stopped mid-interval, then the sparse one): the
    logged losses, validation losses and sparsity health equal the uninterrupted run's bit for bit
    (CPU, fp32), and the model's state dict holds only the model's own keys."""
    from bench.train import main as train_main

    def main(argv):  # each call as its own process would: a fresh Dynamo
        torch._dynamo.reset()
        return train_main(argv)

    # Two uninterrupted CPU runs already differ in the last bits with several threads (a parallel
    # accumulation in the backward: losses 4.0426185 vs 4.0426186 at step 8); one thread is bitwise
    # repeatable, so that is where resume must equal the uninterrupted run.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        _resume_cases(tmp_path, main)
    finally:
        torch.set_num_threads(threads)


def test_resume_keeps_the_hidden_unit_permutations(tmp_path):
    """The same with {"permute": true} and --recluster-every 2: the permutations fitted before the stop
    are in the checkpoint and the resumed run goes on with them, equal to the uninterrupted run; the
    log times the probe forward and recluster() in the intervals that re-cluster."""
    from bench.train import main as train_main

    def main(argv):
        torch._dynamo.reset()
        return train_main(argv)

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        extra = ["--sparsity", '{"activations": "64:2:8", "permute": true}', "--recluster-every", "2"]
        state = _resume_cases(tmp_path, main, extra)
    finally:
        torch.set_num_threads(threads)
    assert sorted(state.current.units) == [f"blocks.{i}.mlp" for i in range(4)]
    assert not all(torch.equal(p, torch.arange(512)) for p in state.current.units.values())
    # the log's re-clustering seconds: positive in the sparse run's re-clustering intervals only
    for r in csv.DictReader(open(tmp_path / "whole" / "log.csv")):
        refit = r["run"] == "sparse" and r["phase"] == "sparse"
        assert (float(r["recluster_probe_s"]) > 0) == refit and (float(r["recluster_fit_s"]) > 0) == refit, r


def _logged(path, keys):
    """The rows of a bench.train log (log.csv or log_partial.csv), as lists of the ``keys`` columns."""
    return [[r[k] for k in keys] for r in csv.DictReader(open(path))]


def _resume_cases(tmp_path, main, extra=()):
    from bench import checkpoint
    from bench.train import PARTIAL_LOG

    common = ["--steps", "8", "--batch-size", "2", "--seq-len", "64", "--log-every", "2", "--eval-every", "4"]
    common += ["--eval-iters", "1", "--no-progress", "--data-dir", str(tmp_path / "data"), *extra]
    assert main([*common, "--out", str(tmp_path / "whole")]) == 0
    split = tmp_path / "split"
    assert main([*common, "--out", str(split), "--stop-at", "5"]) == 0
    state = torch.load(split / checkpoint.FILE, weights_only=False)
    assert state.current.name == "dense" and state.current.step == 5 and not state.finished
    assert set(state.current.model) == set(GPT(GPTConfig(block_size=128)).state_dict())
    keys = ["run", "step", "phase", "loss", "val_loss", "h_zero_frac", "h_kept_frac", "weight_flip_rate"]
    whole = _logged(tmp_path / "whole" / "log.csv", keys)
    assert len(whole) == 8  # dense steps 2, 4, 6, 8, then sparse
    assert _logged(split / PARTIAL_LOG, keys) == whole[:2] and not (split / "log.csv").exists()  # the points so far
    assert main([*common, "--resume", str(split), "--stop-at", "5"]) == 0
    state = torch.load(split / checkpoint.FILE, weights_only=False)
    assert list(state.finished) == ["dense"] and (state.current.name, state.current.step) == ("sparse", 5)
    assert _logged(split / PARTIAL_LOG, keys) == whole[:6]
    stopped = state
    assert main([*common, "--resume", str(split)]) == 0
    assert _logged(split / "log.csv", keys) == whole and not (split / PARTIAL_LOG).exists()
    return stopped


def test_time_limit_stops_with_a_checkpoint_and_resume_finishes_the_same_run(tmp_path):
    """--time-limit: the call stops after the first step past the limit, with a checkpoint; a
    --resume without it finishes the run, and the log equals the uninterrupted run's (one thread)."""
    from bench import checkpoint
    from bench.train import PARTIAL_LOG
    from bench.train import main as train_main

    def main(argv):
        torch._dynamo.reset()
        return train_main(argv)

    keys = ("run", "step", "loss", "val_loss")
    common = ["--steps", "4", "--batch-size", "2", "--seq-len", "64", "--log-every", "1", "--eval-every", "2"]
    common += ["--eval-iters", "1", "--runs", "dense", "--no-progress", "--data-dir", str(tmp_path / "data")]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert main([*common, "--out", str(tmp_path / "whole")]) == 0
        split = tmp_path / "split"
        assert main([*common, "--out", str(split), "--time-limit", "1e-6"]) == 0
        state = torch.load(split / checkpoint.FILE, weights_only=False)
        assert (state.current.name, state.current.step) == ("dense", 1)
        partial = _logged(split / PARTIAL_LOG, keys)
        assert not (split / "log.csv").exists()
        assert main([*common, "--resume", str(split), "--time-limit", "3600"]) == 0
    finally:
        torch.set_num_threads(threads)
    whole = _logged(tmp_path / "whole" / "log.csv", keys)
    assert len(whole) == 4 and partial == whole[:1] and _logged(split / "log.csv", keys) == whole


def test_deterministic_runs_repeat_bit_for_bit_with_several_threads(tmp_path, monkeypatch):
    """--deterministic: the same seed run twice gives the same losses and validation losses bit for bit
    with 4 threads (without it two such CPU runs part in the last bits from step 2 on: the parallel
    accumulations of the backward), and the flag is a resume-checked argument."""
    from bench.train import CHECKED_ARGS
    from bench.train import main as train_main

    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    common = ["--steps", "5", "--batch-size", "2", "--seq-len", "64", "--log-every", "1", "--eval-every", "5"]
    common += ["--eval-iters", "1", "--runs", "sparse", "--no-progress", "--data-dir", str(tmp_path / "data")]
    threads = torch.get_num_threads()
    torch.set_num_threads(4)
    logs = []
    try:
        for name in ("a", "b"):
            torch._dynamo.reset()
            assert train_main([*common, "--deterministic", "--out", str(tmp_path / name)]) == 0
            assert torch.are_deterministic_algorithms_enabled()
            rows = csv.DictReader(open(tmp_path / name / "log.csv"))
            logs.append([(r["step"], r["loss"], r["val_loss"]) for r in rows])
    finally:
        torch.use_deterministic_algorithms(False)
        torch.set_num_threads(threads)
    assert len(logs[0]) == 5 and logs[0] == logs[1]
    assert "deterministic" in CHECKED_ARGS


def test_resume_refuses_other_arguments(tmp_path):
    from bench.train import main

    common = ["--batch-size", "2", "--seq-len", "64", "--no-progress", "--data-dir", str(tmp_path / "data")]
    assert main([*common, "--steps", "4", "--runs", "dense", "--out", str(tmp_path / "a"), "--stop-at", "2"]) == 0
    assert main([*common, "--steps", "6", "--runs", "dense", "--resume", str(tmp_path / "a")]) == 2
    assert main([*common, "--steps", "4", "--runs", "dense", "--resume", str(tmp_path / "missing")]) == 2


def test_resume_of_a_checkpoint_older_than_an_argument_takes_what_it_ran(tmp_path):
    """A checkpoint written before --lr-schedule existed ran cosine (and the default --lr-decay-frac):
    it resumes under those and is refused under wsd."""
    from bench import checkpoint
    from bench.train import CHECKED_SINCE, checked_args, main, parse_args

    common = ["--batch-size", "2", "--seq-len", "64", "--no-progress", "--data-dir", str(tmp_path / "data")]
    out = tmp_path / "old"
    assert main([*common, "--steps", "4", "--runs", "dense", "--out", str(out), "--stop-at", "2"]) == 0
    ckpt = checkpoint.load(out, {})
    for key in CHECKED_SINCE:  # as an older bench.train wrote it (a cosine run holds no lr_decay_frac now)
        ckpt.args.pop(key, None)
    checkpoint.save(out, ckpt)
    args = parse_args([*common, "--steps", "4", "--runs", "dense"])
    checked = checked_args(args)
    assert "lr_decay_frac" not in checked  # cosine: the flag does nothing, so a changed default resumes
    assert "refit_routes" not in checked  # no routed tokens: likewise
    assert checkpoint.load(out, checked, CHECKED_SINCE).args == ckpt.args
    with pytest.raises(ValueError, match="lr_schedule"):
        checkpoint.load(out, checked | {"lr_schedule": "wsd"}, CHECKED_SINCE)
    with pytest.raises(ValueError, match="lr_schedule"):
        checkpoint.load(out, checked)  # without the defaults, a missing argument reads as changed
    assert main([*common, "--steps", "4", "--runs", "dense", "--lr-schedule", "wsd", "--resume", str(out)]) == 2
    assert main([*common, "--steps", "4", "--runs", "dense", "--resume", str(out)]) == 0


def _tree(root, files: dict) -> None:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


def test_packages_corpus_is_deterministic_deduplicated_and_split_by_file(tmp_path):
    from bench.data import is_val, package_files

    a, b = tmp_path / "a", tmp_path / "b"
    _tree(a, {f"m{i}.py": f"x = {i}\n" * (i + 1) for i in range(40)} | {"site-packages/s.py": "skip\n"})
    _tree(b, {"dup.py": "x = 3\n" * 4, "pkg/z.py": "zz\n", "pkg/a.py": "aa\n"})
    roots = [("stdlib", a), ("lib", b)]
    names = [n for n, _ in package_files(roots)]
    assert names == sorted(n for n in names if n.startswith("stdlib/")) + ["lib/dup.py", "lib/pkg/a.py", "lib/pkg/z.py"]
    assert not any("site-packages" in n for n in names)
    one = Corpus.load(tmp_path / "c1", source="packages", roots=roots)
    two = Corpus.load(tmp_path / "c2", source="packages", roots=roots)
    assert np.array_equal(one.train, two.train) and np.array_equal(one.val, two.val)
    assert one.n_files == 42  # lib/dup.py repeats stdlib/m3.py byte for byte
    files = dict(package_files(roots))
    unique = [n for n in names if n != "lib/dup.py"]
    want_val = b"".join(files[n].read_bytes() for n in unique if is_val(n))
    want_train = b"".join(files[n].read_bytes() for n in unique if not is_val(n))
    assert bytes(one.val) == want_val and bytes(one.train) == want_train and want_val and want_train
    assert "stdlib + lib" in one.source and "42 after removing duplicates" in one.source
    with pytest.raises(ValueError, match="corpus source='web'"):
        Corpus.load(tmp_path, source="web")


def test_site_corpus_takes_every_site_packages_folder_but_caches_metadata_links_and_vendored_copies(tmp_path):
    """The "site" corpus: the standard library, then each folder under the site-packages folders by name,
    the first of a name kept (not __pycache__, *.dist-info, *.egg-info, *.data, links, nor loose files);
    less vendored copies and files over MAX_SITE_FILE; built and split as "packages" is, keyed also by the
    installed distributions."""
    from bench.data import MAX_SITE_FILE, package_files, site_files, site_roots

    site, plat = tmp_path / "site-packages", tmp_path / "plat"
    _tree(site, {"zeta/z.py": "z = 1\n", "alpha/a.py": "a = 1\n", "alpha/sub/b.py": "b = 2\n", "loose.py": "no\n"})
    _tree(site, {"__pycache__/c.py": "no\n", "alpha-1.0.dist-info/m.py": "no\n", "old.egg-info/e.py": "no\n"})
    _tree(site, {"x-1.0.data/d.py": "no\n", "beta/_vendor/six.py": "six\n", "beta/core.py": "c = 3\n"})
    _tree(site, {"beta/big.py": "#" * (MAX_SITE_FILE + 1)})
    _tree(plat, {"alpha/other.py": "no: alpha is site's\n", "mid/m.py": "m = 4\n"})
    (site / "aalink").symlink_to(site, target_is_directory=True)  # a link back into site-packages
    roots = site_roots([site, plat])
    assert [label for label, _ in roots] == ["stdlib", "alpha", "beta", "mid", "zeta"]  # sorted, whatever the order
    assert dict(roots[1:]) == {
        "alpha": site / "alpha",
        "beta": site / "beta",
        "mid": plat / "mid",
        "zeta": site / "zeta",
    }
    lib = tmp_path / "lib"
    _tree(lib, {f"m{i}.py": f"y = {i}\n" * (i + 2) for i in range(30)})
    roots = [("stdlib", lib), *roots[1:]]
    names = [n for n, _ in site_files(roots)]
    assert "beta/core.py" in names and "beta/_vendor/six.py" not in names and "beta/big.py" not in names
    corpus = Corpus.load(tmp_path / "c", source="site", roots=roots)
    assert corpus.n_files == 35 and "site-packages (4 folders)" in corpus.source  # 30 + a, b, core, m, z
    assert corpus.source.startswith("Python ") and "stdlib" in corpus.source
    files = dict(site_files(roots))
    assert len(bytes(corpus.train)) + len(bytes(corpus.val)) == sum(p.stat().st_size for p in files.values())
    assert len(files) < len(package_files(roots))
    assert len(list((tmp_path / "c").glob("site-*-train.u8"))) == 1  # its own cache, apart from "packages"
    (site / "alpha-1.1.dist-info").mkdir()  # an upgrade that keeps every file's size: a new build, a new key
    Corpus.load(tmp_path / "c", source="site", roots=roots)
    assert len(list((tmp_path / "c").glob("site-*-train.u8"))) == 2


def test_packages_corpus_of_this_machine(tmp_path):
    corpus = Corpus.load(tmp_path, source="packages")
    assert len(corpus.train) > 60_000_000 and len(corpus.val) > 3_000_000
    assert corpus.source.startswith("Python ") and "torch " in corpus.source and "sympy " in corpus.source


def _log(folder, rows):
    folder.mkdir()
    fields = ["run", "step", "segment", "phase", "lr", "loss", "val_loss", "val_loss_dense", "tokens_per_s",
              "h_zero_frac", "h_kept_frac", "weight_flip_rate"]  # fmt: skip
    with open(folder / "log.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fields, restval="")
        w.writeheader()
        w.writerows(rows)


def test_seeds_pairs_runs_and_reports_the_spread(tmp_path, capsys):
    from bench.seeds import load, main, summarize

    for name, dense, sparse, kept in (("s0", 1.00, 1.02, (0.6, 0.8)), ("s1", 1.01, 1.00, (0.7, 0.7))):
        _log(tmp_path / name, [
            {"run": "dense", "step": 1, "phase": "dense", "val_loss": 9.0},
            {"run": "dense", "step": 2, "phase": "dense", "val_loss": dense},
            {"run": "sparse", "step": 1, "phase": "sparse", "val_loss": 9.0, "val_loss_dense": 10.0,
             "h_kept_frac": kept[0]},
            {"run": "sparse", "step": 2, "phase": "dense", "val_loss": sparse, "h_kept_frac": 0.99},
            {"run": "sparse", "step": 3, "phase": "sparse", "val_loss": "", "h_kept_frac": kept[1]},
        ])  # fmt: skip
    runs = [load(tmp_path / "s0"), load(tmp_path / "s1")]
    assert [r.diff for r in runs] == pytest.approx([0.02, -0.01 / 1.01])
    assert [r.kept for r in runs] == pytest.approx([0.7, 0.7])  # sparse-phase rows only
    assert [r.lead for r in runs] == pytest.approx([-0.1, -0.1])  # (9 - 10) / 10 at the last sparse eval
    s = summarize(runs)
    assert s["dense_spread"] == pytest.approx(0.01 / 1.005)
    assert s["diff_mean"] == pytest.approx((0.02 - 0.01 / 1.01) / 2)
    assert s["diff_se"] == pytest.approx(abs(0.02 + 0.01 / 1.01) / 2)  # stdev of 2 / sqrt(2)
    assert s["lead_mean"] == pytest.approx(-0.1)
    swapped = load(tmp_path / "s0", sparse_from=tmp_path / "s1")
    assert (swapped.dense, swapped.sparse) == (1.00, 1.00)
    _log(tmp_path / "dense_only", [{"run": "dense", "step": 1, "phase": "dense", "val_loss": 1.0}])
    assert main([str(tmp_path / "dense_only")]) == 2
    # --dense-only: the dense finals' spread and std over the mean, sparse runs not needed
    assert main(["--dense-only", str(tmp_path / "s0"), str(tmp_path / "s1"), str(tmp_path / "dense_only")]) == 0
    out = capsys.readouterr().out
    assert "spread (max - min) / mean: 1.00%" in out and "std / mean: 0.58%" in out  # finals 1.00, 1.01, 1.00
    _log(tmp_path / "sparse_only", [{"run": "sparse", "step": 1, "phase": "sparse", "val_loss": 1.0}])
    assert main(["--dense-only", str(tmp_path / "sparse_only")]) == 2
    assert "no validation loss for the dense run" in capsys.readouterr().err
    assert main([str(tmp_path / "s0"), str(tmp_path / "s1"), "--csv", str(tmp_path / "seeds.csv")]) == 0
    assert "summary" in (tmp_path / "seeds.csv").read_text()
    # --merge: the per-seed rows of two CSVs (summary rows left out) pooled into one table
    assert main([str(tmp_path / "s1"), "--csv", str(tmp_path / "more.csv")]) == 0
    capsys.readouterr()
    assert main(["--merge", str(tmp_path / "seeds.csv"), str(tmp_path / "more.csv"),
                 "--csv", str(tmp_path / "merged.csv")]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "mean of 3" in out
    # finals dense 1.00, 1.01, 1.01 and sparse 1.02, 1.00, 1.00: perfectly anti-correlated; the
    # unpaired s.e. sqrt((var_d + var_s) / 3) / mean_d = sqrt((1/3 + 4/3) 1e-4 / 3) / (3.02 / 3) = 0.74%
    assert "correlation of a seed's dense and sparse finals: -1.00" in out
    assert "the difference of the means is +0.00% ± 0.74%" in out
    merged = list(csv.DictReader(open(tmp_path / "merged.csv")))
    diffs = [0.02, -0.01 / 1.01, -0.01 / 1.01]
    assert [r["seed"] for r in merged] == ["s0", "s1", "s1", "summary"]
    assert float(merged[-1]["diff_mean"]) == pytest.approx(sum(diffs) / 3)
    assert float(merged[-1]["diff_se"]) == pytest.approx(statistics.stdev(diffs) / math.sqrt(3))
    assert float(merged[-1]["kept_mean"]) == pytest.approx(0.7)
    (tmp_path / "bad.csv").write_text("seed,dense\ns0,1.0\n")
    assert main(["--merge", str(tmp_path / "bad.csv")]) == 2
    assert "bad.csv: not a bench.seeds CSV" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([str(tmp_path / "s0"), "--merge", str(tmp_path / "seeds.csv")])  # folders and --merge: refused
    # --dense-csv: sparse-only folders against the dense finals of an earlier CSV's rows (s0 1.00, s1 1.01)
    for name, sparse in (("x_s0", 1.03), ("x_s1", 0.99)):
        _log(tmp_path / name, [{"run": "sparse", "step": 1, "phase": "sparse", "val_loss": sparse, "h_kept_frac": 0.5}])
    assert main([str(tmp_path / "x_s0"), str(tmp_path / "x_s1"), "--dense-csv", str(tmp_path / "seeds.csv"),
                 "--csv", str(tmp_path / "against.csv")]) == 0  # fmt: skip
    against = list(csv.DictReader(open(tmp_path / "against.csv")))
    assert [r["seed"] for r in against[:2]] == ["s0 (csv) / x_s0", "s1 (csv) / x_s1"]
    assert [float(r["diff"]) for r in against[:2]] == pytest.approx([0.03, -0.02 / 1.01])
    assert float(against[0]["kept"]) == pytest.approx(0.5)
    # against a CSV that was itself paired with a CSV: the dense run is named once
    assert main([str(tmp_path / "x_s0"), str(tmp_path / "x_s1"), "--dense-csv", str(tmp_path / "against.csv"),
                 "--csv", str(tmp_path / "again.csv")]) == 0  # fmt: skip
    again = list(csv.DictReader(open(tmp_path / "again.csv")))
    assert [r["seed"] for r in again[:2]] == ["s0 (csv) / x_s0", "s1 (csv) / x_s1"]
    capsys.readouterr()
    assert main([str(tmp_path / "x_s1"), str(tmp_path / "x_s0"), "--dense-csv", str(tmp_path / "seeds.csv")]) == 2
    assert "x_s1: seed 1, paired with the dense run of seed 0" in capsys.readouterr().err
    assert main([str(tmp_path / "x_s0"), "--dense-csv", str(tmp_path / "seeds.csv")]) == 2
    assert "2 per-seed rows for 1 folders" in capsys.readouterr().err


def test_seeds_notes_pairs_across_devices(tmp_path, capsys):
    """A pair whose summaries name different devices gets a note naming both runs and devices; a pair
    on one device, or one without a summary, none."""
    from bench.seeds import across_devices, main

    h100, h200 = "NVIDIA H100 80GB HBM3", "NVIDIA H200"
    for name, device in (("d0", h100), ("a0", h200), ("b0", h100), ("c0", None)):
        _log(tmp_path / name, [
            {"run": "dense", "step": 1, "phase": "dense", "val_loss": 1.0},
            {"run": "sparse", "step": 1, "phase": "sparse", "val_loss": 1.01, "h_kept_frac": 0.5},
        ])  # fmt: skip
        if device:
            (tmp_path / name / "summary.txt").write_text(f"model tiny\ndevice: {device}\ntorch: 2.11.0\n")
    d0, a0, b0, c0 = (str(tmp_path / n) for n in ("d0", "a0", "b0", "c0"))
    assert main([d0, "--sparse-from", a0]) == 0
    out = capsys.readouterr().out
    assert "note: pairs across devices" in out and f"d0 on {h100}, a0 on {h200}" in out
    assert main([d0, b0, "--sparse-from", b0, a0]) == 0  # only the second pair differs
    out = capsys.readouterr().out
    assert f"b0 on {h100}, a0 on {h200}" in out and "d0 on" not in out
    assert main([d0, "--sparse-from", b0]) == 0 and "across devices" not in capsys.readouterr().out
    assert main([a0]) == 0 and "across devices" not in capsys.readouterr().out  # one folder, both runs
    assert across_devices([(tmp_path / "d0", tmp_path / "c0")]) == ""  # no summary: nothing to compare


@pytest.mark.parametrize("names", [("sparse",), ("dense", "sparse")])
def test_summary_lead_row_in_the_sparse_column(names):
    """The sparse-vs-dense-FFN row sits under the sparse run whether or not a dense run is there."""
    from bench.train import RunResult, summary_table

    results = {n: RunResult(n, final_val_loss=2.0 + i) for i, n in enumerate(names)}
    results["sparse"].rows = [{"step": 7, "val_loss": 1.8, "val_loss_dense": 2.0}]
    line = next(x for x in summary_table(results).splitlines() if "sparse / dense FFNs" in x)
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[0] == "sparse run at step 7: val loss sparse / dense FFNs"
    assert cells[names.index("sparse") + 1] == "1.8000 / 2.0000 (-10.00%)"


def test_summary_routed_row_gives_the_first_and_last_logged_fit_against_a_random_group():
    """With routed tokens the summary shows a refit sample's best-group share at the first and the last logged
    refit beside what a random group keeps (4/M), so groups that stopped following the model show."""
    from bench.train import RunResult, summary_table

    results = {"sparse": RunResult("sparse", final_val_loss=2.0)}
    nan = float("nan")
    results["sparse"].rows = [
        {"step": s, "route_oracle_frac": f} for s, f in ((1, nan), (2, 0.81), (3, 0.4), (4, 0.26))
    ]
    line = next(x for x in summary_table(results, keep=0.25).splitlines() if "routed groups" in x)
    assert [c.strip() for c in line.strip("|").split("|")][1] == "0.810 / 0.260 (a random group: 0.250)"
    assert "routed groups" not in summary_table(results)  # no keep given: not a routed run
    results["sparse"].rows = [{"step": 1, "route_oracle_frac": nan}]  # never fitted: no row
    assert "routed groups" not in summary_table(results, keep=0.25)


def _states(stdout: str) -> dict[str, str]:
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in stdout.splitlines() if line.startswith("| ")]
    return {c[0]: c[1] for c in cells if len(c) == 2 and c[0] != "run"}


def test_sweep_stops_resumes_and_tables_each_configuration(tmp_path):
    """bench.sweep over two calls: the first's 0.5 s leaves every process its first step (model
    build and compile take longer), after which it stops with a checkpoint; the second resumes and
    finishes them; then the paired table and CSV of the configuration against the dense seed."""
    out = tmp_path / "sweep"
    train = ["--steps", "4", "--batch-size", "2", "--seq-len", "64", "--log-every", "2", "--eval-every", "2"]
    train += ["--eval-iters", "1", "--data-dir", str(tmp_path / "data")]
    cmd = [sys.executable, "-m", "bench.sweep", "--sparsity", '{"activations": "64:2:8"}', "--seeds", "0"]
    cmd += ["--parallel", "2", "--min-seconds", "0", "--out", str(out)]
    first = subprocess.run([*cmd, "--time-limit", "0.5", "--", *train], capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
    states = _states(first.stdout)
    for arm, run in (("dense", "dense"), ("activations-64-2-8", "sparse")):
        assert states[f"{arm}_s0"] == f"stopped {run} after step 1"
        assert (out / f"{arm}_s0" / "checkpoint.pt").is_file() and not (out / f"{arm}_s0" / "summary.txt").exists()
        assert (out / f"{arm}_s0" / "log_partial.csv").is_file()
    second = subprocess.run([*cmd, "--time-limit", "600", "--", *train], capture_output=True, text=True, timeout=600)
    assert second.returncode == 0, second.stdout[-2000:] + second.stderr[-2000:]
    assert set(_states(second.stdout).values()) == {"finished"}
    assert "dense_s0 / activations-64-2-8_s0" in second.stdout
    rows = list(csv.DictReader(open(out / "activations-64-2-8_seeds.csv")))
    assert rows[-1]["seed"] == "summary" and math.isfinite(float(rows[0]["sparse"]))
    assert float(rows[0]["dense"]) != float(rows[0]["sparse"])


def test_sweep_arm_with_its_own_train_arguments(tmp_path, capsys):
    """A --sparsity value with ' -- ARGS': its jobs get ARGS after the shared ones (so the arm's own
    flag wins), its folder name says so, and two arms that differ only in ARGS are two arms."""
    import argparse

    from bench.sweep import jobs_of, split_arm
    from bench.train import parse_args as train_args

    causal = '{"activations": "128:4:16", "causal": true}'
    assert split_arm(f"{causal} -- --final-dense-frac 0.4") == (causal, ["--final-dense-frac", "0.4"])
    assert split_arm("venom") == ("venom", [])
    args = argparse.Namespace(
        sparsity=[causal, f"{causal} -- --final-dense-frac 0.4"],
        seeds=[0],
        dense=[tmp_path / "d0"],
        dense_csv=None,
        out=tmp_path,
        train=["--steps", "8"],
    )
    jobs, folders = jobs_of(args)
    assert [j.folder.name for j in jobs] == [
        "activations-128-4-16-causal-true_s0",
        "activations-128-4-16-causal-true-final-dense-frac-0-4_s0",
    ]
    own = ["--runs", "sparse", "--sparsity", causal]
    shared = ["--seed", "0", "--no-progress", "--steps", "8"]
    assert jobs[1].argv == [*own, *shared, "--final-dense-frac", "0.4"]  # the arm's own arguments last
    assert jobs[0].argv == [*own, *shared]
    args.sparsity = [f"{causal} -- --steps 12"]  # a flag given both ways: the arm's own wins, dense keeps the shared
    args.dense = None
    jobs, _ = jobs_of(args)
    steps = {j.arm: train_args([*j.argv, "--out", "x"]).steps for j in jobs}
    assert steps == {"dense": 8, "activations-128-4-16-causal-true-steps-12": 12}
    args.sparsity, args.dense = [causal, f"{causal} -- --final-dense-frac 0.4"], [tmp_path / "d0"]
    from bench.sweep import main as sweep_main

    for bad in ([f"{causal} -- --seed 7"], [causal, "venom -- --runs=dense"]):  # the sweep's own flags: refused
        argv = [x for t in bad for x in ("--sparsity", t)]
        with pytest.raises(SystemExit):
            sweep_main([*argv, "--time-limit", "1", "--out", str(tmp_path / "bad")])
        assert "the sweep sets --seed" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        sweep_main(["--sparsity", causal, "--time-limit", "1", "--out", str(tmp_path / "bad"), "--", "--out", "x"])
    assert "['--out']: the sweep sets" in capsys.readouterr().err
    for abbreviated in ("--see", "--run=dense"):  # bench.train takes no abbreviation that could slip past
        with pytest.raises(SystemExit):
            train_args(["--sparsity", causal, abbreviated, "7"])
        assert "unrecognized arguments" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()
    assert folders["dense"] == [tmp_path / "d0"]
    args.dense, args.dense_csv = None, tmp_path / "dense.csv"  # dense finals from a CSV: no dense job
    jobs, folders = jobs_of(args)
    assert "dense" not in folders and all(j.arm != "dense" for j in jobs) and len(jobs) == 2


def test_sweep_spreads_processes_over_gpus(tmp_path, monkeypatch, capsys):
    """--gpus 2 --parallel 3: each process sees one GPU, the least busy; without --gpus the
    environment is left alone."""
    import bench.sweep as sweep

    lifetimes = {"a_s0": 1, "b_s0": 3, "c_s0": 3, "d_s0": 1}  # polls until each process ends
    seen = {}

    class FakeProc:
        def __init__(self, cmd, stdout, stderr, env):
            self.name = Path(cmd[cmd.index("--out") + 1]).name
            seen[self.name] = None if env is None else env["CUDA_VISIBLE_DEVICES"]
            self.left = lifetimes[self.name]
            self.returncode = None

        def poll(self):
            self.left -= 1
            if self.left <= 0:
                self.returncode = 0
            return self.returncode

    monkeypatch.setattr(sweep.subprocess, "Popen", FakeProc)
    jobs = [sweep.Job(n[0], 0, tmp_path / n, []) for n in lifetimes]
    sweep.run(jobs, parallel=3, seconds=60, min_seconds=0, poll=0, gpus=2)
    # a -> 0, b -> 1, c -> 0; a ends first, so d goes to GPU 0 (1 process each: the lower index)
    assert seen == {"a_s0": "0", "b_s0": "1", "c_s0": "0", "d_s0": "0"}
    assert sweep.least_busy([2, 1, 1]) == 1
    seen.clear()
    jobs = [sweep.Job(n[0], 0, tmp_path / f"x{n}", []) for n in lifetimes]
    lifetimes.update({f"x{n}": 1 for n in list(lifetimes)})
    sweep.run(jobs, parallel=3, seconds=60, min_seconds=0, poll=0)
    assert set(seen.values()) == {None}
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5")  # the sweep's own GPUs: its children get 4 and 5
    assert [sweep.visible_device(i) for i in (0, 1)] == ["4", "5"]
    if torch.cuda.device_count() < 2:
        with pytest.raises(SystemExit):
            sweep.main(["--sparsity", "chunked", "--gpus", "2", "--time-limit", "1", "--out", str(tmp_path / "g")])
        assert "--gpus 2: this machine shows" in capsys.readouterr().err


def test_sweep_stops_its_processes_when_it_fails(tmp_path, monkeypatch):
    """A process that cannot start (OSError), or ^C while the sweep waits: the processes already
    started are terminated before the error goes on, not left running."""
    import bench.sweep as sweep

    real_popen, started = subprocess.Popen, []

    def popen(cmd, **kw):
        if started:
            raise OSError("no more processes")
        started.append(real_popen([sys.executable, "-c", "import time; time.sleep(60)"], **kw))
        return started[-1]

    monkeypatch.setattr(sweep.subprocess, "Popen", popen)
    try:
        jobs = [sweep.Job("a", s, tmp_path / f"a_s{s}", []) for s in (0, 1)]
        with pytest.raises(OSError, match="no more processes"):
            sweep.run(jobs, parallel=2, seconds=60, min_seconds=0, poll=0)
        assert started[0].poll() is not None
        jobs, started[:] = [sweep.Job("b", 0, tmp_path / "b_s0", [])], []

        def interrupt(seconds):
            raise KeyboardInterrupt

        # the sweep's own clock only: subprocess's waits sleep through the time module too
        monkeypatch.setattr(sweep, "time", SimpleNamespace(monotonic=time.monotonic, sleep=interrupt))
        with pytest.raises(KeyboardInterrupt):
            sweep.run(jobs, parallel=2, seconds=60, min_seconds=0, poll=0)
        assert started[0].poll() is not None
        jobs, started[:] = [sweep.Job("c", 0, tmp_path / "c_s0", [])], []

        class FailingClose:  # the log file fails to close right after the process started
            def __init__(self, path, mode):
                self.file = open(path, mode)

            def __enter__(self):
                return self.file

            def __exit__(self, *exc):
                self.file.close()
                raise OSError("disk full")

        monkeypatch.setattr(sweep, "open", FailingClose, raising=False)
        with pytest.raises(OSError, match="disk full"):
            sweep.run(jobs, parallel=2, seconds=60, min_seconds=0, poll=0)
        assert started[0].poll() is not None
    finally:  # without the sweep's own clean-up, not a minute of sleeping children after the test
        for proc in started:
            proc.kill()
            proc.wait()


def test_sweep_stop_kills_what_terminate_does_not_end_and_a_second_interrupt_too():
    from bench.sweep import stop

    code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(1, flush=True); time.sleep(60)"
    deaf = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE) for _ in range(2)]
    try:
        for proc in deaf:
            proc.stdout.readline()  # its SIGTERM handler is set
        stop(deaf[:1], grace=0.2)
        assert deaf[0].poll() is not None and deaf[1].poll() is None
        real_wait = deaf[1].wait

        def interrupted(timeout=None):
            if timeout is not None:
                raise KeyboardInterrupt
            return real_wait()

        deaf[1].wait = interrupted
        with pytest.raises(KeyboardInterrupt):
            stop(deaf[1:], grace=30)
        assert deaf[1].poll() is not None  # killed at once, not after the grace
    finally:
        for proc in deaf:
            proc.kill()
            proc.wait()


def test_op_host_time_rounds_move_every_row():
    from bench.op_host_time import round_orders

    rows = [f"r{i}" for i in range(8)]
    orders = round_orders(rows, 3)
    assert len(orders) == 3 and all(sorted(o) == sorted(rows) for o in orders)
    assert orders[0] == rows
    for row in rows:  # each row at three different places, so an order effect shows as a range
        assert len({o.index(row) for o in orders}) == 3, row
    assert round_orders(rows, 1) == [rows]


@pytest.mark.parametrize(
    "module, flag",
    [("op_host_time", "--calls"), ("op_host_time", "--rounds"), ("wgrad_step", "--layers"), ("wgrad_step", "--steps"),
     ("wgrad_step", "--every")],
)  # fmt: skip
def test_gpu_bench_bad_counts_are_refused(capsys, module, flag):
    bench = importlib.import_module(f"bench.{module}")
    with pytest.raises(SystemExit) as exit_info:
        bench.main([flag, "0"])
    assert exit_info.value.code == 2
    assert f"{flag} 0: expected an int >= 1" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU")
@pytest.mark.parametrize("module, argv", [("op_host_time", ["--calls", "2"]), ("wgrad_step", ["--layers", "1"])])
def test_gpu_bench_refuses_without_a_gpu(capsys, module, argv):
    bench = importlib.import_module(f"bench.{module}")
    with pytest.raises(SystemExit) as exit_info:
        bench.main(argv)
    assert exit_info.value.code == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


def test_the_wide_125m_size_takes_chunks_of_128_at_keep_one_quarter():
    """125m-d1024: as many parameters as 125m (within 2%), FFN hidden 4096, which the chunk path
    takes at 128:4:16 in chunks of 128 (M * c = 2048 divides h); 125m's 3072 is not a multiple."""
    from bench.model import GPT, SIZES

    with torch.device("meta"):
        wide, base = GPT(SIZES["125m-d1024"]), GPT(SIZES["125m"])
    assert abs(wide.num_params() / base.num_params() - 1) < 0.02
    hidden = wide.blocks[0].mlp.c_fc.out_features
    # passes/legality.py's rule for chunks: hidden % (M * chunk) == 0
    assert hidden == 4096 and hidden % (16 * 128) == 0 and base.blocks[0].mlp.c_fc.out_features % (16 * 128)


def test_wgrad_step_kept_counts_reads_the_csr_offsets():
    """Blocks keeping each chunk = the csr offsets' differences: counts 1, 3, 0, 4 (mean 2)."""
    from bench.wgrad_step import kept_counts

    text = kept_counts(torch.tensor([0, 1, 4, 4, 8], dtype=torch.int32))
    assert text.startswith("kept blocks per chunk: mean 2.0, max 4 (2.00x)") and text.endswith("min 0")


def test_main_job_runs_its_sites_by_the_default_rule_where_that_keeps_them_all_sparse():
    """small_ffn of the sparse run: 'graphs' (the user's default, CUDA graphs) where its size rule runs
    every site sparse; else 'sparse' (forced, no graphs); --sparsity may set it."""
    import argparse
    import dataclasses

    from bench.train import main_job_small_ffn, parse_args
    from sparse_compile.config import BackendOptions, SparsityConfig

    def args(**kw) -> argparse.Namespace:
        base = {"size": "125m-d1024", "batch_size": 16, "seq_len": 1024, "device": "cuda", "distributed": "none"}
        return argparse.Namespace(**{**base, "compile_mode": "default", **kw})

    chunked = BackendOptions.parse(None).config
    plain = SparsityConfig(activations="128:4:16")
    assert main_job_small_ffn(args(), chunked) == "graphs"  # 16384 x 1024 x 4096 = 2**36 >= 2**35
    assert main_job_small_ffn(args(), plain) == "graphs"  # >= 2**36
    assert main_job_small_ffn(args(size="125m"), chunked) == "graphs"  # 3.9e10 >= 2**35
    assert main_job_small_ffn(args(size="125m"), plain) == "sparse"  # 3.9e10 < 2**36: the rule keeps it dense
    assert main_job_small_ffn(args(batch_size=4), chunked) == "sparse"  # 2**34
    for other in ({"device": "cpu"}, {"distributed": "ddp"}, {"compile_mode": "reduce-overhead"}):
        assert main_job_small_ffn(args(**other), chunked) == "sparse", other
    assert main_job_small_ffn(args(), dataclasses.replace(chunked, permute=True)) == "sparse"
    assert parse_args(["--device", "cpu"]).options["small_ffn"] == "sparse"
    assert parse_args(["--device", "cpu", "--sparsity", '{"small_ffn": "dense"}']).options["small_ffn"] == "dense"


def test_untimed_steps_are_the_first_two_of_the_process_and_of_each_segment():
    from bench.train import untimed_steps
    from sparse_compile import PhaseSchedule

    assert untimed_steps(0, PhaseSchedule(240, 840)) == {0, 1, 240, 241, 840, 841}
    assert untimed_steps(500, PhaseSchedule(240, 840)) == {500, 501, 240, 241, 840, 841}  # resumed at 500
    assert untimed_steps(0, PhaseSchedule(0, None)) == {0, 1}
    assert untimed_steps(0, PhaseSchedule(10, 100, dense_every=4)) == {0, 1, 10, 11, 13, 100, 101}


def test_kept_mass_is_measured_at_the_chunk_a_site_fell_back_to(tmp_path):
    """The tiny model's hidden size (512) is not a multiple of M * 128: its sites run chunks of 32
    (passes/legality.fit_chunk, as the compile report says). The health probe measures the kept mass
    of that pattern, in the dense run too (a chunk of 128 fits no site: it logged nan)."""
    from bench.train import main

    args = ["--steps", "4", "--batch-size", "2", "--seq-len", "128", "--log-every", "1", "--eval-every", "4"]
    args += ["--eval-iters", "1", "--no-progress", "--data-dir", str(tmp_path / "data"), "--runs", "dense,sparse"]
    args += ["--sparsity", "chunked", "--warmup-frac", "0.25", "--final-dense-frac", "0", "--out", str(tmp_path / "r")]
    assert main(args) == 0
    rows = list(csv.DictReader(open(tmp_path / "r" / "log.csv")))
    assert [r["run"] for r in rows] == ["dense"] * 4 + ["sparse"] * 4
    report = next(r for r in reversed(sparse_compile.compile_reports()) if any(s.record.sparse for s in r.sites))
    assert {s.record.chunk for s in report.sites if s.record.sparse} == {32}
    kept = [float(r["h_kept_frac"]) for r in rows]
    assert all(0.25 <= k < 1 for k in kept), kept  # a quarter of the chunks, chosen by score: not nan, not all


@pytest.mark.parametrize("autocast_dtype", [None, torch.bfloat16])
def test_health_probe_gives_a_routed_site_its_input_in_the_ops_dtype(monkeypatch, autocast_dtype):
    """Under autocast an FFN's input reaches the routed op in autocast's dtype, so the health probe hands the
    router that dtype (the FFN sees the layer norm's float32 output), and float32 without autocast."""
    import contextlib

    from bench.train import Health
    from sparse_compile.ops import routes

    seen = []

    def kept_and_total(name, x, h):
        seen.append((name, x.dtype, x.shape, h.shape))
        return 1.0, 2.0

    monkeypatch.setattr(routes, "kept_and_total", kept_and_total)
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=32, n_layer=2, n_head=2, n_embd=32))
    if autocast_dtype is None:
        autocast = contextlib.nullcontext
    else:
        autocast = lambda: torch.autocast("cpu", dtype=autocast_dtype)  # noqa: E731
    health = Health(model, None, routed=True)
    health.probe(torch.randint(0, 256, (2, 32)), autocast)
    want = autocast_dtype or torch.float32
    assert [s[0] for s in seen] == ["blocks.0.mlp", "blocks.1.mlp"]
    assert all(dtype == want and xs == (64, 32) and hs == (64, 128) for _, dtype, xs, hs in seen), seen


def test_health_probe_counts_the_mass_score_units_keeps():
    """bench.train's kept mass under score_units: each token's chunks ranked on their first units, the mass
    of the chunks that choice keeps (score_units_loop) over the whole H, below the whole-H choice's."""
    import contextlib

    from bench.train import Health

    from .oracle import score_units_loop

    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=32, n_layer=2, n_head=2, n_embd=32))  # hidden 128: 1:4:8 in chunks of 16
    x = torch.randint(0, 256, (2, 32))
    hs = []
    hooks = [
        b.mlp.register_forward_hook(lambda m, i, o: hs.append(torch.relu(m.c_fc(i[0])).square())) for b in model.blocks
    ]
    with torch.no_grad():
        model(x)
    for h in hooks:
        h.remove()
    flat = [h.reshape(-1, 128).float() for h in hs]

    def kept_and_static(c, r):
        """The loop's mass share, and the share of kept (token, chunk) pairs whose chunk 90% of tokens keep."""
        keeps = [score_units_loop(f, 8, c, r) for f in flat]
        mass = sum((f * k).sum().item() for f, k in zip(flat, keeps, strict=True)) / sum(f.sum().item() for f in flat)
        chunks = [k.reshape(k.shape[0], -1, c)[..., 0] for k in keeps]  # [T, chunks]: kept or not
        static = sum((k & (k.sum(0) >= 0.9 * k.shape[0])).sum().item() for k in chunks)
        return mass, static / sum(k.sum().item() for k in chunks)

    some = Health(model, (1, 4, 8), chunk=16, units=2).probe(x, contextlib.nullcontext)
    every = Health(model, (1, 4, 8), chunk=16).probe(x, contextlib.nullcontext)
    mass, static = kept_and_static(16, 2)
    assert some["h_kept_frac"] == pytest.approx(mass, rel=1e-5)
    assert some["h_static_frac"] == pytest.approx(static)
    assert some["h_kept_frac"] < every["h_kept_frac"]
    # chunks of 32 do not fit 8 x 32 | 128: the sites run chunks of 16, ranked on 1 unit of 2 (fitted_units)
    fallback = Health(model, (1, 4, 8), chunk=32, units=2).probe(x, contextlib.nullcontext)
    assert fallback["h_kept_frac"] == pytest.approx(kept_and_static(16, 1)[0], rel=1e-5)
