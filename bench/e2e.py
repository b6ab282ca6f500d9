"""python -m bench.e2e: whole training steps, dense torch.compile vs backend="sparse", per model size.

For each model size and each configuration, in one process: the project's GPT (bench/model.py) at
sequence length 2048 and 8 x 2048 = 16k tokens per step, bf16 autocast, fused AdamW, gradient
clipping, on the main job's corpus. The sparse configurations run in the sparse phase throughout.
`default` is exactly what backend="sparse" with no options runs (small_ffn='graphs',
sparse_compile/passes/size_rule.py): CUDA FFNs that pay only with CUDA graphs run sparse with their
graph under CUDA graphs, smaller ones stay dense, and its report says so.
Every other configuration runs every site sparse at every size, without CUDA graphs unless
--compile-mode has them, to measure its pattern there: small_ffn='sparse' unless its options say
otherwise. Sites with fitted state (routed tokens, permuted units) are fitted once after the warm-up
steps, as bench.train fits them before its first sparse step (a probe forward, recluster(), one more
untimed step); their `sites` cell then ends "; N fitted". They are then refitted once more, timed
(`refit ms`), and take one more untimed step, so the timed steps run on the second fit.
Per configuration:
  tokens/s     tokens per step over the median wall time of the timed steps (after --warmup steps)
  speedup      over the dense row of the same size in the same run
  peak memory  torch.cuda.max_memory_allocated over all steps
  host ms      median time for the host to enqueue a timed step (until train_step returns, before
               the step's synchronize): equal to step ms where the step is host-bound
  cpu ms       median CPU time of the process per timed step, every thread (the autograd engine runs
               the backward on its own thread); gc ms: Python's garbage collector, per timed step
  kernel fn ms on CUDA, the host ms per timed step inside the sparse path's kernel functions (kernels/
               ffn_gather.py's forward and backward: launches, allocations, checks), the rest of the
               sparse ops' host time being the custom-op layer and the op's own Python
  refit ms     with fitted sites, the second fit: the probe forward and recluster() (a routed site's
               router alone, its groups kept), synchronized before and after; what bench.train's
               --recluster-every N (its default --refit-routes router) adds once every N steps
  probe ms     a fixed pure-Python workload timed before the steps (median of 5): how fast this
               process's CPU runs Python then, beside host ms (a slower CPU or more host work)
  dense phase  with --dense-steps, steps in the dense phase after the timed ones: their median ms,
               and the peak memory allocated and reserved over them (a sparse phase's CUDA graphs
               keep their memory pool reserved)
  compile s    wall time of the warm-up steps minus as many median steps (compiles, autotuning,
               the sparse backend's per-shape kernel choices); shorter when the gather kernels'
               tuning for these shapes is already on disk (the "tuned kernels" field of the CSV)
  GPU ms/step  a torch.profiler trace of --profile-steps steps, grouped by bench/step_profile.py
               (FFN GEMMs, other GEMMs, the sparse path's own kernels, attention, optimizer, NCCL
               collectives, other); under torchrun the collectives' time split into transfer and
               wait (every rank's trace: per collective, transfer is its shortest kernel over the
               ranks, rank 0's wait the rest of its own)
  host side    from the same trace: kernel launches per step, and the CPU ms per step spent inside
               sparse_compile:: ops (profiled, so longer than unprofiled; for comparing configurations);
               host.csv: the CPU-side calls with the most self time per step, inside those ops and
               elsewhere (bench/step_profile.host_calls)
  --host-profile  a further --profile-steps steps under cProfile, with CUDA's sync debug mode
               warning on every synchronizing call: host_profile.txt (the syncs, the functions with
               the most own time)
Under CUDA graphs (--compile-mode reduce-overhead, or a configuration whose report says small_ffn
turned them on) the kernels replay without their launching ops: only attention, optimizer and the
GPU total are grouped (the other group columns stay empty).
Writes e2e.csv (one row per configuration), kernels.csv (the heaviest kernels of each) and
summary.txt (header, table, the sparse configurations' site reports) to --out.

Many GPUs: torchrun --nproc-per-node N -m bench.e2e --distributed ddp|fsdp (bench/distributed.py:
DDP, or FSDP2 with each block compiled in place and sharded in units of --fsdp-unit blocks).
--batch-size is per GPU; every rank runs the same steps, rank 0 times them and writes. tokens/s
counts all GPUs, "per GPU" divides by N, and --baseline E2E_CSV (a one-GPU run of the same sizes
and configurations) adds each row's per-GPU
throughput against one GPU.
"""

