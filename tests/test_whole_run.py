"""bench.whole_run: wall time from a log, iso-quality interpolation, the projection formula."""

import csv
import math

import pytest

from bench.whole_run import gap_that_pays, iso_quality, length_of, main, projected_speedup, read_run

FIELDS = ["run", "step", "segment", "phase", "lr", "loss", "val_loss", "tokens_per_s"]
REFITS = ["recluster_probe_s", "recluster_fit_s"]


def _log(path, runs, refits=None):
    """runs: name -> list of (step, phase, tokens_per_s, val_loss or ''); refits: per row (probe s, fit s),
    written as bench.train's recluster columns (None: a log without them)."""
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS + (REFITS if refits else []))
        w.writeheader()
        for name, rows in runs.items():
            for i, (step, phase, tps, val) in enumerate(rows):
                row = dict(run=name, step=step, segment="x", phase=phase, lr=0, loss=1, val_loss=val, tokens_per_s=tps)
                w.writerow(row | (dict(zip(REFITS, refits[i], strict=True)) if refits else {}))
    return str(path)


def test_read_run_sums_interval_times_and_counts_sparse_steps(tmp_path):
    rows = [(10, "dense", 1000, ""), (30, "sparse", 2000, ""), (40, "dense", 500, 2.5)]
    path = _log(tmp_path / "a.csv", {"sparse": rows})
    run = read_run(path, tokens_per_step=100)
    assert run.steps == 40 and run.final_val == 2.5
    assert run.wall_s == pytest.approx(10 * 100 / 1000 + 20 * 100 / 2000 + 10 * 100 / 500)
    assert run.sparse_frac == pytest.approx(0.5)
    with pytest.raises(ValueError, match="no final validation loss"):
        read_run(_log(tmp_path / "b.csv", {"dense": [(10, "dense", 1, "")]}))


def test_iso_quality_interpolates_between_bracketing_budgets():
    from bench.whole_run import Run

    budgets = [Run(100, 50.0, 2.2, 0.8), Run(120, 60.0, 1.9, 0.8), Run(140, 70.0, 1.7, 0.8)]
    iso = iso_quality(80.0, 100, 2.0, budgets)
    # 2.2 -> 1.9 crosses 2.0 at 2/3 of the way: wall 56.67, steps 113.3
    assert iso.bound == "=" and iso.speedup == pytest.approx(80.0 / (50 + 2 / 3 * 10))
    assert iso.steps_ratio == pytest.approx((100 + 2 / 3 * 20) / 100)
    none = iso_quality(80.0, 100, 1.5, budgets)
    assert none.speedup is None and none.gap == pytest.approx(1.7 / 1.5 - 1)
    bound = iso_quality(80.0, 100, 2.5, budgets)
    assert bound.bound == ">=" and bound.speedup == pytest.approx(80.0 / 50.0)
    # runs that shared a GPU: the larger budget took less wall time; the budgets still go by steps
    noisy = [Run(200, 55.0, 1.97, 0.8), Run(150, 60.0, 2.04, 0.8)]
    iso = iso_quality(80.0, 150, 2.0, noisy)
    assert iso.bound == "=" and iso.steps_ratio == pytest.approx((150 + 4 / 7 * 50) / 150)
    assert iso.speedup == pytest.approx(80.0 / (60.0 + 4 / 7 * (55.0 - 60.0)))
    assert iso.gap == pytest.approx(1.97 / 2.0 - 1)


def test_slope_is_the_loss_fall_per_percent_of_steps_around_the_target():
    """From 100 to 120 steps (20% more) the loss falls 2.2 -> 1.9, 0.3 / 2.0 = 15% of the target:
    0.75% per 1% more steps; unreached or already reached, the pair nearest the target."""
    from bench.whole_run import Run

    budgets = [Run(120, 60.0, 1.9, 0.8), Run(100, 50.0, 2.2, 0.8), Run(140, 70.0, 1.7, 0.8)]
    assert iso_quality(80.0, 100, 2.0, budgets).slope == pytest.approx(0.3 / 2.0 / 20)
    assert iso_quality(80.0, 100, 1.5, budgets).slope == pytest.approx(0.2 / 1.5 / (100 * (140 / 120 - 1)))
    assert iso_quality(80.0, 100, 2.5, budgets).slope == pytest.approx(0.3 / 2.5 / 20)
    assert iso_quality(80.0, 100, 2.5, budgets[:1]).slope is None
    # sigma: the same chords per unit of ln(steps)
    assert iso_quality(80.0, 100, 2.0, budgets).sigma == pytest.approx(0.3 / 2.0 / math.log(1.2))
    assert iso_quality(80.0, 100, 1.5, budgets).sigma == pytest.approx(0.2 / 1.5 / math.log(140 / 120))
    assert iso_quality(80.0, 100, 2.5, budgets).sigma == pytest.approx(0.3 / 2.5 / math.log(1.2))
    assert iso_quality(80.0, 100, 2.5, budgets[:1]).sigma is None
    with pytest.raises(ValueError, match="one run per budget"):
        iso_quality(80.0, 100, 2.0, [*budgets, Run(100, 51.0, 2.1, 0.8)])


