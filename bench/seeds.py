"""python -m bench.seeds OUT1 OUT2 ...: sparse vs dense over several seeds, with the noise band.

Each OUT is a bench.train output folder (its log.csv) of one seed with both runs, dense and sparse;
with --sparse-from, the sparse run of seed i comes from the i-th of those folders instead (several
sparse configurations measured against the same dense seeds).
Prints, per folder, the final validation loss of each run, the paired difference (sparse - dense) /
dense, and the mean kept mass of the sparse run's sparse phase (h_kept_frac); then:
- dense spread: (max - min) / mean of the dense final validation losses (the seed-to-seed noise);
- the mean paired difference and its standard error (std / sqrt(n));
- the mean of the sparse-phase kept mass.

    python -m bench.seeds runs/s0 runs/s1 runs/s2 [--sparse-from runs/c0 runs/c1 runs/c2] [--csv F]
"""

import argparse
import csv
import math
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

from tabulate import tabulate

from bench.env import write_csv


@dataclass
class SeedRun:
    name: str
    dense: float  # final validation loss
    sparse: float
    kept: float  # mean h_kept_frac over the sparse run's sparse-phase rows (nan: not logged)

    @property
    def diff(self) -> float:
        return (self.sparse - self.dense) / self.dense


def _final(folder: Path) -> tuple[dict[str, float], list[float]]:
    """(run -> final validation loss, the sparse run's sparse-phase kept mass rows) of one folder."""
    path = folder / "log.csv"
    if not path.is_file():
        raise ValueError(f"{folder}: no log.csv (expected a bench.train --out folder)")
    final: dict[str, float] = {}
    kept: list[float] = []
    with open(path) as f:
        for r in csv.DictReader(f):
            if r["val_loss"]:
                final[r["run"]] = float(r["val_loss"])  # rows are in step order: the last one stays
            if r["run"] == "sparse" and r["phase"] == "sparse" and r.get("h_kept_frac") not in (None, "", "nan"):
                kept.append(float(r["h_kept_frac"]))
    return final, kept


def load(folder: Path, sparse_from: Path | None = None) -> SeedRun:
    """The final validation losses and sparse-phase kept mass of one seed: the dense run from
    ``folder``, the sparse run from ``sparse_from`` (default: the same folder)."""
    final, kept = _final(folder)
    if sparse_from is not None:
        final["sparse"] = _final(sparse_from)[0].get("sparse", math.nan)
        kept = _final(sparse_from)[1]
    for run, where in (("dense", folder), ("sparse", sparse_from or folder)):
        if math.isnan(final.get(run, math.nan)):
            raise ValueError(f"{where / 'log.csv'}: no validation loss for the {run} run")
    name = folder.name if sparse_from is None else f"{folder.name} / {sparse_from.name}"
    return SeedRun(name, final["dense"], final["sparse"], statistics.fmean(kept) if kept else math.nan)


def summarize(runs: list[SeedRun]) -> dict[str, float]:
    """dense_spread: (max - min) / mean of dense; diff_mean, diff_se: the paired difference's mean and
    standard error (nan for one seed); kept_mean."""
    if not runs:
        raise ValueError("no runs to summarize")
    dense = [r.dense for r in runs]
    diffs = [r.diff for r in runs]
    kept = [r.kept for r in runs if not math.isnan(r.kept)]
    return {
        "seeds": len(runs),
        "dense_mean": statistics.fmean(dense),
        "sparse_mean": statistics.fmean(r.sparse for r in runs),
        "dense_spread": (max(dense) - min(dense)) / statistics.fmean(dense),
        "diff_mean": statistics.fmean(diffs),
        "diff_se": statistics.stdev(diffs) / math.sqrt(len(diffs)) if len(diffs) > 1 else math.nan,
        "kept_mean": statistics.fmean(kept) if kept else math.nan,
    }


def table(runs: list[SeedRun]) -> str:
    s = summarize(runs)
    rows = [[r.name, f"{r.dense:.4f}", f"{r.sparse:.4f}", f"{r.diff:+.2%}", f"{r.kept:.3f}"] for r in runs]
    rows.append(
        [f"mean of {s['seeds']}", f"{s['dense_mean']:.4f}", f"{s['sparse_mean']:.4f}",
         f"{s['diff_mean']:+.2%} ± {s['diff_se']:.2%}", f"{s['kept_mean']:.3f}"]
    )  # fmt: skip
    text = tabulate(
        rows,
        headers=["seed", "dense val", "sparse val", "sparse vs dense (± s.e.)", "kept mass, sparse phase"],
        tablefmt="github",
        disable_numparse=True,
    )
    return f"{text}\n\ndense seed-to-seed spread (max - min) / mean: {s['dense_spread']:.2%}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.seeds", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("folders", nargs="+", type=Path, help="bench.train --out folders, one per seed")
    p.add_argument("--sparse-from", nargs="+", type=Path, help="folders of the sparse runs, one per dense folder")
    p.add_argument("--csv", type=Path, help="also write the per-seed rows and the summary here")
    args = p.parse_args(argv)
    if args.sparse_from and len(args.sparse_from) != len(args.folders):
        p.error(f"--sparse-from: {len(args.sparse_from)} folders for {len(args.folders)} dense folders (need one each)")
    try:
        runs = [load(f, s) for f, s in zip(args.folders, args.sparse_from or [None] * len(args.folders), strict=True)]
    except ValueError as e:
        print(f"python -m bench.seeds: error: {e}", file=sys.stderr)
        return 2
    print(table(runs))
    if args.csv:
        s = summarize(runs)
        rows = [{"seed": r.name, "dense": r.dense, "sparse": r.sparse, "diff": r.diff, "kept": r.kept} for r in runs]
        rows.append({"seed": "summary", **{k: s[k] for k in ("dense_mean", "sparse_mean", "diff_mean", "kept_mean")},
                     "diff_se": s["diff_se"], "dense_spread": s["dense_spread"]})  # fmt: skip
        write_csv(args.csv, rows, ["seed", "dense", "sparse", "diff", "kept", "dense_mean", "sparse_mean",
                                   "diff_mean", "diff_se", "kept_mean", "dense_spread"])  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
