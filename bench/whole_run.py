"""python -m bench.whole_run: what a sparse recipe buys over a whole run, at the dense run's quality.

From bench.train log.csv files (a dense run, and a sparse recipe at one or more step budgets with
its schedule stretched to each: the same warm-up, sparse and tail fractions):
- wall time of each run, steady state: its steps x tokens per step / its summary.txt's "tokens/s,
  whole run" (bench.train's timed steps: the compiling first steps of each process and of each phase
  switch left out, a cost per process and per switch, not per step; a resumed run compiles again).
  Beside it, with those compiles: the sum over the logged intervals of (steps in the interval) x
  (tokens per step) / tokens_per_s. Where a run has no summary, every run's wall time is that sum;
- target: the dense runs' mean final validation loss; with --paired, each recipe's own dense run's
  (the i-th --recipe against the i-th --dense run or --dense-csv row: one seed each, the same seed where
  both names end in one, `_sN`). --target-dense names other dense runs
  of the same model and steps (another peak lr or lr schedule): the target is then the lowest of their
  final losses where it is below the --dense runs' mean, so that a recipe is held to the best dense
  run measured, not only to the one of its own lr (a high lr can hurt the dense run more than the
  sparse one); the wall times stay the --dense runs';
- iso-quality speedup = dense wall time / the recipe's wall time to reach the target: the budget
  at which the recipe's final loss equals the target, linear (in steps and in wall time) between
  the two budgets, in steps, that bracket it. Wall times are a speed figure only for runs that had
  the GPU alone (bench.sweep --parallel 1, or one run per GPU); k, the steps ratio, holds either way.
  Runs whose summaries name different devices (a budget and its dense run) get no wall ratio, "-";
  A recipe whose every budget ends above the target has none ("not reached", with the gap of its
  largest budget and, as an upper bound, the dense wall time over that budget's);
  one whose smallest budget already ends below it gets that budget's ratio as a lower bound (">=");
- projection to larger models (labelled as one): with a fraction f of the steps sparse, a sparse
  step s times as fast as a dense one (bench.e2e at that size) and k = the recipe's steps to the
  target over the dense run's steps, the whole run is 1 / (k (1 - f + f / s)) times as fast.
  It assumes k, measured at the runs' own size and length, carries over to the size projected to.
  At one size k grows with the run's length (bench/RESULTS.md 6c), so a projection from runs far
  shorter than the run projected to overstates it: "tokens per parameter" gives the dense run's
  length (its steps x tokens per step over the model's parameters, both from its summary's header;
  "-" without a summary);
- --dense-csv instead of --dense: the dense runs' final losses alone, from a bench.seeds CSV (bench.sweep's
  --dense-csv), where their logs were not kept; --dense-steps gives their steps (nothing can check it). k,
  e, slope, g and the projections, which need only losses and steps, are computed as above; no wall time
  is compared ("-"); tokens per parameter from the budgets' summaries (one model);
- a budget from another sweep (run elsewhere or later) names its own dense run of the same seed
  and steps, `log.csv@dense_log.csv`: its final loss is taken at its gap from that run's, and its wall
  times at their ratio to that run's, both put onto the --dense runs' (their loss and walls scaled), then
  compared with the target;
- a sparse step's worth e = (1 / k - (1 - f)) / f: k read as if every sparse step were worth e dense
  steps (bench.whole_run.sparse_step_worth; a model, not a measurement). With e fixed, a whole run gains
  at most max(1, s e) for any f (at f = 1 where s e > 1): e is the quality per sparse step;
- refits: the share of the largest budget's logged wall time (compiles included) spent refitting
  (log.csv's recluster_probe_s + recluster_fit_s: the probe forward and recluster(), routed or permuted
  sites). It is inside the wall times and the iso-quality speedup, outside the projection (k and s
  alone), and depends on the model's size; "-" where no refit ran;
- slope: how much lower the final loss ends per 1% more steps, between the two budgets that
  bracket the target (else the two nearest it), relative to the target. k - 1 is about the gap at
  equal steps over it: a run nearer convergence (a flatter loss) pays more steps for the same gap.
  g, the gap at equal steps: the final loss of the budget run for the dense run's steps, relative to
  the target ("-" without such a budget; with --target-dense, against that other run's loss, not the
  same-schedule gap). With sigma the same chord's fall per unit of ln(steps) (about 100 x the slope
  for budgets close together), k is about (1 + g)^(1 / sigma) (docs/design.md). Per projected size,
  that model's largest g at which the recipe still pays (1x) and at which it gives 1.3x, at this
  sigma (bench.whole_run.gap_that_pays): a longer run has a flatter loss, a smaller sigma, and asks
  a smaller g; "-" without a chord, or where the loss did not fall along it.

    python -m bench.whole_run --dense runs/d0/log.csv runs/d1/log.csv \\
        --recipe default=runs/s2400/log.csv,runs/s2800/log.csv --step-speedup 1.3b=1.472 2.7b=1.555
    # the 3200-step budget from another sweep, beside that sweep's own dense run
    python -m bench.whole_run --paired --dense runs/a/dense_s0/log.csv \\
        --recipe s0=runs/a/chunked_s0/log.csv,runs/b/chunked-steps-3200_s0/log.csv@runs/b/dense_s0/log.csv
    # against dense finals whose logs are gone: a bench.seeds CSV's per-seed rows, runs of 3200 steps
    python -m bench.whole_run --paired --dense-csv dense.csv --dense-steps 3200 \\
        --recipe s0=runs/m/arm_s0/log.csv,runs/m/arm-steps-3520_s0/log.csv --step-speedup 1.3b=1.472
"""

