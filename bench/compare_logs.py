"""python -m bench.compare_logs BASE/log.csv OTHER/log.csv [...]: do training runs follow the same curve?

Reads bench.train's log.csv files (one row per logged step and run name) and, for every run name
(dense, sparse) and logged step the files share, prints the train loss (mean over the logging
interval) and validation loss of each file and the relative difference of each OTHER to BASE; then
the largest |relative difference| per file and run. Use it to compare a distributed run with a
single-GPU run at the same global batch, or two seeds, or two revisions.

--by-step compares each file's only run by step, whatever its name: a sparse run against the dense
run of its seed (how far behind it is at each evaluation, and where the gap closes), with the base's
learning rate over its peak at each step and the phase the other file's run was in.

    python -m bench.compare_logs runs/w13/dense_s0/log.csv runs/w13/chunked_s0/log.csv --by-step --every 400
"""

import argparse
import csv
import sys
from pathlib import Path
from typing import NamedTuple

from tabulate import tabulate


class Point(NamedTuple):
    """One logged step of one run: train loss (mean over the interval), validation loss, lr and phase."""

    loss: float
    val: float | None
    lr: float | None
    phase: str


Log = dict[tuple[str, int], Point]


def load(path: Path) -> Log:
    """(run, step) -> its Point (lr None and phase "" where the log has no such column)."""
    out = {}
    with open(path) as f:
        for r in csv.DictReader(f):
            val = float(r["val_loss"]) if r["val_loss"] else None
            lr = float(r["lr"]) if r.get("lr") else None
            out[(r["run"], int(r["step"]))] = Point(float(r["loss"]), val, lr, r.get("phase") or "")
    return out


def by_step(log: Log, path: Path) -> Log:
    """The file's only run, keyed ("", step); an error naming the runs where it has several."""
    runs = sorted({run for run, _ in log})
    if len(runs) != 1:
        raise SystemExit(f"--by-step: {path} has runs {runs}: expected one run per file")
    return {("", step): v for (_, step), v in log.items()}


def compare(paths: list[Path], every: int = 1, steps_only: bool = False) -> tuple[list[dict], list[dict]]:
    """(rows of the step table, rows of the worst-difference table). ``steps_only``: each file's only run,
    matched by step (--by-step), with the base's lr (over its peak) and the first other file's phase at each step."""
    logs = [load(p) for p in paths]
    if steps_only:
        logs = [by_step(lg, p) for lg, p in zip(logs, paths, strict=True)]
        peak = max((v.lr for v in logs[0].values() if v.lr is not None), default=0.0)
    names = [p.parent.name or str(p) for p in paths]
    keys = sorted(set.intersection(*(set(lg) for lg in logs)))
    if not keys:
        raise SystemExit(f"no (run, step) in common between {', '.join(map(str, paths))}")
    rows, worst = [], {}
    for i, (run, step) in enumerate(keys):
        base_loss, base_val, lr, _ = logs[0][(run, step)]
        row = {"run": run, "step": step} if not steps_only else {"step": step}
        if steps_only:
            row["lr / peak"] = f"{lr / peak:.2f}x" if lr is not None and peak > 0 else ""
            row[f"phase {names[1]}"] = logs[1][(run, step)].phase
        row[names[0]] = base_loss
        for name, lg in zip(names[1:], logs[1:], strict=True):
            loss, val, _, _ = lg[(run, step)]
            row[name] = loss
            row[f"{name} vs {names[0]}"] = f"{(loss - base_loss) / base_loss:+.2%}"
            if steps_only and val is not None and base_val is not None:
                row[f"val {name} vs {names[0]}"] = f"{(val - base_val) / base_val:+.2%}"
            w = worst.setdefault(
                (run, name), {"run": run, "file": name, "max |diff| train": 0.0, "max |diff| val": 0.0}
            )
            w["max |diff| train"] = max(w["max |diff| train"], abs(loss - base_loss) / base_loss)
            if val is not None and base_val is not None:
                w["max |diff| val"] = max(w["max |diff| val"], abs(val - base_val) / base_val)
        if base_val is not None:
            row[f"val {names[0]}"] = base_val
        if step % every == 0 or base_val is not None or i == len(keys) - 1:
            rows.append(row)
    summary = [{**w, "max |diff| train": f"{w['max |diff| train']:.2%}", "max |diff| val": f"{w['max |diff| val']:.2%}"}
               for w in worst.values()]  # fmt: skip
    return rows, summary


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.compare_logs", description=__doc__)
    p.add_argument("logs", nargs="+", type=Path, help="log.csv files; the first is the base")
    p.add_argument("--every", type=int, default=50, help="print steps that are multiples of this (and evals)")
    p.add_argument(
        "--by-step", action="store_true", help="compare each file's only run by step, whatever its name (dense, sparse)"
    )
    args = p.parse_args(argv)
    if len(args.logs) < 2:
        p.error("give at least two log.csv files")
    rows, summary = compare(args.logs, args.every, args.by_step)
    print(tabulate(rows, headers="keys", floatfmt=".4f", tablefmt="github"))
    print()
    print(tabulate(summary, headers="keys", tablefmt="github"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
