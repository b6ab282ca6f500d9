"""python -m bench.compare_logs BASE/log.csv OTHER/log.csv [...]: do training runs follow the same curve?

Reads bench.train's log.csv files (one row per logged step and run name) and, for every run name
(dense, sparse) and logged step the files share, prints the train loss (mean over the logging
interval) and validation loss of each file and the relative difference of each OTHER to BASE; then
the largest |relative difference| per file and run. Use it to compare a distributed run with a
single-GPU run at the same global batch, or two seeds, or two revisions.
"""

import argparse
import csv
import sys
from pathlib import Path

from tabulate import tabulate


def load(path: Path) -> dict[tuple[str, int], tuple[float, float | None]]:
    """(run, step) -> (train loss, validation loss or None)."""
    out = {}
    with open(path) as f:
        for r in csv.DictReader(f):
            val = float(r["val_loss"]) if r["val_loss"] else None
            out[(r["run"], int(r["step"]))] = (float(r["loss"]), val)
    return out


def compare(paths: list[Path], every: int = 1) -> tuple[list[dict], list[dict]]:
    """(rows of the step table, rows of the worst-difference table)."""
    logs = [load(p) for p in paths]
    names = [p.parent.name or str(p) for p in paths]
    keys = sorted(set.intersection(*(set(lg) for lg in logs)))
    if not keys:
        raise SystemExit(f"no (run, step) in common between {', '.join(map(str, paths))}")
    rows, worst = [], {}
    for i, (run, step) in enumerate(keys):
        base_loss, base_val = logs[0][(run, step)]
        row = {"run": run, "step": step, names[0]: base_loss}
        for name, lg in zip(names[1:], logs[1:], strict=True):
            loss, val = lg[(run, step)]
            row[name] = loss
            row[f"{name} vs {names[0]}"] = f"{(loss - base_loss) / base_loss:+.2%}"
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
    args = p.parse_args(argv)
    if len(args.logs) < 2:
        p.error("give at least two log.csv files")
    rows, summary = compare(args.logs, args.every)
    print(tabulate(rows, headers="keys", floatfmt=".4f", tablefmt="github"))
    print()
    print(tabulate(summary, headers="keys", tablefmt="github"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