import argparse
import csv
import dataclasses
import math
import re
from dataclasses import dataclass
from pathlib import Path

from tabulate import tabulate

from bench.seeds import device_in, seeds_differ
from bench.seeds import read as read_seeds
from sparse_compile import PhaseSchedule


@dataclass(frozen=True)
class Run:
    steps: int
    wall_s: float  # steady state (module docstring); the interval sum where a run of the call has no summary
    final_val: float
    sparse_frac: float  # fraction of the steps that ran sparse
    wall_with_compiles_s: float | None = None  # the logged intervals' sum, compiles included
    steady: bool = False  # wall_s from the summary's timed tokens/s
    device: str | None = None  # the summary's "device:" line (None: no summary or no such line)
    model: str | None = None  # the summary's model name (None: no summary)
    refit_frac: float = 0.0  # share of the logged wall time (compiles included) in the probe forward and recluster()
    params: float | None = None  # the model's parameters, from the summary's header (None: no summary)
    step_tokens: int | None = None  # tokens per step (all ranks), from the summary's header (None: no summary)


def read_run(path: str | Path, run: str | None = None, tokens_per_step: int = 16384) -> Run:
    """One run of a bench.train log.csv (``run``: "dense" or "sparse"; None: the file's last run)."""
    rows = list(csv.DictReader(open(path)))
    if not rows:
        raise ValueError(f"{path}: no rows")
    name = run or rows[-1]["run"]
    rows = [r for r in rows if r["run"] == name]
    if not rows:
        raise ValueError(f"{path}: no rows of run {name!r}")
    wall = sparse = refit = 0.0
    previous = 0
    for r in rows:
        step = int(r["step"])
        wall += (step - previous) * tokens_per_step / float(r["tokens_per_s"])
        refit += sum(float(r.get(k) or 0) for k in ("recluster_probe_s", "recluster_fit_s"))
        if r["phase"] == "sparse":
            sparse += step - previous
        previous = step
    finals = [r for r in rows if r["val_loss"] not in ("", "nan")]
    if not finals or int(finals[-1]["step"]) != previous:
        raise ValueError(f"{path}: run {name!r} has no final validation loss (unfinished?)")
    summary = Path(path).with_name("summary.txt")
    text = summary_text(summary, previous)  # read once; a stale summary (another step count) raises here
    if name == "sparse":
        scheduled = scheduled_sparse_steps(text, previous)
        sparse = sparse if scheduled is None else scheduled
    rate = steady_tokens_per_s(text, name)
    steady = wall if rate is None else previous * tokens_per_step / rate
    return Run(
        previous, steady, float(finals[-1]["val_loss"]), sparse / previous, wall, rate is not None,
        device_in(text), model_of(text), refit / wall, *length_of(text),
    )  # fmt: skip


