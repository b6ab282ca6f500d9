"""python -m bench.seeds OUT1 OUT2 ...: sparse vs dense over several seeds, with the noise band.

Each OUT is a bench.train output folder (its log.csv) of one seed with both runs, dense and sparse;
with --sparse-from, the sparse run of seed i comes from the i-th of those folders instead (several
sparse configurations measured against the same dense seeds).
Prints, per folder, the final validation loss of each run, the paired difference (sparse - dense) /
dense, the mean kept mass of the sparse run's sparse phase (h_kept_frac), and the lead of the
sparse model over itself with dense FFNs at the last evaluation of the sparse phase
((val_loss - val_loss_dense) / val_loss_dense; negative: it does better sparse, see bench.train);
then:
- dense spread: (max - min) / mean of the dense final validation losses (the seed-to-seed noise);
- the mean paired difference and its standard error (std / sqrt(n));
- the mean of the sparse-phase kept mass;
- from three seeds up, the correlation of a seed's dense and sparse finals and the unpaired
  difference of the means with its standard error: pairing narrows the band only where a seed's
  luck carries over to both of its runs (positive correlation).
A pair whose runs' summaries name different devices gets a note naming them (here and in
bench.sweep's tables): a seed's run differs between kinds of GPU, so pair on one kind.
With --dense-only the folders need only a dense run: the dense final losses, their spread and
their standard deviation over the mean (the noise band without any sparse arm).
With --merge the seeds come from the CSVs this command (or bench.sweep) wrote instead, their
per-seed rows pooled into one table: more pairs of one configuration, measured in several sweeps.
With --dense-csv the folders need only a sparse run: the i-th is paired with the dense final of the
i-th per-seed row of a CSV this command wrote (the same seeds' dense runs, measured before); a row
whose name ends in another seed than the folder's (`..._s3`) is refused.

    python -m bench.seeds runs/s0 runs/s1 runs/s2 [--sparse-from runs/c0 runs/c1 runs/c2] [--csv F]
    python -m bench.seeds --dense-only runs/s0 runs/s1 runs/s2 runs/d3 runs/d4 runs/d5
    python -m bench.seeds --merge seeds_0-2.csv seeds_3-5.csv [--csv F]
    python -m bench.seeds runs/x_s0 runs/x_s1 runs/x_s2 --dense-csv earlier_seeds.csv [--csv F]
"""

import argparse
import csv
import math
import re
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
    lead: float = math.nan  # last sparse-phase (val_loss - val_loss_dense) / val_loss_dense (nan: not logged)

    @property
    def diff(self) -> float:
        return (self.sparse - self.dense) / self.dense


def _final(folder: Path) -> tuple[dict[str, float], list[float], float]:
    """(run -> final validation loss, the sparse run's sparse-phase kept mass rows, its last
    sparse-phase lead over dense FFNs) of one folder."""
    path = folder / "log.csv"
    if not path.is_file():
        raise ValueError(f"{folder}: no log.csv (expected a bench.train --out folder)")
    final: dict[str, float] = {}
    kept: list[float] = []
    lead = math.nan
    with open(path) as f:
        for r in csv.DictReader(f):
            if r["val_loss"]:
                final[r["run"]] = float(r["val_loss"])  # rows are in step order: the last one stays
            if r["run"] == "sparse" and r["phase"] == "sparse" and r.get("h_kept_frac") not in (None, "", "nan"):
                kept.append(float(r["h_kept_frac"]))
            if r["run"] == "sparse" and r.get("val_loss_dense"):
                lead = (float(r["val_loss"]) - float(r["val_loss_dense"])) / float(r["val_loss_dense"])
    return final, kept, lead


def _require(final: dict[str, float], run: str, folder: Path) -> float:
    """``run``'s final validation loss from ``_final``'s map, or a ValueError naming the log."""
    if math.isnan(final.get(run, math.nan)):
        raise ValueError(f"{folder / 'log.csv'}: no validation loss for the {run} run")
    return final[run]