import argparse
import contextlib
import cProfile
import csv
import dataclasses
import gc
import io
import math
import pstats
import statistics
import sys
import tempfile
import time
import warnings
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import torch
from tabulate import tabulate

import sparse_compile
from bench import distributed
from bench.data import Batches, Corpus
from bench.env import environment, write_csv
from bench.model import GPT, SIZES, train_step
from bench.step_profile import GROUPS, breakdown, collective_kernels, host, host_calls, split_collectives
from sparse_compile.config import BackendOptions, options_from_text

# groups that need the launching op: under CUDA graphs their kernels fall in GRAPH_GROUP
GRAPH_UNGROUPED = ("FFN GEMMs", "other GEMMs", "sparse kernels", "other")
GRAPH_GROUP = "CUDA graph (not grouped)"
GPU_CONFIGS = ["dense", "default", "activation24", "weight24", '{"activations": "128:2:16"}']
DATA_BATCHES = 4  # distinct batches cycled through the steps


def cpu_probe_ms(repeats: int = 5) -> float:
    """Median ms of a fixed pure-Python workload (dict and list churn): how fast this process's CPU
    runs Python just before the timed steps (it varies between processes of one machine)."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        d: dict[int, list[int]] = {}
        for i in range(40_000):
            d[i % 997] = [i, i + 1]
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


@contextlib.contextmanager
def kernel_fn_timer(gpu: bool):
    """Yields a one-element list that accumulates the wall time spent inside ffn_gather's forward and
    backward kernel functions (the module attributes the ops look up per call) while active."""
    spent = [0.0]
    if not gpu:
        yield spent
        return
    from sparse_compile.kernels import ffn_gather

    names = ("sqrelu_ffn_forward_gather", "sqrelu_ffn_backward_gather")
    saved = {n: getattr(ffn_gather, n) for n in names}

    def timed(fn: Callable) -> Callable:
        def call(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[0] += time.perf_counter() - t0

        return call

    for n, fn in saved.items():
        setattr(ffn_gather, n, timed(fn))
    try:
        yield spent
    finally:
        for n, fn in saved.items():
            setattr(ffn_gather, n, fn)


class GcTimer:
    """Wall time spent in Python's garbage collector while active (gc.callbacks)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._t0 = 0.0

    def _cb(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._t0

    def __enter__(self) -> "GcTimer":
        gc.callbacks.append(self._cb)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._cb)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench.e2e", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--device", default="auto", help="'auto' (cuda if available), 'cpu' or 'cuda'")
    p.add_argument(
        "--sizes", help=f"comma-separated sizes of bench/model.py {sorted(SIZES)} (default: 350m,1.3b; CPU tiny)"
    )
    p.add_argument(
        "--configs",
        nargs="+",
        help="'dense', 'default' (backend='sparse' with no options), a preset name, or JSON options "
        f"(default: {' '.join(GPU_CONFIGS)})",
    )
    p.add_argument("--batch-size", type=int, help="sequences per step (default: 8; CPU 4)")
    p.add_argument("--seq-len", type=int, help="tokens per sequence (default: 2048; CPU 128)")
    p.add_argument("--steps", type=int, help="timed steps after the warm-up (default: 20; CPU 3)")
    p.add_argument("--warmup", type=int, default=3, help="untimed first steps (compile, autotuning)")
    p.add_argument("--profile-steps", type=int, default=3, help="steps in the profiler trace (CUDA; 0: none)")
    p.add_argument("--host-profile", action="store_true", help="cProfile --profile-steps more steps: host_profile.txt")
    p.add_argument(
        "--dense-steps", type=int, default=0,
        help="then this many steps in the dense phase (the first 2 untimed): dense-phase ms and peak memory",
    )  # fmt: skip
    p.add_argument("--top", type=int, default=12, help="heaviest kernels per configuration in kernels.csv")
    p.add_argument("--out", default="runs/e2e", help="folder for e2e.csv, kernels.csv and summary.txt")
    p.add_argument("--data-dir", help="cache folder of the corpus (default: ~/.cache/sparse_compile)")
    p.add_argument("--distributed", choices=distributed.MODES, default="none", help="ddp or fsdp, under torchrun")
    p.add_argument("--baseline", type=Path, help="e2e.csv of a one-GPU run: per-GPU throughput against it")
    distributed.add_fsdp_args(p)
    p.add_argument(
        "--compile-mode",
        choices=("default", "reduce-overhead", "max-autotune-no-cudagraphs"),
        default="default",
        help="torch.compile mode of every configuration (reduce-overhead: CUDA graphs, one launch per graph)",
    )
    args = p.parse_args(argv)
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.device not in ("cpu", "cuda") or (args.device == "cuda" and not torch.cuda.is_available()):
        p.error(f"--device {args.device!r}: expected auto, cpu, or cuda with a CUDA device present")
    gpu = args.device == "cuda"
    args.sizes = [s.strip() for s in (args.sizes or ("350m,1.3b" if gpu else "tiny")).split(",") if s.strip()]
    bad = [s for s in args.sizes if s not in SIZES]
    if bad:
        p.error(f"--sizes: {bad} not among {sorted(SIZES)}")
    args.fsdp = distributed.fsdp_options(args, p)
    args.configs = args.configs or (GPU_CONFIGS if gpu else ["dense", "default"])
    for label in args.configs:
        if label != "dense":
            try:
                BackendOptions.parse(backend_options(label))
            except ValueError as e:
                p.error(f"--configs {label!r}: {e}")
    args.batch_size = args.batch_size or (8 if gpu else 4)
    args.seq_len = args.seq_len or (2048 if gpu else 128)
    args.steps = args.steps or (20 if gpu else 3)
    for name in ("batch_size", "seq_len", "steps", "warmup"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} {getattr(args, name)}: expected an int >= 1")
    if args.dense_steps and args.dense_steps < 3:
        p.error(f"--dense-steps {args.dense_steps}: expected 0 or an int >= 3 (2 untimed, then timed)")
    return args