_STEPS = re.compile(r"^model \S+ \([^)]*\), (\d+) steps x ", re.M)
_SCHEDULE = re.compile(r"schedule: dense steps \[0, (\d+)\), sparse \[\d+, (\d+)\)(?: with one step in (\d+) dense)?")


def summary_text(summary: Path, steps: int) -> str:
    """bench.train's summary.txt of a run of ``steps`` steps ("" where there is none); a summary of
    another step count (a stale one, left from another run) raises ValueError."""
    text = summary.read_text() if summary.is_file() else ""
    header = _STEPS.search(text)
    if header is not None and int(header.group(1)) != steps:
        raise ValueError(f"{summary}: a run of {header.group(1)} steps, its log {steps}: not this log's summary")
    return text


def steady_tokens_per_s(text: str, run: str) -> float | None:
    """The "tokens/s, whole run" of ``run``'s column in bench.train's summary.txt ``text`` (timed steps
    only; summary_text's); None where the text is empty or has no such row or column, or no finite value."""
    lines = text.splitlines()
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in lines if line.startswith("|")]
    names = rows[0] if rows else []
    for cells in rows:
        if cells[0] == "tokens/s, whole run" and run in names and len(cells) == len(names):
            rate = float(cells[names.index(run)].replace(",", ""))
            return rate if math.isfinite(rate) and rate > 0 else None
    return None


def with_compiles(runs: list[Run]) -> list[Run]:
    """``runs`` with their compile-inclusive wall times, where not all have a steady one: one kind
    of wall time in every ratio."""
    if all(r.steady for r in runs):
        return runs
    return [dataclasses.replace(r, wall_s=r.wall_with_compiles_s, steady=False) for r in runs]


def rebased(run: Run, own: Run, target: float, dense_wall: float, dense_wall_with_compiles: float | None) -> Run:
    """``run``, a budget measured beside its own dense run ``own`` (another sweep, run elsewhere or later),
    put beside the target's dense run: its final loss at the same gap from ``target`` as from ``own``'s, its
    wall times at the same ratios to the target's dense wall times as to ``own``'s."""
    walls = (run.wall_with_compiles_s, own.wall_with_compiles_s, dense_wall_with_compiles)
    with_compiles = None if None in walls else walls[0] * walls[2] / walls[1]
    return dataclasses.replace(
        run,
        final_val=run.final_val * target / own.final_val,
        wall_s=run.wall_s * dense_wall / own.wall_s,
        wall_with_compiles_s=with_compiles,
    )


def scheduled_sparse_steps(text: str, steps: int) -> int | None:
    """Sparse steps of a run of ``steps`` steps by the schedule in bench.train's summary.txt ``text``
    beside its log (summary_text's; the log's phase is per logged interval, so an interval that holds a
    phase boundary counts whole); None where the text has no schedule line."""
    match = _SCHEDULE.search(text)
    if match is None:
        return None
    warmup, dense_from, every = (int(g) if g else 0 for g in match.groups())
    schedule = PhaseSchedule(warmup, dense_from, every)
    return sum(schedule.phase_at(step) == "sparse" for step in range(steps))


@dataclass(frozen=True)
class IsoQuality:
    speedup: float | None  # dense wall / recipe wall at the target; None: not reached
    bound: str  # "=" interpolated, ">=" the smallest budget already reaches it, "" not reached
    steps_ratio: float | None  # recipe steps at the target / dense steps (k)
    gap: float  # the largest budget's final loss vs the target, relative (> 0: above)
    slope: float | None = None  # fall of the final loss / target per 1% more steps (module docstring)
    upper: float | None = None  # not reached: dense wall / the largest budget's wall, above the speedup
    sigma: float | None = None  # the same chord's fall of the final loss / target per unit of ln(steps)