def test_sparse_step_worth_reads_k_as_a_constant_worth_per_sparse_step():
    from bench.whole_run import sparse_step_worth

    for f, k in ((0.8, 1.173), (0.5, 1.05), (1.0, 1.25), (0.3, 0.98)):
        e = sparse_step_worth(f, k)
        assert k * (1 - f) + k * f * e == pytest.approx(1.0)  # k N steps with f sparse are worth N dense ones
    # fully sparse, the whole run gains s e: the bound of every schedule under the model
    e = sparse_step_worth(0.8, 1.173)
    gains = [projected_speedup(f, 1.475, 1 / (1 - f + f * e)) for f in (0.0, 0.25, 0.5, 0.8, 1.0)]
    assert gains == sorted(gains) and gains[-1] == pytest.approx(1.475 * e) and gains[0] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="f=0.0"):
        sparse_step_worth(0.0, 1.1)


def test_projection_formula():
    assert projected_speedup(0.25, 1.475) == pytest.approx(1.09, abs=0.005)
    assert projected_speedup(0.75, 1.475) == pytest.approx(1.32, abs=0.005)
    assert projected_speedup(0.75, 1.475, 1.1) == pytest.approx(1.32 / 1.1, abs=0.005)
    assert projected_speedup(0.0, 3.0) == 1.0
    with pytest.raises(ValueError, match="f=1.5"):
        projected_speedup(1.5, 1.4)


def test_gap_that_pays_inverts_the_length_model():
    # all sparse at s = 2 with sigma 0.5: k up to 2 pays, and (1 + g)^(1 / 0.5) = 2 at g = sqrt(2) - 1
    assert gap_that_pays(1.0, 2.0, 0.5) == pytest.approx(2**0.5 - 1)
    for f, s, sigma, target in ((0.8, 1.475, 0.15, 1.0), (0.8, 1.475, 0.15, 1.3), (0.5, 1.3, 0.3, 1.05)):
        g = gap_that_pays(f, s, sigma, target)
        k = (1 + g) ** (1 / sigma)  # the model's steps to the dense loss at that gap
        assert projected_speedup(f, s, k) == pytest.approx(target)
    # a flatter loss (smaller sigma) asks a smaller gap; more speedup asks less still
    assert gap_that_pays(0.8, 1.475, 0.075) < gap_that_pays(0.8, 1.475, 0.15) < gap_that_pays(0.8, 1.475, 0.3)
    assert gap_that_pays(0.8, 1.475, 0.15, 1.3) < gap_that_pays(0.8, 1.475, 0.15)
    assert gap_that_pays(0.8, 1.2, 0.15, 1.3) < 0  # 1.3x beyond s e for any e <= 1: only a negative gap
    with pytest.raises(ValueError, match="sigma=0"):
        gap_that_pays(0.8, 1.475, 0.0)
    with pytest.raises(ValueError, match=r"f=1.5 \(0..1\)"):
        gap_that_pays(1.5, 1.475, 0.15)
    with pytest.raises(ValueError, match=r"speedup=0 \(> 0\)"):
        gap_that_pays(0.8, 1.475, 0.15, 0)