def backend_options(label: str) -> dict:
    """backend='sparse' options of a configuration: none for `default` (the user's default, size rule
    included); for any other, its options with every site sparse (small_ffn='sparse' unless they say)."""
    return {} if label == "default" else {"small_ffn": "sparse"} | options_from_text(label)


def _sites(reports: list) -> str:
    """'24/24 sparse: triton gather' from the reports of one configuration's compiles."""
    rows = [s for rep in reports for s in rep.sites]
    if not rows:
        return "no FFN site found"
    sparse = [s for s in rows if s.record.sparse]
    kernels = sorted({r.kernel for r in sparse})
    return f"{len(sparse)}/{len(rows)} sparse" + (f": {', '.join(kernels)}" if kernels else "")


@dataclasses.dataclass
class Result:
    """One configuration at one size (rank 0's view)."""

    row: dict  # e2e.csv
    kernels: list[dict]  # kernels.csv: the heaviest GPU kernels
    host_calls: list[dict]  # host.csv: the CPU-side calls with the most self time
    host_profile: str  # --host-profile's text
    reports: str  # the site reports


def has_fitted_state(label: str) -> bool:
    """Whether configuration ``label`` has sites fitted by recluster(): routed tokens or permuted units."""
    if label == "dense":
        return False
    config = BackendOptions.parse(backend_options(label)).config
    return config.routes is not None or config.permute