def _chord(a: Run, b: Run, target: float) -> dict[str, float]:
    """IsoQuality's slope and sigma from budget a to the larger budget b: (a's final loss - b's) / target
    per 1% more steps, and per unit of ln(steps)."""
    fall = (a.final_val - b.final_val) / target
    return {"slope": fall / (100.0 * (b.steps / a.steps - 1.0)), "sigma": fall / math.log(b.steps / a.steps)}


def iso_quality(dense_wall: float, dense_steps: int, target: float, budgets: list[Run]) -> IsoQuality:
    """The recipe's speedup at the dense quality ``target`` from its runs at several budgets, taken in
    order of their steps (the budget; wall times of runs that shared a GPU need not follow it)."""
    runs = sorted(budgets, key=lambda r: r.steps)
    if len({r.steps for r in runs}) != len(runs):
        raise ValueError(f"iso_quality: budgets of {[r.steps for r in runs]} steps: expected one run per budget")
    gap = runs[-1].final_val / target - 1
    # slope and sigma between the two budgets that bracket the target, else the two nearest it
    if runs[0].final_val <= target:
        chord = _chord(runs[0], runs[1], target) if len(runs) > 1 else {}
        return IsoQuality(dense_wall / runs[0].wall_s, ">=", runs[0].steps / dense_steps, gap, **chord)
    for a, b in zip(runs, runs[1:], strict=False):
        if b.final_val <= target < a.final_val:
            w = (a.final_val - target) / (a.final_val - b.final_val)
            wall = a.wall_s + w * (b.wall_s - a.wall_s)
            steps = a.steps + w * (b.steps - a.steps)
            return IsoQuality(dense_wall / wall, "=", steps / dense_steps, gap, **_chord(a, b, target))
    chord = _chord(runs[-2], runs[-1], target) if len(runs) > 1 else {}
    return IsoQuality(None, "", None, gap, upper=dense_wall / runs[-1].wall_s, **chord)


def sparse_step_worth(sparse_frac: float, steps_ratio: float) -> float:
    """e = (1 / k - (1 - f)) / f: what one sparse step is worth in dense steps, in a model where every dense
    step is worth one and every sparse step the same e (a reading of k, not a measurement): k N steps, a
    fraction f of them sparse, reach what N dense steps reach when (1 - f + f e) k = 1. A whole run then
    gains (1 - f + f e) / (1 - f + f / s), monotone in f from 1 (f = 0) to s e (f = 1): under the model no
    schedule gains more than max(1, s e)."""
    if not 0.0 < sparse_frac <= 1.0 or steps_ratio <= 0:
        raise ValueError(f"sparse_step_worth: f={sparse_frac} (in (0, 1]), k={steps_ratio} (> 0)")
    return (1.0 / steps_ratio - (1.0 - sparse_frac)) / sparse_frac


def projected_speedup(sparse_frac: float, step_speedup: float, steps_ratio: float = 1.0) -> float:
    """1 / (k (1 - f + f / s)): the whole run's speedup over dense (see the module docstring)."""
    if not 0.0 <= sparse_frac <= 1.0 or step_speedup <= 0 or steps_ratio <= 0:
        raise ValueError(f"projected_speedup: f={sparse_frac} (0..1), s={step_speedup} (> 0), k={steps_ratio} (> 0)")
    return 1.0 / (steps_ratio * (1.0 - sparse_frac + sparse_frac / step_speedup))