def load(folder: Path, sparse_from: Path | None = None) -> SeedRun:
    """The final validation losses and sparse-phase kept mass of one seed: the dense run from
    ``folder``, the sparse run from ``sparse_from`` (default: the same folder)."""
    final, kept, lead = _final(folder)
    if sparse_from is not None:
        other, kept, lead = _final(sparse_from)
        final["sparse"] = other.get("sparse", math.nan)
    for run, where in (("dense", folder), ("sparse", sparse_from or folder)):
        _require(final, run, where)
    name = folder.name if sparse_from is None else f"{folder.name} / {sparse_from.name}"
    return SeedRun(name, final["dense"], final["sparse"], statistics.fmean(kept) if kept else math.nan, lead)


def seed_of(name: str) -> int | None:
    """The seed a folder or row name ends in (`dense_s3`, `s0 / arm_s0` -> 3, 0), or None."""
    m = re.search(r"(?:^|_)s(\d+)$", name)
    return int(m.group(1)) if m else None


def seeds_differ(a: str, b: str) -> tuple[int, int] | None:
    """The seeds two names end in (seed_of's), where both end in one and they differ; else None."""
    mine, theirs = seed_of(a), seed_of(b)
    return (mine, theirs) if mine is not None and theirs is not None and mine != theirs else None


def load_against(folder: Path, dense: SeedRun) -> SeedRun:
    """The sparse run of ``folder`` paired with the dense final of an earlier per-seed row of the same
    seed (``read``'s); a ValueError if the two names end in different seeds."""
    if differ := seeds_differ(folder.name, dense.name):
        mine, theirs = differ
        raise ValueError(f"{folder}: seed {mine}, paired with the dense run of seed {theirs} ({dense.name!r})")
    final, kept, lead = _final(folder)
    sparse = _require(final, "sparse", folder)
    name = f"{dense.name.split(' / ')[0].removesuffix(' (csv)')} (csv) / {folder.name}"
    return SeedRun(name, dense.dense, sparse, statistics.fmean(kept) if kept else math.nan, lead)


# the line of bench.train's summary.txt that names the device it ran on
DEVICE_LINE = re.compile(r"^device: (.+)$", re.M)


def device_in(text: str) -> str | None:
    """The device a bench.train summary.txt's ``text`` names (None: no such line)."""
    found = DEVICE_LINE.search(text)
    return found.group(1).strip() if found else None


def device_of(folder: Path) -> str | None:
    """The device ``folder``'s bench.train summary.txt names (None: no summary, or no such line)."""
    path = folder / "summary.txt"
    return device_in(path.read_text()) if path.is_file() else None


def across_devices(pairs: list[tuple[Path, Path]]) -> str:
    """A note naming each (dense, sparse) pair of folders whose runs name different devices, or "".
    The same seed's run is not the same computation on another kind of GPU (other kernels, other
    reduction orders), so such a pair's difference holds that card-to-card noise besides the pattern's."""
    found = [
        f"{dense.name} on {a}, {sparse.name} on {b}"
        for dense, sparse in pairs
        if (a := device_of(dense)) is not None and (b := device_of(sparse)) is not None and a != b
    ]
    head = "note: pairs across devices (a seed's run differs between kinds of GPU; pair on one kind): "
    return head + "; ".join(found) if found else ""


def dense_finals(folders: list[Path]) -> list[float]:
    """The dense run's final validation loss of each folder."""
    return [_require(_final(folder)[0], "dense", folder) for folder in folders]


def dense_table(folders: list[Path]) -> str:
    """Each folder's dense final loss, then (max - min) / mean and (sample std) / mean."""
    finals = dense_finals(folders)
    mean = statistics.fmean(finals)
    rows = [[f.name, f"{x:.4f}"] for f, x in zip(folders, finals, strict=True)]
    rows.append([f"mean of {len(finals)}", f"{mean:.4f}"])
    text = tabulate(rows, headers=["seed", "dense val"], tablefmt="github", disable_numparse=True)
    spread = (max(finals) - min(finals)) / mean
    std = statistics.stdev(finals) / mean if len(finals) > 1 else math.nan
    return f"{text}\n\ndense seed-to-seed spread (max - min) / mean: {spread:.2%}; std / mean: {std:.2%}"