def fit_sites(
    compiled: Callable, batch: tuple[torch.Tensor, torch.Tensor], autocast: Callable, sync: Callable, step: Callable
) -> tuple[list[str], float | None]:
    """Fit the sites that hold fitted state (routed tokens' groups and router, permuted units) once, as
    bench.train does before its first sparse step: a probe forward, then recluster() (on every rank under
    torch.distributed), then one untimed step on the fitted state. Then refit them once more, timed (a
    later refit: its probe graph compiled, a routed site's groups kept), and take one more untimed step.
    Returns (the refitted sites, that refit's seconds); ([], None) where there is nothing to fit (no
    step runs). Unfitted, a routed site routes by its initial groups, not the padding and order a fit gives."""

    def refit() -> list[str]:
        with sparse_compile.probe_units(), torch.no_grad(), autocast():
            compiled(*batch)
        return sparse_compile.recluster()

    sites = refit()
    if not sites:
        return sites, None
    step()
    sync()
    t0 = time.perf_counter()
    refit()
    sync()
    seconds = time.perf_counter() - t0
    step()
    sync()
    return sites, seconds


def run_one(
    size: str, label: str, args: argparse.Namespace, corpus: Corpus, d: distributed.Dist | None = None
) -> Result:
    d = d or distributed.Dist()
    device = torch.device(args.device, d.local_rank) if args.device == "cuda" else torch.device(args.device)
    gpu = device.type == "cuda"
    torch._dynamo.reset()
    sparse_compile.reset_units()  # no site state (permutations, routes) carried over from another size or config
    cfg = SIZES[size]
    cfg = dataclasses.replace(cfg, block_size=max(cfg.block_size, args.seq_len))
    torch.manual_seed(0)
    model = GPT(cfg).to(device)
    n_reports = len(sparse_compile.compile_reports())
    mode = None if args.compile_mode == "default" else args.compile_mode
    if label == "dense":
        compiled = distributed.compile_model(model, d, args.fsdp, mode=mode)
    else:
        options = backend_options(label) | ({"mode": mode} if mode else {})
        compiled = distributed.compile_model(model, d, args.fsdp, backend="sparse", options=options)
    opt = model.adamw(lr=1e-4, weight_decay=0.1, fused=gpu)
    batches = Batches(corpus.train, args.batch_size, args.seq_len, seed=1, rank=d.rank, world=d.world)
    data = [batches.next(device) for _ in range(DATA_BATCHES)]
    sparse_compile.set_phase("sparse")
    autocast = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if gpu else contextlib.nullcontext

    def sync() -> None:
        if gpu:
            torch.cuda.synchronize()

    def step(i: int) -> torch.Tensor:
        return train_step(compiled, model, opt, *data[i % DATA_BATCHES], autocast)

    if gpu:
        torch.cuda.reset_peak_memory_stats(device)
    probe = cpu_probe_ms()
    times, host_times, cpu_times = [], [], []

    def timed_step(i: int) -> torch.Tensor:
        sync()
        t0, c0 = time.perf_counter(), time.process_time()
        loss = step(i)
        host_times.append(time.perf_counter() - t0)
        cpu_times.append(time.process_time() - c0)
        sync()
        times.append(time.perf_counter() - t0)
        return loss

    for i in range(args.warmup):
        timed_step(i)
    before_fit = len(sparse_compile.compile_reports())
    fitted, refit_s = (
        fit_sites(compiled, data[0], autocast, sync, lambda: step(0)) if has_fitted_state(label) else ([], None)
    )
    probe_reports = range(before_fit, len(sparse_compile.compile_reports()))  # the probe's no-grad graph
    with GcTimer() as gc_timer, kernel_fn_timer(gpu) as kernel_fn:
        for i in range(args.warmup, args.warmup + args.steps):
            loss = timed_step(i)
    median = statistics.median(times[args.warmup :])
    tokens = args.batch_size * args.seq_len * d.world
    row = {
        "size": size,
        "params_M": round(model.num_params() / 1e6, 1),  # FSDP2's DTensor shards report their global numel
        "config": label,
        "compile_mode": args.compile_mode,
        "distributed": d.mode,
        "gpus": d.world,
        "tokens_per_step": tokens,
        "step_ms": round(median * 1e3, 2),
        "host_ms": round(statistics.median(host_times[args.warmup :]) * 1e3, 2),
        "cpu_ms": round(statistics.median(cpu_times[args.warmup :]) * 1e3, 2),
        "gc_ms": round(gc_timer.seconds * 1e3 / args.steps, 2),
        "kernel_fn_ms": round(kernel_fn[0] * 1e3 / args.steps, 2) if gpu else "",
        "probe_ms": round(probe, 2),
        "refit_ms": "" if refit_s is None else round(refit_s * 1e3, 1),
        "tokens_per_s": round(tokens / median),
        "tokens_per_s_per_gpu": round(tokens / median / d.world),
        "vs_one_gpu": "",
        "speedup": "",
        "peak_mem_GiB": round(torch.cuda.max_memory_allocated(device) / 2**30, 2) if gpu else "",
        "mem_vs_dense": "",
        "compile_s": round(sum(times[: args.warmup]) - args.warmup * median, 1),
        "last_loss": round(loss.item(), 4),
    }
    top: list[dict] = []
    calls: list[dict] = []
    if gpu and args.profile_steps:
        acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        with tempfile.TemporaryDirectory() as tmp:
            trace = Path(tmp) / "trace.json"
            with torch.profiler.profile(activities=acts, record_shapes=True) as prof:
                for i in range(args.profile_steps):
                    step(i)
                sync()
            if d.main or d.world > 1:
                prof.export_chrome_trace(str(trace))
            if d.world > 1:  # every rank's NCCL kernels: transfer and wait (step_profile.split_collectives)
                per_rank: list = [None] * d.world
                torch.distributed.all_gather_object(per_rank, collective_kernels(trace))
                try:
                    row.update({k: round(v, 2) for k, v in split_collectives(per_rank, args.profile_steps).items()})
                except ValueError as e:  # the row's other figures stand; its split stays blank
                    warnings.warn(f"{label}: no transfer/wait split: {e}", stacklevel=1)
            if d.main:  # rank 0's trace stands for every rank (they run the same steps)
                groups, kernels = breakdown(trace, hidden=4 * cfg.n_embd, steps=args.profile_steps)
                row.update({f"{g} ms": round(ms, 2) for g, ms in groups.items()})
                row["GPU ms"] = round(sum(groups.values()), 2)
                row.update({k: round(v, 2) for k, v in host(trace, args.profile_steps).items()})
                graphs = any(r.cuda_graphs for r in sparse_compile.compile_reports()[n_reports:])
                if args.compile_mode == "reduce-overhead" or graphs:  # the mode's graphs, or small_ffn's
                    kernels = ungroup_graphs(row, kernels)
                top = [
                    {"size": size, "config": label, "group": g, "kernel": k[:120], "ms_per_step": round(ms, 3)}
                    for g, k, ms in kernels[: args.top]
                ]
                calls = [{"size": size, "config": label, **c} for c in host_calls(trace, args.profile_steps, args.top)]
    # every rank runs the profiled steps (their collectives need all ranks); rank 0 keeps the text
    profile = host_profile(step, args.profile_steps, sync, gpu) if args.host_profile else ""
    profile = profile if d.main else ""
    if args.dense_steps:
        row.update(dense_phase_steps(step, args.dense_steps, sync, device))
    reports = [r for i, r in enumerate(sparse_compile.compile_reports()) if i >= n_reports and i not in probe_reports]
    row["sites"] = "dense" if label == "dense" else _sites(reports) + (f"; {len(fitted)} fitted" if fitted else "")
    return Result(row, top, calls, profile, "\n".join(str(r) for r in reports if r.sites))