def gap_that_pays(sparse_frac: float, step_speedup: float, sigma: float, speedup: float = 1.0) -> float:
    """The largest gap at equal steps g for which a run with a fraction f of its steps sparse, each s times
    as fast, still ends ``speedup`` times sooner at the dense loss, in the model k = (1 + g)^(1 / sigma)
    (docs/design.md; sigma: the loss's relative fall per unit of ln(steps)): k may be at most
    1 / (speedup (1 - f + f / s)), so g = that k ** sigma - 1 (negative: only a recipe that ends below
    dense at equal steps gets there)."""
    if not 0.0 <= sparse_frac <= 1.0 or step_speedup <= 0 or sigma <= 0 or speedup <= 0:
        raise ValueError(
            f"gap_that_pays: f={sparse_frac} (0..1), s={step_speedup} (> 0), sigma={sigma} (> 0), "
            f"speedup={speedup} (> 0)"
        )
    k = projected_speedup(sparse_frac, step_speedup) / speedup  # the steps ratio that still gives ``speedup``
    return k**sigma - 1.0


_MODEL = re.compile(r"^model (\S+) \(", re.M)


_LENGTH = re.compile(
    r"^model \S+ \(([\d.]+)M params\), \d+ steps x (\d+)x(\d+) tokens(?: per rank x (\d+) ranks)?", re.M
)


def length_of(text: str) -> tuple[float | None, int | None]:
    """(parameters, tokens per step over all ranks) from bench.train's summary.txt header ``text``
    ("model NAME (P.PM params), S steps x BxL tokens[ per rank x W ranks]"); (None, None) without one."""
    match = _LENGTH.search(text)
    if match is None:
        return None, None
    params, batch, seq, ranks = match.groups()
    return float(params) * 1e6, int(batch) * int(seq) * int(ranks or 1)


def _tokens_per_param(run: Run) -> str:
    if run.params is None or run.step_tokens is None:
        return "-"
    return f"{run.steps * run.step_tokens / run.params:.3g}"


def model_of(text: str) -> str | None:
    """The model name in bench.train's summary.txt ``text`` (summary_text's; None: no summary)."""
    match = _MODEL.search(text)
    return None if match is None else match.group(1)


def lowest_dense(logs: list[str], reference: float, dense: Run, tokens_per_step: int) -> tuple[float, str | None]:
    """The target: the lowest final loss of the dense runs in ``logs`` where it is below ``reference`` (the
    --dense runs' mean), with the log it came from; else ``reference`` and None. Each run must have ``dense``'s
    steps and, where both summaries name it, its model (``dense``: the first --dense run)."""
    best, source = reference, None
    for log in logs:
        run = read_run(log, "dense", tokens_per_step)
        if run.steps != dense.steps:
            steps = f"ran {run.steps} steps, the --dense runs {dense.steps}"
            raise SystemExit(f"--target-dense {log}: {steps}: not the same")
        if None not in (dense.model, run.model) and run.model != dense.model:
            raise SystemExit(f"--target-dense {log}: model {run.model}, the --dense runs' {dense.model}: not the same")
        if run.final_val < best:
            best, source = run.final_val, log
    return best, source


def _k_cell(iso: IsoQuality, budgets: list[Run], dense_steps: int) -> str:
    """k as the table shows it: interpolated, at most the smallest budget's ratio (already reached there),
    or more than the largest budget's (not reached)."""
    if iso.steps_ratio is None:
        return f">{max(b.steps for b in budgets) / dense_steps:.3f}"
    return f"{'<=' if iso.bound == '>=' else '='}{iso.steps_ratio:.3f}"


def _worth_cell(iso: IsoQuality, budgets: list[Run], dense_steps: int) -> str:
    """e from k (sparse_step_worth), its bound flipped from k's: a larger k is a smaller e."""
    f = budgets[0].sparse_frac
    if f == 0:
        return "-"
    if iso.steps_ratio is None:
        return f"<{sparse_step_worth(f, max(b.steps for b in budgets) / dense_steps):.3f}"
    return f"{'>=' if iso.bound == '>=' else '='}{sparse_step_worth(f, iso.steps_ratio):.3f}"


def _mean_with_compiles(runs: list[Run]) -> float | None:
    """The runs' mean wall time with their compiles (the logged intervals' sums); None if one lacks it."""
    walls = [r.wall_with_compiles_s for r in runs]
    return None if None in walls else sum(walls) / len(walls)