def test_main_prints_one_row_per_recipe(tmp_path, capsys):
    d = _log(tmp_path / "d.csv", {"dense": [(50, "dense", 1000, ""), (100, "dense", 1000, 2.0)]})
    s1 = [(10, "dense", 1000, ""), (90, "sparse", 2000, ""), (100, "dense", 1000, 2.1)]
    s1 = _log(tmp_path / "s1.csv", {"sparse": s1})
    s2 = [(12, "dense", 1000, ""), (108, "sparse", 2000, ""), (120, "dense", 1000, 1.95)]
    s2 = _log(tmp_path / "s2.csv", {"sparse": s2})
    rows = main(["--dense", d, "--recipe", f"r={s1},{s2}", "--step-speedup", "1.3b=1.5", "--tokens-per-step", "1000"])
    assert [r["recipe"] for r in rows] == ["r"]
    assert rows[0]["sparse steps"] == "80%"
    assert rows[0]["iso-quality speedup (wall time: runs alone only)"].startswith("=")
    assert "projection 1.3b (s=1.5)" in rows[0]
    # 2.1 -> 1.95 crosses 2.0 at 2/3 of the way from 100 to 120 steps
    assert rows[0]["steps to the target (k)"] == f"={(100 + 2 / 3 * 20) / 100:.3f}"
    assert rows[0]["loss fall per 1% more steps"] == f"{0.15 / 2.0 / 20:.2%}"
    assert rows[0]["gap at equal steps (g)"] == "+5.00%"  # the 100-step budget, 2.1 against 2.0
    sigma = 0.15 / 2.0 / math.log(1.2)  # the chord's: 1 / (0.2 + 0.8 / 1.5) = 1.364 steps pay, 1.049 give 1.3x
    paying = f"{(1 / (0.2 + 0.8 / 1.5)) ** sigma - 1:+.2%}, {(1 / (1.3 * (0.2 + 0.8 / 1.5))) ** sigma - 1:+.2%}"
    assert rows[0]["g that pays / gives 1.3x, 1.3b (model)"] == paying
    # 1.133 x 100 steps, 80% sparse, reach what 100 dense steps reach: 20 + 80 e = 100 / 1.133
    assert rows[0]["a sparse step's worth (e)"] == f"={(100 / (100 + 2 / 3 * 20) - 0.2) / 0.8:.3f}"
    assert "target: dense final val 2.0000" in capsys.readouterr().out
    never = main(["--dense", d, "--recipe", f"r={s1}", "--step-speedup", "1.3b=1.5", "--tokens-per-step", "1000"])
    assert never[0]["steps to the target (k)"] == ">1.000"
    assert never[0]["a sparse step's worth (e)"] == "<1.000"  # k > 1: a sparse step worth less than a dense one
    # reached at the smallest budget (120 steps, 1.95 < 2.0): k at most 1.2, e at least its reading
    (early,) = main(["--dense", d, "--recipe", f"r={s2}", "--step-speedup", "1.3b=1.5", "--tokens-per-step", "1000"])
    assert early["gap at equal steps (g)"] == "-"  # no budget of the dense run's 100 steps
    assert early["g that pays / gives 1.3x, 1.3b (model)"] == "-"  # one budget: no slope
    s3 = [(12, "dense", 1000, ""), (108, "sparse", 2000, ""), (120, "dense", 1000, 2.2)]  # ends worse with more steps
    s3 = _log(tmp_path / "s3.csv", {"sparse": s3})
    args = ["--step-speedup", "1.3b=1.5", "--tokens-per-step", "1000"]
    (rising,) = main(["--dense", d, "--recipe", f"r={s1},{s3}", *args])
    assert rising["g that pays / gives 1.3x, 1.3b (model)"] == "-"  # the loss did not fall along the chord
    assert early["steps to the target (k)"] == "<=1.200"
    assert early["a sparse step's worth (e)"] == f">={(1 / 1.2 - 0.2) / 0.8:.3f}"
    assert never[0]["projection 1.3b (s=1.5)"] == f"<{projected_speedup(0.8, 1.5, 1.0):.2f}x"  # k > 1: below k = 1's
    # not reached: more steps than the largest budget's, so at most dense wall / that budget's wall
    dense_wall, s1_wall = 100 * 1000 / 1000, 10 * 1000 / 1000 + 80 * 1000 / 2000 + 10 * 1000 / 1000
    assert never[0]["iso-quality speedup (wall time: runs alone only)"] == f"not reached (<{dense_wall / s1_wall:.3f}x)"
    assert never[0]["the same with compiles"] == f"{dense_wall / s1_wall:.3f}x"  # no summaries: the same walls
    assert never[0]["refits, share of wall"] == "-"  # no recluster columns: no refits
    assert never[0]["tokens per parameter"] == "-"  # no summary: no parameter count
    # the refits' share of the largest budget's logged wall (120 steps: 12 + 48 + 12 s), read from its columns
    s3 = [(12, "dense", 1000, ""), (108, "sparse", 2000, ""), (120, "dense", 1000, 1.95)]
    s3 = _log(tmp_path / "s3.csv", {"sparse": s3}, refits=[(0, 0), (1.5, 4.5), ("", "")])
    (fits,) = main(["--dense", d, "--recipe", f"r={s1},{s3}", "--tokens-per-step", "1000"])
    assert fits["refits, share of wall"] == f"{6 / (12 + 48 + 12):.1%}"
    with pytest.raises(SystemExit, match="'r' is given twice"):
        main(["--dense", d, "--recipe", f"r={s1}", f"r={s2}"])
    # a flag given again adds to its list (argparse's default would keep only the last one's recipes)
    both = main(["--dense", d, "--recipe", f"a={s1}", "--recipe", f"b={s2}", "--step-speedup", "1.3b=1.5",
                 "--step-speedup", "2.7b=1.6", "--tokens-per-step", "1000"])  # fmt: skip
    assert [r["recipe"] for r in both] == ["a", "b"]
    assert "projection 1.3b (s=1.5)" in both[1] and "projection 2.7b (s=1.6)" in both[1]
    with pytest.raises(SystemExit, match="'r' is given twice"):
        main(["--dense", d, "--recipe", f"r={s1}", "--recipe", f"r={s2}"])


