"""python -m bench.sweep: the main job's sparse configurations x seeds, side by side on one machine,
over calls of bounded length; then each configuration's paired table against the dense seeds.

Each (configuration, seed) is one process, `python -m bench.train --runs sparse --seed S --sparsity X`,
writing to OUT/<arm>_s<S>; the dense seeds likewise (`--runs dense`) to OUT/dense_s<S>, unless
--dense names finished bench.train folders, one per seed, or --dense-csv a bench.seeds CSV whose
per-seed rows hold the same seeds' dense finals (measured before; no dense process runs).
At most --parallel processes run at once; with --gpus N they are spread over N GPUs, each process
seeing one (a sweep of 1B+ models: one run per GPU, --parallel N).
Each process gets what is left of --time-limit as its own --time-limit: it stops after the first step
past it and writes its checkpoint, and the same command run again resumes it (`--resume`), step for
step as if never stopped. A folder with a summary.txt is finished and does not run again; a process
is not started with less than --min-seconds left (compiling alone takes about a minute on a GPU).
A process overruns the limit by its start-up (imports), its last step and its checkpoint write:
give --time-limit about a minute less than the caller's own limit.
Arguments after `--` go to every bench.train process, unchanged between calls (--resume checks).
A --sparsity value may carry its own bench.train arguments after ' -- ' (one arm of a schedule
sweep): '{"activations": "128:4:16", "causal": true} -- --final-dense-frac 0.4'. They come after
the shared ones, so an arm's own flag wins over the same shared flag: with `-- --steps 2000` shared,
'chunked -- --steps 2400' runs 2400 steps while the dense seeds run 2000.

When every seed of a configuration and of the dense runs has finished, prints bench.seeds' paired
table of that configuration and writes OUT/<arm>_seeds.csv.

    python -m bench.sweep --sparsity '{"activations": "128:4:16", "causal": true}' --sparsity venom \\
        --seeds 0,1,2 --parallel 5 --time-limit 540 --out runs/sweep
"""

import argparse
import os
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tabulate import tabulate

from bench import checkpoint, seeds
from bench.data import Corpus
from bench.train import parse_args as train_args

RESERVED = ("--seed", "--runs", "--out", "--resume", "--time-limit", "--sparsity")  # the sweep sets these


def reserved_flags(argv: list[str]) -> list[str]:
    """The flags of ``argv`` that the sweep sets itself for every process (also as --flag=value)."""
    return [a for a in argv if a.split("=", 1)[0] in RESERVED]


def split_arm(text: str) -> tuple[str, list[str]]:
    """'CONFIG -- ARGS' -> (CONFIG, ARGS split as a shell would); 'CONFIG' -> (CONFIG, [])."""
    config, _, extra = text.partition(" -- ")
    return config.strip(), shlex.split(extra)


def arm_name(sparsity: str) -> str:
    """A folder-safe name of a --sparsity text: 'venom' -> 'venom', '{"activations": "128:4:16"}' ->
    'activations-128-4-16'."""
    return re.sub(r"[^a-z0-9]+", "-", sparsity.lower()).strip("-") or "arm"


@dataclass
class Job:
    arm: str
    seed: int
    folder: Path
    argv: list[str]  # bench.train's arguments, without --out, --resume and --time-limit
    rc: int | None = None  # exit status of this call's process (None: not run in this call)

    @property
    def finished(self) -> bool:
        return (self.folder / "summary.txt").is_file()

    def command(self, seconds: float) -> list[str]:
        resume = (self.folder / checkpoint.FILE).is_file()
        where = ["--resume" if resume else "--out", str(self.folder)]
        return [sys.executable, "-m", "bench.train", *self.argv, *where, "--time-limit", f"{max(seconds, 1e-3):.3f}"]

    def state(self) -> str:
        if self.finished:
            return "finished"
        if self.rc not in (None, 0):
            return f"failed (exit {self.rc}, see {self.folder / 'train.log'})"
        log = self.folder / "train.log"
        stops = [line for line in log.read_text().splitlines() if line.startswith("stopped ")] if log.is_file() else []
        return stops[-1].split(":")[0] if stops else "not started"