def _with_compiles(dense: list[Run], run: Run) -> str:
    """The dense runs' mean wall over ``run``'s, both with their compiles."""
    dense_wall = _mean_with_compiles(dense)
    if dense_wall is None or run.wall_with_compiles_s is None:
        return "-"
    return _ratio(dense_wall, run.wall_with_compiles_s)


def other_devices(budget: Run, own: Run | None, targets: list[Run]) -> str | None:
    """Why ``budget``'s wall time cannot be set against its dense run's: "A against B" where the summaries
    name different devices (the budget against its own dense run where it has one, else against the
    target's dense runs, which must share one); None where they agree or a device is unknown."""
    dense = [own] if own is not None else targets
    named = {r.device for r in [budget, *dense] if r.device is not None}
    if len(named) < 2:
        return None
    return f"{budget.device or 'unknown'} against {', '.join(sorted({r.device or 'unknown' for r in dense}))}"


def _sized(dense: Run, budgets: list[Run]) -> Run:
    """``dense`` with the model size and tokens per step of a budget's summary where its own are unknown (dense
    finals from --dense-csv): the recipe and its dense run train one model."""
    if dense.params is not None:
        return dense
    known = [b for b in budgets if b.params is not None and b.step_tokens is not None]
    return dataclasses.replace(dense, params=known[0].params, step_tokens=known[0].step_tokens) if known else dense


def _ratio(a: float, b: float) -> str:
    """a / b as "R.RRRx", or "-" where either wall time is unknown (dense finals from --dense-csv)."""
    r = a / b
    return f"{r:.3f}x" if math.isfinite(r) else "-"


def _iso_cell(iso: IsoQuality) -> str:
    """The iso-quality speedup cell: interpolated, a lower bound (">="), or not reached (with its upper bound
    where the dense wall time is known)."""
    if iso.speedup is None:
        known = iso.upper is not None and math.isfinite(iso.upper)
        return f"not reached (<{iso.upper:.3f}x)" if known else "not reached"
    return f"{iso.bound}{iso.speedup:.3f}x" if math.isfinite(iso.speedup) else "-"


def dense_from_csv(path: str, steps: int | None) -> tuple[list[Run], list[str]]:
    """Dense runs known by their final losses alone: a bench.seeds CSV's per-seed rows (their dense column),
    each a Run of ``steps`` steps with no wall time (nan); and the rows' names."""
    if steps is None or steps < 1:
        raise SystemExit(f"--dense-csv needs --dense-steps, the dense runs' steps (an int >= 1); got {steps!r}")
    try:
        rows = read_seeds(Path(path))
    except (OSError, ValueError) as e:
        raise SystemExit(f"--dense-csv {path}: {e}") from None
    if bad := [f"{r.name} ({r.dense!r})" for r in rows if not (math.isfinite(r.dense) and r.dense > 0)]:
        raise SystemExit(f"--dense-csv {path}: dense finals that are not a finite loss > 0: {', '.join(bad)}")
    return [Run(steps, math.nan, r.dense, 0.0, steady=True) for r in rows], [r.name for r in rows]