def summarize(runs: list[SeedRun]) -> dict[str, float]:
    """dense_spread: (max - min) / mean of dense; diff_mean, diff_se: the paired difference's mean and
    standard error (nan for one seed); kept_mean."""
    if not runs:
        raise ValueError("no runs to summarize")
    dense = [r.dense for r in runs]
    diffs = [r.diff for r in runs]
    kept = [r.kept for r in runs if not math.isnan(r.kept)]
    leads = [r.lead for r in runs if not math.isnan(r.lead)]
    return {
        "seeds": len(runs),
        "dense_mean": statistics.fmean(dense),
        "sparse_mean": statistics.fmean(r.sparse for r in runs),
        "dense_spread": (max(dense) - min(dense)) / statistics.fmean(dense),
        "diff_mean": statistics.fmean(diffs),
        "diff_se": statistics.stdev(diffs) / math.sqrt(len(diffs)) if len(diffs) > 1 else math.nan,
        "kept_mean": statistics.fmean(kept) if kept else math.nan,
        "lead_mean": statistics.fmean(leads) if leads else math.nan,
    }


def _pct(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{x:+.2%}"


def table(runs: list[SeedRun]) -> str:
    s = summarize(runs)
    rows = [
        [r.name, f"{r.dense:.4f}", f"{r.sparse:.4f}", f"{r.diff:+.2%}", f"{r.kept:.3f}", _pct(r.lead)] for r in runs
    ]
    rows.append(
        [f"mean of {s['seeds']}", f"{s['dense_mean']:.4f}", f"{s['sparse_mean']:.4f}",
         f"{s['diff_mean']:+.2%} ± {s['diff_se']:.2%}", f"{s['kept_mean']:.3f}", _pct(s["lead_mean"])]
    )  # fmt: skip
    text = tabulate(
        rows,
        headers=[
            "seed",
            "dense val",
            "sparse val",
            "sparse vs dense (± s.e.)",
            "kept mass, sparse phase",
            "sparse-phase lead over dense FFNs",
        ],  # fmt: skip
        tablefmt="github",
        disable_numparse=True,
    )
    lines = [f"{text}\n", f"dense seed-to-seed spread (max - min) / mean: {s['dense_spread']:.2%}"]
    corr = correlation(runs)
    if not math.isnan(corr):
        lines.append(
            f"correlation of a seed's dense and sparse finals: {corr:+.2f} (pairing narrows the band only "
            f"when it is positive; unpaired, the difference of the means is {unpaired(runs)})"
        )
    return "\n".join(lines)


def correlation(runs: list[SeedRun]) -> float:
    """Pearson correlation of the dense and sparse final losses over seeds (nan under 3 seeds or
    with a constant arm)."""
    dense, sparse = [r.dense for r in runs], [r.sparse for r in runs]
    if len(runs) < 3 or statistics.pvariance(dense) == 0 or statistics.pvariance(sparse) == 0:
        return math.nan
    return statistics.correlation(dense, sparse)


def unpaired(runs: list[SeedRun]) -> str:
    """(mean sparse - mean dense) / mean dense with the standard error of two independent means."""
    dense, sparse = [r.dense for r in runs], [r.sparse for r in runs]
    md, ms, n = statistics.fmean(dense), statistics.fmean(sparse), len(runs)
    se = math.sqrt(statistics.variance(dense) / n + statistics.variance(sparse) / n) / md
    return f"{(ms - md) / md:+.2%} ± {se:.2%}"


def read(path: Path) -> list[SeedRun]:
    """The per-seed rows of a CSV that ``write`` wrote (its summary row left out)."""
    with open(path) as f:
        rows = [r for r in csv.DictReader(f) if r.get("seed") != "summary"]
    try:
        runs = [SeedRun(r["seed"], float(r["dense"]), float(r["sparse"]), float(r["kept"]), float(r["lead"] or "nan"))
                for r in rows]  # fmt: skip
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{path}: not a bench.seeds CSV (columns seed, dense, sparse, kept, lead): {e!r}") from None
    if not runs:
        raise ValueError(f"{path}: no per-seed rows")
    return runs


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.seeds", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("folders", nargs="*", type=Path, help="bench.train --out folders, one per seed")
    p.add_argument("--sparse-from", nargs="+", type=Path, help="folders of the sparse runs, one per dense folder")
    p.add_argument("--csv", type=Path, help="also write the per-seed rows and the summary here")
    p.add_argument("--dense-only", action="store_true", help="only the dense runs' finals and their spread")
    p.add_argument("--merge", nargs="+", type=Path, help="bench.seeds CSVs whose per-seed rows form one table")
    p.add_argument("--dense-csv", type=Path, help="a bench.seeds CSV: its rows' dense finals, in order")
    args = p.parse_args(argv)
    if args.merge and (args.folders or args.sparse_from or args.dense_only):
        p.error("--merge takes no folders, --sparse-from or --dense-only")
    if not args.merge and not args.folders:
        p.error("expected bench.train --out folders (or --merge CSVs)")
    if args.dense_only and (args.sparse_from or args.csv):
        p.error("--dense-only takes neither --sparse-from nor --csv")
    if args.dense_csv and (args.merge or args.sparse_from or args.dense_only):
        p.error("--dense-csv takes neither --merge, --sparse-from nor --dense-only")
    if args.sparse_from and len(args.sparse_from) != len(args.folders):
        p.error(f"--sparse-from: {len(args.sparse_from)} folders for {len(args.folders)} dense folders (need one each)")
    try:
        if args.dense_only:
            print(dense_table(args.folders))
            return 0
        if args.merge:
            runs = [run for path in args.merge for run in read(path)]
        elif args.dense_csv:
            runs = paired_with_csv(args.folders, args.dense_csv)
        else:
            sparse_from = args.sparse_from or [None] * len(args.folders)
            runs = [load(f, s) for f, s in zip(args.folders, sparse_from, strict=True)]
    except (OSError, ValueError) as e:
        print(f"python -m bench.seeds: error: {e}", file=sys.stderr)
        return 2
    print(table(runs))
    if note := across_devices(list(zip(args.folders, args.sparse_from or args.folders, strict=True))):
        print(note)
    if args.csv:
        write(args.csv, runs)
    return 0


def paired_with_csv(folders: list[Path], path: Path) -> list[SeedRun]:
    """Each folder's sparse run against the dense final of the same-index per-seed row of ``path``."""
    dense = read(path)
    if len(dense) != len(folders):
        raise ValueError(f"{path}: {len(dense)} per-seed rows for {len(folders)} folders (need one each)")
    return [load_against(f, d) for f, d in zip(folders, dense, strict=True)]


def write(path: Path, runs: list[SeedRun]) -> None:
    """The per-seed rows and a summary row (summarize's fields) as CSV."""
    s = summarize(runs)
    rows = [{"seed": r.name, "dense": r.dense, "sparse": r.sparse, "diff": r.diff, "kept": r.kept, "lead": r.lead}
            for r in runs]  # fmt: skip
    keys = ("dense_mean", "sparse_mean", "diff_mean", "diff_se", "kept_mean", "lead_mean", "dense_spread")
    rows.append({"seed": "summary", **{k: s[k] for k in keys}})
    write_csv(path, rows, ["seed", "dense", "sparse", "diff", "kept", "lead", *keys[:-1], "dense_spread"])


if __name__ == "__main__":
    sys.exit(main())