def jobs_of(args: argparse.Namespace) -> tuple[list[Job], dict[str, list[Path]]]:
    """Every (arm, seed) job, and each arm's folders by seed (the dense arm's included)."""
    jobs, folders = [], {}
    arms = []
    for text in args.sparsity:
        config, extra = split_arm(text)
        arms.append((arm_name(text), ["--runs", "sparse", "--sparsity", config], extra))
    if not args.dense and not args.dense_csv:
        arms.insert(0, ("dense", ["--runs", "dense"], []))
    for arm, argv, extra in arms:
        folders[arm] = []
        for s in args.seeds:
            # the arm's own arguments last: where both give a flag (--steps), the arm's wins
            argv_s = [*argv, "--seed", str(s), "--no-progress", *args.train, *extra]
            job = Job(arm, s, args.out / f"{arm}_s{s}", argv_s)
            jobs.append(job)
            folders[arm].append(job.folder)
    if args.dense:
        folders["dense"] = list(args.dense)
    return jobs, folders


def visible_device(i: int) -> str:
    """The i-th GPU this process sees, as CUDA_VISIBLE_DEVICES names it for a child (through the
    sweep's own CUDA_VISIBLE_DEVICES list where one is set)."""
    own = os.environ.get("CUDA_VISIBLE_DEVICES")
    return own.split(",")[i].strip() if own else str(i)


def least_busy(busy: list[int]) -> int:
    """The GPU with the fewest running processes (ties to the lower index)."""
    return min(range(len(busy)), key=lambda g: (busy[g], g))


def run(jobs: list[Job], parallel: int, seconds: float, min_seconds: float, poll: float = 2.0, gpus: int = 0) -> None:
    """Run the unfinished jobs, at most ``parallel`` at a time, within ``seconds`` from now. With
    ``gpus`` = N > 0 each process sees one GPU (CUDA_VISIBLE_DEVICES), the least busy of 0 .. N-1."""
    deadline = time.monotonic() + seconds
    queue = [j for j in jobs if not j.finished]
    running: list[tuple[Job, subprocess.Popen, int]] = []
    busy = [0] * gpus
    try:
        while queue or running:
            while queue and len(running) < parallel and deadline - time.monotonic() >= min_seconds:
                job = queue.pop(0)
                job.folder.mkdir(parents=True, exist_ok=True)
                gpu, env = -1, None
                if gpus:
                    gpu = least_busy(busy)
                    env = {**os.environ, "CUDA_VISIBLE_DEVICES": visible_device(gpu)}
                with open(job.folder / "train.log", "a") as log:
                    cmd = job.command(deadline - time.monotonic())
                    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
                    running.append((job, proc, gpu))  # at once: an exception from here on stops it too
                if gpus:
                    busy[gpu] += 1
                print(f"started {job.folder.name}" + (f" on GPU {gpu}" if gpus else ""), flush=True)
            if not running:
                break
            time.sleep(poll)
            for job, proc, gpu in list(running):
                if proc.poll() is not None:
                    job.rc = proc.returncode
                    running.remove((job, proc, gpu))
                    if gpus:
                        busy[gpu] -= 1
                    print(f"ended {job.folder.name}: {job.state()}", flush=True)
    except BaseException:  # an error or ^C: stop the processes started, not leave them running unwatched
        stop([proc for _, proc, _ in running])
        raise