def dense_phase_steps(
    step: Callable[[int], object], n: int, sync: Callable[[], None], device: torch.device
) -> dict[str, float | str]:
    """``n`` steps in the dense phase after the sparse ones (the first 2 untimed: the dense variant's
    backward compiles on its first call): their median ms, and the peak memory allocated and
    reserved over them (what a sparse phase leaves held, e.g. its CUDA graphs' pool)."""
    gpu = device.type == "cuda"
    if gpu:
        torch.cuda.reset_peak_memory_stats(device)
    times = []
    with sparse_compile.dense_phase():
        for i in range(n):
            sync()
            t0 = time.perf_counter()
            step(i)
            sync()
            times.append(time.perf_counter() - t0)
    return {
        "dense_phase_ms": round(statistics.median(times[2:]) * 1e3, 2),
        "dense_phase_peak_GiB": round(torch.cuda.max_memory_allocated(device) / 2**30, 2) if gpu else "",
        "dense_phase_reserved_GiB": round(torch.cuda.max_memory_reserved(device) / 2**30, 2) if gpu else "",
    }


def ungroup_graphs(row: dict, kernels: list[tuple[str, str, float]]) -> list[tuple[str, str, float]]:
    """Under CUDA graphs kernels replay without their launching ops, so the groups that need one
    (GRAPH_UNGROUPED) cannot be told apart: blank them in ``row``, put those kernels in GRAPH_GROUP."""
    row.update({f"{g} ms": "" for g in GRAPH_UNGROUPED})
    return [(GRAPH_GROUP if g in GRAPH_UNGROUPED else g, k, ms) for g, k, ms in kernels]