def _summary(folder, schedule: str, steps: int = 2400) -> None:
    folder.mkdir()
    head = f"model 125m-d1024 (126.2M params), {steps} steps x 16x1024 tokens; peak lr 0.0005\n"
    (folder / "summary.txt").write_text(f"{head}sparse: SparsityConfig(...); schedule: {schedule}, dense after\n")


def test_sparse_steps_come_from_the_schedule_where_the_summary_has_it(tmp_path):
    """Logged every 75 steps, a 10% / 80% / 10% run of 2400 steps has its phase boundaries (240, 2160)
    inside logged intervals, so counted by logged interval it reads 81% sparse here; its summary's
    schedule gives 80%."""
    rows = [(s, "sparse" if 240 < s <= 2175 else "dense", 1000, 1.0 if s == 2400 else "") for s in range(75, 2401, 75)]
    folder = tmp_path / "run"
    _summary(folder, "dense steps [0, 240), sparse [240, 2160)")
    log = _log(folder / "log.csv", {"sparse": rows})
    assert read_run(log).sparse_frac == pytest.approx(0.8)
    assert read_run(_log(tmp_path / "bare.csv", {"sparse": rows})).sparse_frac == pytest.approx(1950 / 2400)
    every = tmp_path / "every"  # one step in 2 of the window dense: 960 of its 1920 steps sparse
    _summary(every, "dense steps [0, 240), sparse [240, 2160) with one step in 2 dense")
    assert read_run(_log(every / "log.csv", {"sparse": rows})).sparse_frac == pytest.approx(0.4)
    stale = tmp_path / "stale"  # a summary left from a run of another length
    _summary(stale, "dense steps [0, 290), sparse [290, 2610)", steps=2900)
    with pytest.raises(ValueError, match="a run of 2900 steps, its log 2400"):
        read_run(_log(stale / "log.csv", {"sparse": rows}))


def test_paired_compares_each_recipe_with_its_own_dense_run(tmp_path, capsys):
    """--paired: seed 1's dense run ends lower (1.9), so its recipe must reach 1.9, not the mean 1.95."""
    d0 = _log(tmp_path / "d0.csv", {"dense": [(100, "dense", 1000, 2.0)]})
    d1 = _log(tmp_path / "d1.csv", {"dense": [(100, "dense", 1000, 1.9)]})
    budgets = []
    for name, rows in {
        "a": [(10, "dense", 1000, ""), (100, "sparse", 2000, 2.1)],
        "b": [(10, "dense", 1000, ""), (120, "sparse", 2000, 1.96)],
        "c": [(10, "dense", 1000, ""), (140, "sparse", 2000, 1.86)],
    }.items():
        budgets.append(_log(tmp_path / f"{name}.csv", {"sparse": rows}))
    recipe = ",".join(budgets)
    args = ["--dense", d0, d1, "--recipe", f"s0={recipe}", f"s1={recipe}", "--tokens-per-step", "1000"]
    rows = main([*args, "--paired"])
    # s0: 2.1 -> 1.96 crosses 2.0 at 5/7 of 100..120; s1: 1.96 -> 1.86 crosses 1.9 at 3/5 of 120..140
    assert [r["steps to the target (k)"] for r in rows] == [f"={(100 + 5 / 7 * 20) / 100:.3f}", f"={1.32:.3f}"]
    assert rows[1]["target"].startswith("1.9000")
    mean = main(args)  # the mean target 1.95: both cross at 1/10 of 120..140
    assert [r["steps to the target (k)"] for r in mean] == ["=1.220", "=1.220"]
    with pytest.raises(SystemExit, match="1 recipe"):
        main(["--dense", d0, d1, "--recipe", f"s0={recipe}", "--paired"])