def stop(procs: list[subprocess.Popen], grace: float = 5.0) -> None:
    """Terminate ``procs``, then kill those still running ``grace`` seconds later (at once if the
    wait itself is interrupted, by a second ^C)."""
    for proc in procs:
        proc.terminate()
    end = time.monotonic() + grace
    try:
        for proc in procs:
            try:
                proc.wait(timeout=max(end - time.monotonic(), 0))
            except subprocess.TimeoutExpired:
                pass
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    own, train = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    p = argparse.ArgumentParser(prog="python -m bench.sweep", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument(
        "--sparsity",
        action="append",
        required=True,
        help="a configuration (bench.train --sparsity), then optionally ' -- ' and the arm's own bench.train arguments",
    )
    p.add_argument("--seeds", default="0,1,2", help="comma-separated seeds")
    p.add_argument("--dense", nargs="+", type=Path, help="finished dense bench.train folders, one per seed")
    p.add_argument("--dense-csv", type=Path, help="a bench.seeds CSV with the seeds' dense finals, one row per seed")
    p.add_argument("--parallel", type=int, default=5, help="processes at a time (5 x 125M fit on one H100)")
    p.add_argument(
        "--gpus", type=int, default=0,
        help="N > 0: spread the processes over GPUs 0..N-1, each seeing one (CUDA_VISIBLE_DEVICES); 0: leave it",
    )  # fmt: skip
    p.add_argument("--time-limit", type=float, required=True, metavar="SECONDS", help="this call's wall time")
    p.add_argument("--min-seconds", type=float, default=120.0, help="start no process with less time left")
    p.add_argument("--out", type=Path, default=Path("runs/sweep"))
    args = p.parse_args(own)
    args.train = train
    try:
        args.seeds = [int(s) for s in args.seeds.split(",")]
    except ValueError:
        p.error(f"--seeds {args.seeds!r}: expected comma-separated ints")
    if args.dense and len(args.dense) != len(args.seeds):
        p.error(f"--dense: {len(args.dense)} folders for {len(args.seeds)} seeds (need one each)")
    if args.dense and args.dense_csv:
        p.error("--dense and --dense-csv: give one source of the dense runs")
    if args.dense_csv:
        try:
            rows = seeds.read(args.dense_csv)
        except (OSError, ValueError) as e:
            p.error(f"--dense-csv: {e}")
        if [seeds.seed_of(r.name) for r in rows] != args.seeds:
            p.error(f"--dense-csv {args.dense_csv}: rows of seeds {[seeds.seed_of(r.name) for r in rows]}, "
                    f"--seeds {args.seeds} (need the same, in order)")  # fmt: skip
    if args.parallel < 1 or not args.time_limit > 0:
        p.error(f"--parallel {args.parallel}, --time-limit {args.time_limit}: expected >= 1 and > 0")
    for where, argv_ in [("after --", train), *((f"--sparsity {t!r}", split_arm(t)[1]) for t in args.sparsity)]:
        if reserved := reserved_flags(argv_):
            p.error(f"{where}: {reserved}: the sweep sets {', '.join(RESERVED)} for each process itself")
    if args.gpus < 0:
        p.error(f"--gpus {args.gpus}: expected 0 (leave CUDA_VISIBLE_DEVICES) or the number of GPUs")
    if args.gpus and torch.cuda.device_count() < args.gpus:
        p.error(f"--gpus {args.gpus}: this machine shows {torch.cuda.device_count()} CUDA device(s)")
    if len({arm_name(s) for s in args.sparsity}) != len(args.sparsity):
        p.error(f"--sparsity {args.sparsity}: two arms with the same folder name")
    for s in args.sparsity:  # bench.train's own checks, before any process starts
        config, extra = split_arm(s)
        checked = train_args(["--sparsity", config, *train, *extra])
    Corpus.load(checked.data_dir, source=checked.corpus)  # built once, before the processes read it
    jobs, folders = jobs_of(args)
    run(jobs, args.parallel, args.time_limit, args.min_seconds, gpus=args.gpus)
    print(tabulate([[j.folder.name, j.state()] for j in jobs], headers=["run", "state"], tablefmt="github"))
    done = {arm: all((f / "summary.txt").is_file() for f in fs) for arm, fs in folders.items()}
    for arm, fs in folders.items():
        if arm == "dense" or not (done[arm] and done.get("dense", True)):
            continue
        if args.dense_csv:
            runs = seeds.paired_with_csv(fs, args.dense_csv)
        else:
            runs = [seeds.load(d, s) for d, s in zip(folders["dense"], fs, strict=True)]
        print(f"\n{arm}:\n{seeds.table(runs)}")
        if not args.dense_csv and (note := seeds.across_devices(list(zip(folders["dense"], fs, strict=True)))):
            print(note)
        seeds.write(args.out / f"{arm}_seeds.csv", runs)
    return 1 if any(j.rc not in (None, 0) for j in jobs) else 0


if __name__ == "__main__":
    sys.exit(main())