def host_profile(step: Callable[[int], object], steps: int, sync: Callable[[], None], gpu: bool) -> str:
    """``steps`` steps under cProfile with CUDA's sync debug mode on: the synchronizing calls (first
    line of each warning, with its count), the wall ms per step, and the 25 functions with the most
    own time."""
    prof = cProfile.Profile()
    sync()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if gpu:
            torch.cuda.set_sync_debug_mode("warn")
        t0 = time.perf_counter()
        prof.enable()
        try:
            for i in range(steps):
                step(i)
        finally:
            prof.disable()
            if gpu:
                torch.cuda.set_sync_debug_mode("default")
        sync()
        wall = (time.perf_counter() - t0) / max(steps, 1)
    syncs = Counter(str(w.message).splitlines()[0] for w in caught if "synchroniz" in str(w.message).lower())
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(25)
    lines = [f"{steps} steps, {wall * 1e3:.2f} ms per step under cProfile"]
    lines.append(f"synchronizing calls: {sum(syncs.values())}")
    lines += [f"  {n} x {msg}" for msg, n in syncs.most_common()]
    return "\n".join(lines) + "\n" + buf.getvalue()


def _fill_baseline(rows: list[dict], path: Path) -> None:
    """vs_one_gpu: each row's tokens/s per GPU over the same size and configuration in ``path``."""
    with open(path) as f:
        one = {(r["size"], r["config"]): float(r["tokens_per_s"]) for r in csv.DictReader(f)}
    for r in rows:
        base = one.get((r["size"], r["config"]))
        if base:
            r["vs_one_gpu"] = round(r["tokens_per_s_per_gpu"] / base, 3)


def _fill_ratios(rows: list[dict]) -> None:
    """Speedup and memory ratio of every row against the dense row of its size."""
    dense = {r["size"]: r for r in rows if r["config"] == "dense"}
    for r in rows:
        base = dense.get(r["size"])
        if base is None:
            continue
        r["speedup"] = round(r["tokens_per_s"] / base["tokens_per_s"], 3)
        if base["peak_mem_GiB"] != "":
            r["mem_vs_dense"] = round(r["peak_mem_GiB"] / base["peak_mem_GiB"], 3)