def test_wall_time_is_the_summarys_steady_state_with_the_compiles_beside_it(tmp_path, capsys):
    """A summary's "tokens/s, whole run" leaves out the compiling steps; the logged intervals hold them:
    here the dense run's first interval compiled (500 tokens/s, not 1000), the sparse one's switch too."""
    dense = tmp_path / "dense"
    dense.mkdir()
    (dense / "summary.txt").write_text(
        "model x (1M params), 100 steps x 10x100 tokens\n\n|     | dense   |\n|-----|---------|\n"
        "| final val loss | 2.0000 |\n| tokens/s, whole run | 1,000 |\n"
    )
    d = _log(dense / "log.csv", {"dense": [(50, "dense", 500, ""), (100, "dense", 1000, 2.0)]})
    sparse = tmp_path / "sparse"
    sparse.mkdir()
    (sparse / "summary.txt").write_text(
        "model x (1M params), 100 steps x 10x100 tokens\nsparse: SparsityConfig(...); schedule: dense steps [0, 10), "
        "sparse [10, 90), dense after\n\n|   | sparse |\n|---|---|\n| tokens/s, whole run | 1,600 |\n"
    )
    rows = [(10, "dense", 1000, ""), (90, "sparse", 1000, ""), (100, "dense", 1000, 2.1)]
    s = _log(sparse / "log.csv", {"sparse": rows})
    run = read_run(d, tokens_per_step=1000)
    assert run.wall_s == pytest.approx(100 * 1000 / 1000) and run.wall_with_compiles_s == pytest.approx(50 * 2 + 50)
    sparse_run = read_run(s, tokens_per_step=1000)
    assert sparse_run.wall_s == pytest.approx(100 * 1000 / 1600)
    assert sparse_run.wall_with_compiles_s == pytest.approx(100)
    row = main(["--dense", d, "--recipe", f"r={s}", "--tokens-per-step", "1000"])[0]
    assert row["wall vs dense, same steps"] == f"{100 / 62.5:.3f}x"
    assert row["the same with compiles"] == f"{150 / 100:.3f}x"
    # the dense run's length: 100 steps x 10x100 tokens over the summary's 1M parameters, all from its header
    assert row["tokens per parameter"] == "0.1"
    head = "model 1.3b (1209.1M params), 3200 steps x 16x1024 tokens"
    assert length_of(f"{head}; peak lr 0.00015\n") == (1209.1e6, 16 * 1024)
    assert length_of(f"{head} per rank x 2 ranks (ddp); peak lr 0.00015\n") == (1209.1e6, 2 * 16 * 1024)
    assert length_of("") == (None, None)
    # --tokens-per-step sets the walls; the length comes from the summary whatever the flag says
    other = main(["--dense", d, "--recipe", f"r={s}", "--tokens-per-step", "2000"])[0]
    assert other["tokens per parameter"] == "0.1"
    with pytest.raises(ValueError, match="no rows of run 'sparse'"):
        read_run(d, "sparse")
    # a run without a summary: every ratio takes the walls with compiles, and says so
    bare = _log(tmp_path / "bare.csv", {"sparse": rows})
    row = main(["--dense", d, "--recipe", f"r={bare}", "--tokens-per-step", "1000"])[0]
    assert row["wall vs dense, same steps"] == f"{150 / 100:.3f}x"
    assert "wall times with compiles" in capsys.readouterr().out
    # a summary of another run length beside a log (left from another run) is refused, dense or sparse
    (dense / "summary.txt").write_text((dense / "summary.txt").read_text().replace("100 steps", "200 steps"))
    with pytest.raises(ValueError, match="a run of 200 steps, its log 100"):
        read_run(d)
    (sparse / "summary.txt").write_text((sparse / "summary.txt").read_text().replace("1,600", "nan"))
    assert not read_run(s).steady  # no finite rate: the logged intervals' sum


def test_a_budget_from_another_sweep_is_taken_against_its_own_dense_run(tmp_path, capsys):
    """The 120-step budget ran beside its own dense run, which ended 5% lower (1.9) and ran at half the
    speed (200 s against the target's 100 s): its 1.881 is 1% below that run, so 1% below the target's
    2.0 (1.98), and its 132 s are 66 s beside the target's dense run. The 100-step budget (2.1, +5%)
    and it bracket the target at 5/6 of the way."""
    d = _log(tmp_path / "d.csv", {"dense": [(100, "dense", 1000, 2.0)]})  # 100 s
    d2 = _log(tmp_path / "d2.csv", {"dense": [(100, "dense", 500, 1.9)]})  # 200 s
    b1 = _log(tmp_path / "b1.csv", {"sparse": [(10, "dense", 1000, ""), (100, "sparse", 2000, 2.1)]})  # 55 s
    b2 = _log(tmp_path / "b2.csv", {"sparse": [(12, "dense", 500, ""), (120, "sparse", 1000, 1.881)]})  # 132 s
    (row,) = main(["--dense", d, "--recipe", f"r={b1},{b2}@{d2}", "--tokens-per-step", "1000"])
    assert row["steps to the target (k)"] == f"={(100 + 5 / 6 * 20) / 100:.3f}"
    wall = 55 + 5 / 6 * (132 * 100 / 200 - 55)
    assert row["iso-quality speedup (wall time: runs alone only)"] == f"={100 / wall:.3f}x"
    assert row["largest budget vs dense"] == "-1.00%"
    assert f"r: {b2} against {d2} (gap -1.00%), put onto the --dense runs' loss" in capsys.readouterr().out
    # without its own dense run the budget is 6% below the target and the crossing moves
    (plain,) = main(["--dense", d, "--recipe", f"r={b1},{b2}", "--tokens-per-step", "1000"])
    assert plain["steps to the target (k)"] == f"={(100 + 0.1 / 0.219 * 20) / 100:.3f}"
    short = _log(tmp_path / "short.csv", {"dense": [(90, "dense", 1000, 1.9)]})
    with pytest.raises(SystemExit, match="ran 90 steps, the target's dense 100"):
        main(["--dense", d, "--recipe", f"r={b1},{b2}@{short}", "--tokens-per-step", "1000"])


