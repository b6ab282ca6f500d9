"""python -m bench.multi_gpu: one GPU, DDP and FSDP2 in one call, one table (bench.e2e three times).

Runs, in order, each as its own process on the same sizes and configurations:
  one    python -m bench.e2e ... --out OUT/one                       (the first GPU alone)
  ddp    torchrun --nproc-per-node N -m bench.e2e --distributed ddp  --baseline OUT/one/e2e.csv
  fsdp   torchrun --nproc-per-node N -m bench.e2e --distributed fsdp --baseline OUT/one/e2e.csv
then writes OUT/multi_gpu.csv and OUT/summary.txt with one row per engine, size and configuration:
  tokens/s per GPU and its ratio to one GPU (the same configuration); the speedup over dense under
  that engine, and its ratio to the one-GPU speedup (1.0: the sparse gain intact); peak memory; the
  host ms and GPU ms per step; the collectives' kernel ms per step (rank 0's NCCL kernels in the
  profiled steps), split into transfer (per collective, its shortest kernel over the ranks: the
  last rank to arrive waits for no one) and rank 0's wait for the other ranks.
Arguments after ``--`` go to every bench.e2e run (e.g. -- --steps 10 --profile-steps 2). On a
machine without CUDA the runs use the CPU and gloo (for testing the driver).

    python -m bench.multi_gpu --gpus 2 --sizes 1.3b --configs dense default --out runs/mg
"""

import argparse
import csv
import os
import socket
import subprocess
import sys
from pathlib import Path

import torch
from tabulate import tabulate

from bench.env import write_csv

ENGINES = ("one", "ddp", "fsdp")
ROOT = Path(__file__).resolve().parent.parent