def _pairs(values: list[str], what: str) -> dict[str, str]:
    out = {}
    for v in values:
        if "=" not in v:
            raise SystemExit(f"{what} {v!r}: expected NAME=VALUE")
        k, val = v.split("=", 1)
        if k in out:
            raise SystemExit(f"{what} {v!r}: the name {k!r} is given twice")
        out[k] = val
    return out


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--dense", nargs="+", action="extend",
        help="bench.train log.csv files whose dense run is the target",
    )  # fmt: skip
    p.add_argument(
        "--dense-csv", metavar="CSV",
        help="instead of --dense: a bench.seeds CSV whose per-seed rows hold the dense finals (no wall times)",
    )  # fmt: skip
    p.add_argument(
        "--dense-steps", type=int, help="with --dense-csv: the dense runs' steps (not checked: give them right)"
    )
    p.add_argument(
        "--recipe", nargs="+", action="extend", required=True,
        help="NAME=log.csv[,log.csv...]: the recipe at its budgets (log.csv@dense.csv: one beside its own dense run)",
    )  # fmt: skip
    p.add_argument(
        "--step-speedup", nargs="*", action="extend", default=[],
        help="SIZE=s: bench.e2e's sparse step over dense there",
    )  # fmt: skip
    p.add_argument("--tokens-per-step", type=int, default=16384, help="tokens per step of the runs (default 16384)")
    p.add_argument(
        "--paired", action="store_true",
        help="the i-th --recipe against the i-th --dense run or --dense-csv row alone (one seed each), not their mean",
    )  # fmt: skip
    p.add_argument(
        "--target-dense", nargs="+", action="extend", default=[], metavar="LOG",
        help="dense runs of the same steps at another lr or schedule: the target is the lowest final loss of "
        "these and the --dense runs' mean (wall times stay --dense's; not with --paired)",
    )  # fmt: skip
    args = p.parse_args(argv)
    if args.target_dense and args.paired:
        raise SystemExit("--target-dense: not with --paired (there each recipe's target is its own seed's dense run)")
    from_csv = args.dense_csv is not None
    if bool(args.dense) == from_csv:
        raise SystemExit("give the dense runs once: --dense LOG... or --dense-csv CSV (with --dense-steps)")
    if args.dense_steps is not None and not from_csv:
        raise SystemExit("--dense-steps: only with --dense-csv (--dense logs give their own steps)")
    if from_csv:
        dense, dense_names = dense_from_csv(args.dense_csv, args.dense_steps)
    else:
        dense = [read_run(f, "dense", args.tokens_per_step) for f in args.dense]
        dense_names = [Path(f).parent.name or f for f in args.dense]
    speedups = {k: float(v) for k, v in _pairs(args.step_speedup, "--step-speedup").items()}
    recipes = _pairs(args.recipe, "--recipe")
    if args.paired and len(recipes) != len(dense):
        raise SystemExit(f"--paired: {len(recipes)} recipe(s) for {len(dense)} dense run(s); give one per dense run")
    files = [[f.partition("@")[::2] for f in budgets.split(",")] for budgets in recipes.values()]  # (log, own dense)
    for name, g, dense_name in zip(recipes, files, dense_names, strict=True) if args.paired else ():
        if differ := seeds_differ(Path(g[0][0]).parent.name, dense_name):
            mine, theirs = differ
            raise SystemExit(
                f"--paired: recipe {name} ({g[0][0]}) is seed {mine}, its dense run {dense_name!r} seed {theirs}"
            )
    groups = [[read_run(log, "sparse", args.tokens_per_step) for log, _ in g] for g in files]
    owns = [[read_run(own, "dense", args.tokens_per_step) if own else None for _, own in g] for g in files]
    logged = [] if from_csv else dense  # finals from a CSV have no wall time of either kind
    runs = with_compiles(logged + [b for g in groups for b in g] + [o for g in owns for o in g if o is not None])
    if not runs[0].steady:
        print("wall times with compiles: not every run has a bench.train summary.txt beside its log")
    if from_csv:
        print(f"dense finals from {args.dense_csv} ({args.dense_steps} steps): no wall time is compared")
    if logged:  # the same runs, each wall time of one kind
        dense = runs[: len(logged)]
    rest = iter(runs[len(logged) :])
    groups = [[next(rest) for _ in g] for g in groups]  # the same runs, each wall time of one kind
    owns = [[None if o is None else next(rest) for o in g] for g in owns]
    reference = sum(r.final_val for r in dense) / len(dense)  # the --dense runs' loss: budgets are rebased onto it
    target, target_from = lowest_dense(args.target_dense, reference, dense[0], args.tokens_per_step)
    dense_wall = sum(r.wall_s for r in dense) / len(dense)
    rows = []
    for i, (name, budgets) in enumerate(zip(recipes, groups, strict=True)):
        base = dense[i] if args.paired else dense[0]  # its steps: the k = 1 budget
        if args.paired:
            reference = target = base.final_val
            dense_wall = base.wall_s
        targets = [base] if args.paired else dense  # the dense run(s) the target is
        dense_wall_c = _mean_with_compiles(targets)
        for j, ((log, own_log), own) in enumerate(zip(files[i], owns[i], strict=True)):
            if own is None:
                continue
            if own.steps != base.steps:
                raise SystemExit(f"--recipe {name}: {own_log} ran {own.steps} steps, the target's dense {base.steps}")
            budgets[j] = rebased(budgets[j], own, reference, dense_wall, dense_wall_c)
            gap = budgets[j].final_val / reference - 1
            print(f"{name}: {log} against {own_log} (gap {gap:+.2%}), put onto the --dense runs' loss")
        iso = iso_quality(dense_wall, base.steps, target, budgets)
        same = [b for b in budgets if b.steps == base.steps]
        # walls on different devices are no speedup: k and the projections (from k alone) still hold
        differ = [(log, d) for (log, _), b, o in zip(files[i], budgets, owns[i], strict=True)
                  if (d := other_devices(b, o, targets)) is not None]  # fmt: skip
        for log, d in differ:
            print(f"{name}: {log} ran on {d}: its wall time is not compared")
        unlike = "- (devices differ)" if differ else None
        largest = max(budgets, key=lambda b: b.steps)
        row = {
            "recipe": name,
            "budgets (steps)": ", ".join(str(b.steps) for b in sorted(budgets, key=lambda b: b.steps)),
            "sparse steps": f"{budgets[0].sparse_frac:.0%}",
            "wall vs dense, same steps": unlike or (_ratio(dense_wall, same[0].wall_s) if same else "-"),
            "the same with compiles": unlike or (_with_compiles(targets, same[0]) if same else "-"),
            "gap at equal steps (g)": f"{same[0].final_val / target - 1:+.2%}" if same else "-",
            "largest budget vs dense": f"{iso.gap:+.2%}",
            "steps to the target (k)": _k_cell(iso, budgets, base.steps),
            "a sparse step's worth (e)": _worth_cell(iso, budgets, base.steps),
            "loss fall per 1% more steps": "-" if iso.slope is None else f"{iso.slope:.2%}",
            "tokens per parameter": _tokens_per_param(_sized(base, budgets)),
            "refits, share of wall": f"{largest.refit_frac:.1%}" if largest.refit_frac else "-",
            "iso-quality speedup (wall time: runs alone only)": unlike or _iso_cell(iso),
        }
        for size, s in speedups.items():  # a smaller k is a larger speedup: the bound flips
            if iso.steps_ratio is None:  # k above the largest budget's ratio: the speedup below its projection
                k_max = max(b.steps for b in budgets) / base.steps
                cell = f"<{projected_speedup(budgets[0].sparse_frac, s, k_max):.2f}x"
            else:
                bound = ">=" if iso.bound == ">=" else ""
                cell = f"{bound}{projected_speedup(budgets[0].sparse_frac, s, iso.steps_ratio):.2f}x"
            row[f"projection {size} (s={s})"] = cell
            if iso.sigma is not None and iso.sigma > 0:  # the model's g, at this run's own chord
                f, sigma = budgets[0].sparse_frac, iso.sigma
                cell = f"{gap_that_pays(f, s, sigma):+.2%}, {gap_that_pays(f, s, sigma, 1.3):+.2%}"
            else:
                cell = "-"
            row[f"g that pays / gives 1.3x, {size} (model)"] = cell
        if args.paired:
            row["target"] = f"{target:.4f} ({dense_names[i]})"
        rows.append(row)
    if not args.paired:
        mean = f"mean of {len(dense)}"
        lowest = f"{target_from}: the lowest dense loss; --dense's {mean} {reference:.4f}"
        source = mean if target_from is None else lowest
        wall = f", dense wall {dense_wall:.0f} s" if math.isfinite(dense_wall) else ""
        print(f"target: dense final val {target:.4f} ({source}){wall}")
    print(tabulate(rows, headers="keys", tablefmt="github"))
    return rows


if __name__ == "__main__":
    main()