def test_walls_on_different_devices_are_not_compared(tmp_path, capsys):
    """A budget whose summary names another device than its dense run's gets no wall ratio or iso-quality
    speedup (an H200 run against an H100 one is no speedup); k and the projection, from losses and steps
    alone, stay. A budget beside its own dense run on its own device is compared with that run."""

    def run(name, device, tps, val, run="sparse"):
        folder = tmp_path / name
        folder.mkdir()
        schedule = (
            "" if run == "dense" else "\nsparse: SparsityConfig(...); schedule: dense steps [0, 10), sparse [10, 90)"
        )
        (folder / "summary.txt").write_text(
            f"model x (1M params), 100 steps x 10x100 tokens{schedule}\ndevice: {device}\n\n| | {run} |\n|---|---|\n"
            f"| tokens/s, whole run | {tps} |\n"
        )
        rows = [(100, "dense", tps, val)] if run == "dense" else [(10, "dense", tps, ""), (100, "sparse", tps, val)]
        return _log(folder / "log.csv", {run: rows})

    d = run("d", "GPU A", 1000, 2.0, "dense")
    here, there = run("here", "GPU A", 1250, 2.1), run("there", "GPU B", 2000, 2.1)
    rows = main(
        ["--dense", d, "--recipe", f"a={here}", f"b={there}", "--step-speedup", "x=1.5", "--tokens-per-step", "1000"]
    )
    a, b = rows
    assert a["wall vs dense, same steps"] == "1.250x" and a["iso-quality speedup (wall time: runs alone only)"] != "-"
    for key in (
        "wall vs dense, same steps",
        "the same with compiles",
        "iso-quality speedup (wall time: runs alone only)",
    ):
        assert b[key] == "- (devices differ)", key
    assert b["largest budget vs dense"] == a["largest budget vs dense"] == "+5.00%"
    assert b["projection x (s=1.5)"] == a["projection x (s=1.5)"]
    assert f"b: {there} ran on GPU B against GPU A: its wall time is not compared" in capsys.readouterr().out
    # beside its own dense run on GPU B: compared with that one, put onto the --dense run
    own = run("own", "GPU B", 2000, 2.0, "dense")
    (c,) = main(["--dense", d, "--recipe", f"c={there}@{own}", "--tokens-per-step", "1000"])
    assert c["wall vs dense, same steps"] == "1.000x"


def test_target_dense_holds_a_recipe_to_the_lowest_dense_loss(tmp_path, capsys):
    """A dense run at another lr ended 1.9, below the --dense run's 2.0: the target moves to 1.9 and the
    crossing from 2.1 > 2.0 > 1.95 to 1.95 > 1.9 > 1.8 (1/3 of the way from 120 to 140 steps); the wall
    times stay the --dense run's. A dense run that ended higher (2.05) leaves the target at 2.0."""
    d = _log(tmp_path / "d.csv", {"dense": [(100, "dense", 1000, 2.0)]})  # 100 s
    best = _log(tmp_path / "best.csv", {"dense": [(100, "dense", 500, 1.9)]})
    worse = _log(tmp_path / "worse.csv", {"dense": [(100, "dense", 1000, 2.05)]})
    s1 = _log(tmp_path / "s1.csv", {"sparse": [(10, "dense", 1000, ""), (100, "sparse", 2000, 2.1)]})  # 55 s
    s2 = _log(tmp_path / "s2.csv", {"sparse": [(12, "dense", 1000, ""), (120, "sparse", 2000, 1.95)]})  # 66 s
    s3 = _log(tmp_path / "s3.csv", {"sparse": [(14, "dense", 1000, ""), (140, "sparse", 2000, 1.8)]})  # 77 s
    args = ["--dense", d, "--recipe", f"r={s1},{s2},{s3}", "--tokens-per-step", "1000"]
    (own,) = main(args)
    assert own["steps to the target (k)"] == f"={(100 + 2 / 3 * 20) / 100:.3f}"
    capsys.readouterr()
    (held,) = main([*args, "--target-dense", worse, best])
    assert held["steps to the target (k)"] == f"={(120 + 1 / 3 * 20) / 100:.3f}"
    assert held["iso-quality speedup (wall time: runs alone only)"] == f"={100 / (66 + 1 / 3 * 11):.3f}x"
    assert held["wall vs dense, same steps"] == f"{100 / 55:.3f}x"  # the --dense run's wall, not best's 200 s
    assert held["largest budget vs dense"] == f"{1.8 / 1.9 - 1:+.2%}"
    out = capsys.readouterr().out
    assert f"target: dense final val 1.9000 ({best}: the lowest dense loss; --dense's mean of 1 2.0000)" in out
    (same,) = main([*args, "--target-dense", worse])
    assert same == own
    # a budget beside its own dense run is put onto the --dense run's loss (1% under 2.0), then held to 1.9
    d2 = _log(tmp_path / "d2.csv", {"dense": [(100, "dense", 1000, 1.9)]})
    b = _log(tmp_path / "b.csv", {"sparse": [(12, "dense", 1000, ""), (120, "sparse", 2000, 1.881)]})
    (rebased,) = main(
        ["--dense", d, "--recipe", f"r={s1},{b}@{d2}", "--tokens-per-step", "1000", "--target-dense", best]
    )
    assert rebased["largest budget vs dense"] == f"{1.98 / 1.9 - 1:+.2%}"
    assert f"r: {b} against {d2} (gap -1.00%), put onto the --dense runs' loss" in capsys.readouterr().out
    short = _log(tmp_path / "short.csv", {"dense": [(90, "dense", 1000, 1.8)]})
    with pytest.raises(SystemExit, match=r"--target-dense .*short.csv: ran 90 steps, the --dense runs 100"):
        main([*args, "--target-dense", short])
    with pytest.raises(SystemExit, match="not with --paired"):
        main([*args, "--paired", "--target-dense", best])
    # a dense run of another model is no target (the summaries beside the logs name the models)
    logs = {}
    for name in ("d", "best"):
        (tmp_path / name).mkdir()
        logs[name] = str((tmp_path / f"{name}.csv").rename(tmp_path / name / "log.csv"))
    for model, fits in (("125m", True), ("350m", False)):
        (tmp_path / "d" / "summary.txt").write_text("model 125m (1M params), 100 steps x 10x100 tokens\n")
        (tmp_path / "best" / "summary.txt").write_text(f"model {model} (1M params), 100 steps x 10x100 tokens\n")
        run = ["--dense", logs["d"], "--recipe", f"r={s1},{s2},{s3}", "--target-dense", logs["best"]]
        if fits:
            assert (
                main([*run, "--tokens-per-step", "1000"])[0]["steps to the target (k)"]
                == held["steps to the target (k)"]
            )
        else:
            with pytest.raises(SystemExit, match=r"model 350m, the --dense runs' 125m: not the same"):
                main([*run, "--tokens-per-step", "1000"])