def free_port() -> str:
    """A TCP port on 127.0.0.1 free now, for torchrun's rendezvous."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def commands(gpus: int, e2e_args: list[str], out: Path) -> dict[str, tuple[list[str], dict[str, str]]]:
    """engine -> (its command, its environment changes): the one-GPU run on the first device, then
    torchrun over ``gpus`` processes for DDP and FSDP2 with the one-GPU CSV as their baseline."""
    e2e = [sys.executable, "-m", "bench.e2e", *e2e_args]
    runs = {
        "one": ([*e2e, "--out", str(out / "one")], {"CUDA_VISIBLE_DEVICES": "0"} if torch.cuda.is_available() else {})
    }
    for mode in ("ddp", "fsdp"):
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(gpus)]
        torchrun += ["--master-port", free_port(), "-m", "bench.e2e", *e2e_args, "--distributed", mode]
        runs[mode] = ([*torchrun, "--baseline", str(out / "one" / "e2e.csv"), "--out", str(out / mode)], {})
    return runs


def _num(value: str) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def merge(out: Path) -> list[dict]:
    """One row per engine, size and configuration from OUT/{one,ddp,fsdp}/e2e.csv (engines that did
    not finish are left out), with the sparse speedup of each engine against the one-GPU speedup."""
    rows = []
    for engine in ENGINES:
        path = out / engine / "e2e.csv"
        if not path.is_file():
            continue
        for r in csv.DictReader(open(path)):
            rows.append(
                {
                    "engine": engine,
                    "size": r["size"],
                    "config": r["config"],
                    "gpus": int(r.get("gpus") or 1),
                    "tokens_per_s_per_gpu": _num(r.get("tokens_per_s_per_gpu") or r["tokens_per_s"]),
                    "vs_one_gpu": 1.0 if engine == "one" else _num(r.get("vs_one_gpu", "")),
                    "speedup": _num(r.get("speedup", "")),
                    "step_ms": _num(r.get("step_ms", "")),
                    "host_ms": _num(r.get("host_ms", "")),
                    "gpu_ms": _num(r.get("GPU ms", "")),
                    "collectives_ms": _num(r.get("collectives ms", "")),
                    "transfer_ms": _num(r.get("collectives transfer ms", "")),
                    "wait_ms": _num(r.get("collectives wait ms", "")),
                    "peak_mem_GiB": _num(r.get("peak_mem_GiB", "")),
                }
            )
    one = {(r["size"], r["config"]): r["speedup"] for r in rows if r["engine"] == "one"}
    for r in rows:
        base = one.get((r["size"], r["config"]))
        r["speedup_vs_one_gpu_speedup"] = round(r["speedup"] / base, 3) if r["speedup"] and base else None
    return rows


def table(rows: list[dict]) -> str:
    keys = ["engine", "size", "config", "gpus", "tokens_per_s_per_gpu", "vs_one_gpu", "speedup"]
    keys += ["speedup_vs_one_gpu_speedup", "step_ms", "host_ms", "gpu_ms"]
    keys += ["collectives_ms", "transfer_ms", "wait_ms", "peak_mem_GiB"]
    head = ["engine", "size", "config", "GPUs", "tokens/s\nper GPU", "vs one\nGPU", "speedup\nvs dense"]
    head += ["speedup vs\none GPU's", "step ms", "host ms", "GPU ms"]
    head += ["collectives\nms", "transfer\nms", "wait\nms", "peak GiB"]
    body = [["" if r[k] is None else r[k] for k in keys] for r in rows]
    return tabulate(body, headers=head, tablefmt="github", disable_numparse=True)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ours, e2e_args = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    p = argparse.ArgumentParser(prog="python -m bench.multi_gpu", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--gpus", type=int, default=max(torch.cuda.device_count(), 2), help="processes of DDP and FSDP2")
    p.add_argument("--sizes", default=None, help="bench.e2e --sizes (default: bench.e2e's)")
    p.add_argument("--configs", nargs="+", default=["dense", "default"], help="bench.e2e --configs")
    p.add_argument("--out", type=Path, default=Path("runs/multi_gpu"))
    p.add_argument("--timeout", type=float, default=None, help="seconds each of the three runs may take")
    p.add_argument("--resume", action="store_true", help="keep an engine whose OUT/ENGINE/e2e.csv exists (a "
                   "finished run of an earlier call with the same sizes and configurations) instead of running it "
                   "again")  # fmt: skip
    args = p.parse_args(ours)
    if args.gpus < 2:
        p.error(f"--gpus {args.gpus}: expected at least 2 (DDP and FSDP2 across processes)")
    if "dense" not in args.configs:
        p.error(f"--configs {args.configs}: include 'dense' (each engine's speedup is against its dense row)")
    e2e_args = [*e2e_args, "--configs", *args.configs] + (["--sizes", args.sizes] if args.sizes else [])
    args.out.mkdir(parents=True, exist_ok=True)
    failed = []
    for engine, (cmd, env) in commands(args.gpus, e2e_args, args.out).items():
        kept = args.out / engine / "e2e.csv"
        if args.resume and kept.is_file():
            rows = list(csv.DictReader(open(kept)))
            have = ({r["size"] for r in rows}, {r["config"] for r in rows})
            want = (set(args.sizes.split(",")) if args.sizes else have[0], set(args.configs))
            if have != want:
                p.error(f"--resume: {kept} holds sizes {sorted(have[0])} and configs {sorted(have[1])}, "
                        f"this call asks for {sorted(want[0])} and {sorted(want[1])}: remove it or pick another "
                        "--out")  # fmt: skip
            print(f"{engine}: kept {kept} (--resume)", flush=True)
            continue
        (args.out / engine).mkdir(exist_ok=True)
        log = args.out / engine / "run.log"
        print(f"{engine}: {' '.join(cmd)}", flush=True)
        with open(log, "w") as f:
            done = subprocess.run(cmd, cwd=ROOT, env={**os.environ, **env}, stdout=f, stderr=subprocess.STDOUT,
                                  timeout=args.timeout)  # fmt: skip
        if done.returncode:
            failed.append(engine)
            print(f"{engine}: exit {done.returncode}, see {log}", flush=True)
            if engine == "one":
                return 1  # the baseline of the other two
    rows = merge(args.out)
    write_csv(args.out / "multi_gpu.csv", rows)
    text = table(rows)
    (args.out / "summary.txt").write_text(text + "\n" + (f"failed: {', '.join(failed)}\n" if failed else ""))
    print(f"\n{text}\n\nwrote {args.out / 'multi_gpu.csv'}, {args.out / 'summary.txt'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