def table(rows: list[dict]) -> str:
    head = ["size", "config", "tokens/s", "speedup", "step ms", "host ms", "cpu ms", "kernel fn ms", "gc ms"]
    head += ["probe ms", "peak GiB", "vs dense", "compile s"]
    keys = ["size", "config", "tokens_per_s", "speedup", "step_ms", "host_ms", "cpu_ms", "kernel_fn_ms", "gc_ms"]
    keys += ["probe_ms", "peak_mem_GiB", "mem_vs_dense", "compile_s"]
    if any(r.get("gpus", 1) > 1 for r in rows):
        head[3:3] = ["GPUs", "per GPU", "vs one GPU"]
        keys[3:3] = ["gpus", "tokens_per_s_per_gpu", "vs_one_gpu"]
    if any(r.get("refit_ms", "") != "" for r in rows):
        head.append("refit ms")
        keys.append("refit_ms")
    if any("dense_phase_ms" in r for r in rows):
        head += ["dense phase\nms", "dense phase\npeak GiB", "dense phase\nreserved GiB"]
        keys += ["dense_phase_ms", "dense_phase_peak_GiB", "dense_phase_reserved_GiB"]
    profiled = any("GPU ms" in r for r in rows)
    if profiled:
        head += [g.replace(" ", "\n", 1) for g in GROUPS] + ["GPU ms", "launches", "sparse op\nhost ms"]
        keys += [f"{g} ms" for g in GROUPS] + ["GPU ms", "launches", "sparse op host ms"]
    body = [[r.get(k, "") for k in keys] for r in rows]
    speedup = keys.index("speedup")
    for line in body:
        line[2] = f"{line[2]:,}"
        if "tokens_per_s_per_gpu" in keys:
            line[4] = f"{line[4]:,}"
        line[speedup] = f"{line[speedup]:.3f}x" if line[speedup] != "" else ""
    return tabulate(body, headers=head, tablefmt="github", disable_numparse=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    d = distributed.setup(args.distributed, args.device)
    out = Path(args.out)
    env = environment(torch.device(args.device), "python -m bench.e2e", argv)
    if d.main:
        out.mkdir(parents=True, exist_ok=True)
        corpus = Corpus.load(args.data_dir)  # built once, before the other ranks read it
    if d.world > 1:
        torch.distributed.barrier()
    if not d.main:
        corpus = Corpus.load(args.data_dir)
    header = (
        f"{args.batch_size} x {args.seq_len} tokens per step"
        + (f" per GPU x {d.world} GPUs ({d.mode})" if d.world > 1 else "")
        + (f", FSDP2 {args.fsdp.describe(args.device)}" if d.mode == "fsdp" else "")
        + f", bf16 autocast on CUDA, fused AdamW on CUDA, {args.steps} timed steps after {args.warmup}"
        + (f", torch.compile mode {args.compile_mode}" if args.compile_mode != "default" else "")
        + "\n"
        + "\n".join(f"{k}: {v}" for k, v in env.items())
    )
    if d.main:
        print(header, flush=True)
    rows, tops, calls, profiles, reports = [], [], [], [], []
    for size in args.sizes:
        for label in args.configs:
            res = run_one(size, label, args, corpus, d)
            gc.collect()  # the last configuration's model and optimizer state, before the next one's
            if args.device == "cuda":
                torch.cuda.empty_cache()
            row = res.row
            rows.append(row)
            tops += res.kernels
            calls += res.host_calls
            profiles.append(f"== {size}, {label}\n{res.host_profile}" if res.host_profile else "")
            reports.append(f"{size}, {label}:\n{res.reports}" if res.reports else "")
            if d.main:
                print(
                    f"{size} {label}: {row['tokens_per_s']:,} tokens/s, step {row['step_ms']} ms, "
                    f"compile {row['compile_s']} s, {row['sites']}",
                    flush=True,
                )
    ok = all(math.isfinite(r["last_loss"]) for r in rows)
    if not d.main:
        distributed.teardown(d)
        return 0 if ok else 1
    _fill_ratios(rows)
    if args.baseline:
        _fill_baseline(rows, args.baseline)
    write_csv(out / "e2e.csv", [{**r, **env} for r in rows])
    written = [out / "e2e.csv", out / "summary.txt"]
    for name, data in (("kernels.csv", tops), ("host.csv", calls)):
        if data:
            write_csv(out / name, data)
            written.append(out / name)
    if any(profiles):
        (out / "host_profile.txt").write_text(f"{header}\n\n" + "\n\n".join(p for p in profiles if p))
        written.append(out / "host_profile.txt")
    text = table(rows)
    (out / "summary.txt").write_text(f"{header}\n\n{text}\n\n" + "\n\n".join(r for r in reports if r) + "\n")
    print(f"\n{text}\n\nwrote " + ", ".join(str(w) for w in written))
    distributed.teardown(d)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