def test_dense_finals_from_a_seeds_csv_give_the_same_k_without_walls(tmp_path, capsys):
    """--dense-csv: the dense runs known by their finals alone (a bench.seeds CSV, the logs not kept). Against
    the same finals the recipe's k, e, g, slope and projection are those that the logs give; every wall time
    cell is "-", a recipe that never reaches the target is "not reached" without a bound, and --paired
    names each row's target by the CSV's row."""
    from bench import seeds

    d0 = _log(tmp_path / "d0.csv", {"dense": [(100, "dense", 1000, 2.0)]})
    d1 = _log(tmp_path / "d1.csv", {"dense": [(100, "dense", 1000, 1.9)]})
    rows = [
        seeds.SeedRun("y/dense_s0 / y/arm_s0", 2.0, 2.1, 0.5),
        seeds.SeedRun("y/dense_s1 / y/arm_s1", 1.9, 2.0, 0.5),
    ]
    finals = tmp_path / "finals.csv"
    seeds.write(finals, rows)
    s1 = _log(
        tmp_path / "s1.csv", {"sparse": [(10, "dense", 1000, ""), (90, "sparse", 2000, ""), (100, "dense", 1, 2.1)]}
    )
    s2 = _log(
        tmp_path / "s2.csv", {"sparse": [(12, "dense", 1000, ""), (108, "sparse", 2000, ""), (120, "dense", 1, 1.85)]}
    )
    common = ["--recipe", f"a={s1},{s2}", f"b={s1},{s2}", "--step-speedup", "1.3b=1.5", "--tokens-per-step", "1000"]
    logs = main(["--dense", d0, d1, "--paired", *common])
    capsys.readouterr()
    got = main(["--dense-csv", str(finals), "--dense-steps", "100", "--paired", *common])
    assert "dense finals from" in capsys.readouterr().out
    same = ["steps to the target (k)", "a sparse step's worth (e)", "gap at equal steps (g)",
            "largest budget vs dense", "loss fall per 1% more steps", "projection 1.3b (s=1.5)",
            "g that pays / gives 1.3x, 1.3b (model)"]  # fmt: skip
    for a, b in zip(logs, got, strict=True):
        assert {k: a[k] for k in same} == {k: b[k] for k in same}
        assert a["wall vs dense, same steps"].endswith("x") and b["wall vs dense, same steps"] == "-"
        assert a["iso-quality speedup (wall time: runs alone only)"].startswith("=")
        assert b["iso-quality speedup (wall time: runs alone only)"] == "-"
    assert [r["steps to the target (k)"] for r in got] == [f"={(100 + 0.1 / 0.25 * 20) / 100:.3f}", "=1.160"]
    assert got[1]["target"] == "1.9000 (y/dense_s1 / y/arm_s1)"
    (mean,) = main(
        ["--dense-csv", str(finals), "--dense-steps", "100", "--recipe", f"r={s1}", "--tokens-per-step", "1000"]
    )
    assert mean["iso-quality speedup (wall time: runs alone only)"] == "not reached"  # 2.1 above the mean 1.95
    assert "target: dense final val 1.9500 (mean of 2)\n" in capsys.readouterr().out  # no dense wall to print
    for argv, message in (
        (["--dense", d0, "--dense-csv", str(finals), "--dense-steps", "100"], "give the dense runs once"),
        ([], "give the dense runs once"),
        (["--dense-csv", str(finals)], "--dense-csv needs --dense-steps"),
        (["--dense-csv", str(finals), "--dense-steps", "0"], "got 0"),
        (["--dense", d0, "--dense-steps", "100"], "--dense-steps: only with --dense-csv"),
        (["--dense-csv", str(tmp_path / "none.csv"), "--dense-steps", "100"], "none.csv"),
        (["--dense-csv", d0, "--dense-steps", "100"], "not a bench.seeds CSV"),
    ):
        with pytest.raises(SystemExit, match=message):
            main([*argv, "--recipe", f"r={s1}"])


def test_dense_csv_checks_its_finals_and_pairs_by_seed(tmp_path, capsys):
    """--dense-csv refuses a dense final that is no loss (nan, 0), keeps a budget beside its own dense run
    (the same k as with the target as a log, no wall), pairs only runs of one seed where the names say
    it, and takes tokens per parameter from a budget's summary."""
    from bench import seeds

    def finals(name, *values):  # per-seed rows as bench.seeds writes them (no summary row: read skips it)
        path = tmp_path / name
        with open(path, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["seed", "dense", "sparse", "diff", "kept", "lead"])
            w.writerows([f"d/dense_s{i} / d/arm_s{i}", v, 2.0, 0.0, 0.5, ""] for i, v in enumerate(values))
        assert len(seeds.read(path)) == len(values)
        return str(path)

    b1 = _log(tmp_path / "b1.csv", {"sparse": [(10, "dense", 1000, ""), (100, "sparse", 2000, 2.1)]})
    b2 = _log(tmp_path / "b2.csv", {"sparse": [(12, "dense", 500, ""), (120, "sparse", 1000, 1.881)]})
    own = _log(tmp_path / "own.csv", {"dense": [(100, "dense", 500, 1.9)]})
    d = _log(tmp_path / "d.csv", {"dense": [(100, "dense", 1000, 2.0)]})
    for bad in (math.nan, 0.0):
        with pytest.raises(SystemExit, match="not a finite loss > 0: d/dense_s1 / d/arm_s1"):
            main(["--dense-csv", finals("bad.csv", 2.0, bad), "--dense-steps", "100", "--recipe", f"r={b1}"])
    recipe = ["--recipe", f"r={b1},{b2}@{own}", "--tokens-per-step", "1000"]
    (log_row,) = main(["--dense", d, *recipe])
    (csv_row,) = main(["--dense-csv", finals("one.csv", 2.0), "--dense-steps", "100", *recipe])
    assert (
        csv_row["steps to the target (k)"] == log_row["steps to the target (k)"] == f"={(100 + 5 / 6 * 20) / 100:.3f}"
    )
    assert csv_row["iso-quality speedup (wall time: runs alone only)"] == "-"
    assert f"r: {b2} against {own} (gap -1.00%)" in capsys.readouterr().out
    # --paired: the recipe's folder says seed 1, the CSV's first row seed 0
    arm = tmp_path / "arm_s1"
    _summary(arm, "dense steps [0, 10), sparse [10, 90)", steps=100)
    s1 = _log(arm / "log.csv", {"sparse": [(10, "dense", 1000, ""), (90, "sparse", 2000, ""), (100, "dense", 1, 2.1)]})
    two = finals("two.csv", 2.0, 1.9)
    with pytest.raises(SystemExit, match=r"recipe r .* is seed 1, its dense run 'd/dense_s0 / d/arm_s0' seed 0"):
        main(["--paired", "--dense-csv", two, "--dense-steps", "100", "--recipe", f"r={s1}", f"q={s1}"])
    rows = main(["--paired", "--dense-csv", two, "--dense-steps", "100", "--recipe", f"a={b1}", f"r={s1}"])
    # 126.2M parameters, 16 x 1024 tokens a step (the budget's summary), over the dense run's 100 steps
    assert rows[1]["tokens per parameter"] == f"{100 * 16 * 1024 / 126.2e6:.3g}"
    assert rows[0]["tokens per parameter"] == "-"  # a budget without a summary: unknown
