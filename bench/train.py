"""python -m bench.train: train the same GPT dense and sparse, same seed and data order; compare.

Dense: torch.compile(model). Sparse: torch.compile(model, backend="sparse") with a dense warm-up,
a sparse phase and a dense recovery phase (PhaseSchedule); its FFNs run sparse at 125M: by the
backend's default size rule where it runs them all sparse (small_ffn='graphs': with the main job's
defaults on CUDA, under CUDA graphs), else forced (small_ffn='sparse', without CUDA graphs; unless
--sparsity says).
Writes log.csv (every logged point), loss.png (both loss curves, phase boundaries) and summary.txt
(the comparison table) to --out.
With --distributed ddp|fsdp under torchrun, the ranks split each global batch (--batch-size per
rank: N ranks at b see what one process sees at N*b), phases flip on every rank at the same step,
and rank 0 writes the outputs; tokens/s and losses count all ranks.
--save-every N / --stop-at STEP / --time-limit SECONDS write OUT/checkpoint.pt (bench/checkpoint.py);
--resume OUT goes on from it, step for step as if never stopped, so a long run can be split over
several calls of bounded length; a stopped call leaves the points logged so far in
OUT/log_partial.csv (log.csv is written when the run finishes).
"""

import argparse
import contextlib
import dataclasses
import math
import os
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from tabulate import tabulate
from tqdm import tqdm

import sparse_compile
from bench import checkpoint, distributed
from bench.data import CORPORA, Batches, Corpus
from bench.env import environment, write_csv
from bench.model import GPT, SIZES, train_step
from sparse_compile.clustering import kept_mass, static_share
from sparse_compile.config import DEFAULT_PRESET, PRESETS, BackendOptions, SparsityConfig, options_from_text
from sparse_compile.kernels import transposable_24_mask
from sparse_compile.ops import routes
from sparse_compile.passes.legality import fitted_chunk, fitted_units
from sparse_compile.passes.size_rule import small_ffn_bound
from sparse_compile.phase import FINAL_DENSE_FRAC, LR_DECAY_FRAC, WARMUP_FRAC
from sparse_compile.report import Report, run_line

SEGMENTS = ("warmup", "sparse", "final")
PARTIAL_LOG = "log_partial.csv"  # a stopped call's points so far
CSV_FIELDS = [
    "run",
    "step",
    "segment",
    "phase",
    "lr",
    "loss",
    "val_loss",
    "val_loss_dense",
    "tokens_per_s",
    "h_zero_frac",
    "h_kept_frac",
    "h_static_frac",
    "weight_flip_rate",
    "recluster_probe_s",
    "recluster_fit_s",
    "route_oracle_frac",
]


def _fraction(text: str) -> float:
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a fraction in [0, 1]")
    return value


def _positive(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: expected an int > 0")
    return value


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Appends "(default: X)" to an option's help only where the help does not give its default itself
    and X is not None (a default that depends on the device)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or re.search(r"\bdefault[ :]", action.help or ""):
            return action.help
        return super()._get_help_string(action)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    # no abbreviations: bench.sweep refuses the flags it sets itself by their full names
    p = argparse.ArgumentParser(
        prog="python -m bench.train", description=__doc__, formatter_class=_HelpFormatter, allow_abbrev=False
    )
    p.add_argument("--device", default="auto", help="'auto' (cuda if available), 'cpu' or 'cuda'")
    p.add_argument("--size", choices=sorted(SIZES), help="model size (default: tiny on CPU, 125m-d1024 on CUDA)")
    p.add_argument("--steps", type=_positive, help="training steps per run (default: 150 CPU, 2400 CUDA)")
    p.add_argument("--batch-size", type=_positive, help="sequences per step (default: 8 CPU, 16 CUDA)")
    p.add_argument("--seq-len", type=_positive, help="tokens (bytes) per sequence (default: the model's block size)")
    p.add_argument(
        "--lr",
        type=float,
        help="peak learning rate (default: 2e-3 CPU, 5e-4 CUDA, where the dense seeds end closest together: "
        "bench/RESULTS.md section 1)",
    )
    p.add_argument(
        "--lr-warmup-frac",
        type=_fraction,
        default=0.5,
        help="learning-rate warm-up: linear from 0 over this fraction of the steps, then --lr-schedule "
        "(default 0.5, under which the dense seeds end lower and closer together than with a short warm-up)",
    )
    p.add_argument(
        "--lr-schedule",
        choices=("cosine", "wsd"),
        default="cosine",
        help="after the warm-up: cosine to 0.1 x peak over the rest of the run, or wsd (warm-up, stable, decay): "
        "the peak until the last --lr-decay-frac of the steps, then linear to 0.1 x peak",
    )
    p.add_argument(
        "--lr-decay-frac",
        type=_fraction,
        default=LR_DECAY_FRAC,
        help="with --lr-schedule wsd: the last fraction of the steps over which the learning rate decays (default "
        f"{LR_DECAY_FRAC})",
    )
    p.add_argument("--weight-decay", type=float, default=0.1, help="AdamW weight decay of 2-D weights")
    p.add_argument("--warmup-frac", type=_fraction, default=WARMUP_FRAC, help="dense warm-up: first fraction of steps")
    p.add_argument(
        "--final-dense-frac",
        type=_fraction,
        default=FINAL_DENSE_FRAC,
        help="dense recovery: last fraction of steps, under either --lr-schedule (its measured quality: "
        "bench/RESULTS.md; with wsd and --lr-decay-frac 0.15, --warmup-frac 0.05 --final-dense-frac 0.15 is about "
        "PhaseSchedule.until_lr_decay's recipe)",
    )
    p.add_argument(
        "--sparsity",
        default=DEFAULT_PRESET,
        help=f"preset name ({', '.join(PRESETS)}; default: {DEFAULT_PRESET}, backend='sparse' with no options) "
        "or JSON options for backend='sparse'",
    )
    p.add_argument(
        "--masked-decay",
        type=float,
        default=2e-3,
        help="masked decay of the pruned weights (Hu et al.), used when the sparsity has 2:4 weights",
    )
    p.add_argument("--runs", default="dense,sparse", help="which runs, comma-separated: dense, sparse")
    p.add_argument("--log-every", type=_positive, help="steps between logged points (default: steps/32)")
    p.add_argument("--eval-every", type=_positive, help="steps between validation losses (default: steps/8)")
    p.add_argument("--eval-iters", type=_positive, help="validation batches per evaluation (default: 4 CPU, 8 CUDA)")
    p.add_argument(
        "--final-eval-iters",
        type=_positive,
        help="validation batches of the final validation loss (default: 16 CPU, 64 CUDA)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the initial weights and the batch order")
    p.add_argument("--out", default="runs/train", help="folder for log.csv, loss.png and summary.txt")
    p.add_argument("--data-dir", help="cache folder of the corpus (default: ~/.cache/sparse_compile)")
    p.add_argument(
        "--corpus",
        choices=CORPORA,
        default="packages",
        help="packages: the standard library's, torch's and sympy's sources (~70-100 MB); stdlib: the standard "
        "library's alone (~10 MB); site: the standard library and every site-packages folder (several times "
        "packages where more is installed: for runs that would repeat packages)",
    )
    p.add_argument(
        "--recluster-every",
        type=int,
        default=None,
        help='with {"permute": true} in --sparsity: refit the hidden-unit permutations on the current batch '
        'every N steps of the sparse phase (sparse_compile.recluster; 0: never); with routed tokens ("routes") '
        "the routing is fitted before the first sparse step and every N steps (default 100 there); "
        "log.csv's recluster_probe_s "
        "and recluster_fit_s give the seconds of each log interval spent in the probe forward and in recluster()",
    )
    p.add_argument(
        "--refit-routes",
        choices=("all", "router"),
        default=None,
        help="with routed tokens: what each refit after the first changes (sparse_compile.recluster(routes=...)): "
        "router (the default): the router only, the permutation and groups staying those of the first fit; all: "
        "the unit permutation, the groups and the router",
    )
    p.add_argument(
        "--dense-every",
        type=int,
        default=0,
        help="run every N-th step of the sparse phase dense as well (N >= 2; 0: never): the weights keep "
        "seeing the dense function; the sparse segment's tokens/s then include those steps",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--save-every", type=int, default=0, help="write OUT/checkpoint.pt every N steps (0: never)")
    p.add_argument(
        "--stop-at",
        type=_positive,
        help="stop the run in progress after this step, write OUT/checkpoint.pt, and exit (go on with --resume)",
    )
    p.add_argument(
        "--time-limit",
        type=float,
        metavar="SECONDS",
        help="after the first step that ends this many seconds after the arguments were parsed, write "
        "OUT/checkpoint.pt and exit (go on with --resume); a finished run exits as usual",
    )
    p.add_argument(
        "--resume",
        metavar="DIR",
        help="go on from DIR/checkpoint.pt (same arguments as the stopped call); outputs go to DIR",
    )
    p.add_argument(
        "--distributed",
        choices=distributed.MODES,
        default="none",
        help="ddp or fsdp (FSDP2): launch with torchrun --nproc-per-node N -m bench.train ...",
    )
    distributed.add_fsdp_args(p)
    p.add_argument(
        "--deterministic",
        action="store_true",
        help="run-to-run reproducible: torch.use_deterministic_algorithms (deterministic attention backward, "
        "embedding backward and cuBLAS workspace; slower steps), so one seed run twice on one machine gives "
        "the same losses; the sparse kernels are deterministic already, given the same autotuned tiles "
        "(kept on disk per machine: kernels/tune_cache.py)",
    )
    p.add_argument(
        "--compile-mode",
        choices=("default", "reduce-overhead", "max-autotune-no-cudagraphs"),
        default="default",
        help="torch.compile mode of both runs (reduce-overhead: CUDA graphs, fewer launches per step)",
    )
    args = p.parse_args(argv)

    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.device not in ("cpu", "cuda"):
        p.error(f"--device {args.device!r}: expected auto, cpu or cuda")
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA device is available")
    gpu = args.device == "cuda"
    args.size = args.size or ("125m-d1024" if gpu else "tiny")
    args.steps = args.steps or (2400 if gpu else 150)  # CUDA: 39M tokens, 0.4-0.6 of an epoch of packages
    args.batch_size = args.batch_size or (16 if gpu else 8)
    args.seq_len = args.seq_len or SIZES[args.size].block_size
    args.lr = args.lr or (5e-4 if gpu else 2e-3)
    args.log_every = args.log_every or max(1, args.steps // 32)
    args.eval_every = args.eval_every or max(1, args.steps // 8)
    args.eval_iters = args.eval_iters or (8 if gpu else 4)
    args.final_eval_iters = max(args.eval_iters, args.final_eval_iters or (64 if gpu else 16))
    if args.seq_len > SIZES[args.size].block_size:
        p.error(f"--seq-len {args.seq_len} > block size {SIZES[args.size].block_size} of --size {args.size}")
    if args.lr_schedule == "wsd" and not (args.lr_decay_frac > 0 and args.lr_warmup_frac + args.lr_decay_frac <= 1):
        p.error(f"--lr-decay-frac {args.lr_decay_frac} with --lr-warmup-frac {args.lr_warmup_frac}: expected a decay "
                "> 0 that fits after the warm-up (the two summing to <= 1)")  # fmt: skip
    try:  # the schedule's own rules (fractions in [0, 1] summing to <= 1, dense_every 0 or >= 2)
        args.schedule = sparse_compile.PhaseSchedule.from_fractions(
            args.steps, args.warmup_frac, args.final_dense_frac, args.dense_every
        )
    except ValueError as e:
        flags = f"--warmup-frac {args.warmup_frac}, --final-dense-frac {args.final_dense_frac}, --dense-every"
        p.error(f"{flags} {args.dense_every}: {e}")
    if not args.lr > 0:
        p.error(f"--lr {args.lr}: expected > 0")
    runs = [r.strip() for r in args.runs.split(",") if r.strip()]
    if not runs or any(r not in ("dense", "sparse") for r in runs):
        p.error(f"--runs {args.runs!r}: expected a comma-separated subset of dense,sparse")
    args.runs = runs
    if args.save_every < 0:
        p.error(f"--save-every {args.save_every}: expected an int >= 0")
    if args.stop_at is not None and args.stop_at >= args.steps:
        p.error(f"--stop-at {args.stop_at}: expected a step < --steps {args.steps}")
    if args.time_limit is not None and not args.time_limit > 0:
        p.error(f"--time-limit {args.time_limit}: expected seconds > 0")
    args.deadline = None if args.time_limit is None else time.perf_counter() + args.time_limit
    if (args.save_every or args.stop_at or args.time_limit or args.resume) and args.distributed != "none":
        p.error("--save-every, --stop-at, --time-limit and --resume run on one process (not with --distributed)")
    args.fsdp = distributed.fsdp_options(args, p)
    if args.resume:
        args.out = args.resume
    try:
        # the main job measures the pattern at 125M: every site sparse (main_job_small_ffn)
        options = options_from_text(args.sparsity)
        options = {"small_ffn": main_job_small_ffn(args, BackendOptions.parse(options).config), **options}
        if BackendOptions.parse(options).config.weights is not None and "masked_decay" not in options:
            options["masked_decay"] = args.masked_decay
        args.config = BackendOptions.parse(options).config
    except ValueError as e:
        p.error(f"--sparsity {args.sparsity!r}: {e}")
    routed = args.config.routes is not None
    if args.recluster_every is None:
        args.recluster_every = 100 if routed else 0
    if args.recluster_every < 0 or (args.recluster_every and not (args.config.permute or routed)):
        p.error(
            f'--recluster-every {args.recluster_every}: expected 0, or N > 0 with "permute": true or "routes" in '
            "--sparsity"
        )
    if args.refit_routes is not None and not routed:
        p.error(f'--refit-routes {args.refit_routes}: needs routed tokens ("routes" in --sparsity)')
    args.refit_routes = args.refit_routes or "router"  # checked on resume only with routed tokens
    if routed and not args.recluster_every:
        p.error("--recluster-every 0 with routed tokens: the routing must be fitted (expected N > 0)")
    if args.compile_mode != "default":
        options["mode"] = args.compile_mode
    args.options = options
    return args


def untimed_steps(start: int, schedule: sparse_compile.PhaseSchedule) -> set[int]:
    """Steps left out of the tokens/s: the first two of a process (compile) and of each segment (a
    phase switch: the first sparse step autotunes and compiles the Triton kernels, seconds on a GPU;
    under CUDA graphs a graph's first call runs it eagerly and its second records it, so the second
    is no steady-state step either), and with dense_every the first dense step in the sparse window
    (its dense variant compiles there where warm-up is 0)."""
    steps = {start, start + 1}
    for first in (schedule.dense_warmup_steps, schedule.dense_from_step):
        if first is not None:
            steps.update((first, first + 1))
    if schedule.dense_every:
        steps.add(schedule.dense_warmup_steps + schedule.dense_every - 1)
    return steps


def main_job_small_ffn(args: argparse.Namespace, config: SparsityConfig) -> str:
    """The sparse run's small_ffn: "graphs", the user's default, where it runs every FFN site sparse
    (the sites' T x d x h at or above its bound with CUDA graphs, on one CUDA process in the default
    compile mode, without permute: the graphs then run under CUDA graphs, passes/size_rule.py);
    else "sparse" (every site sparse, without CUDA graphs). --sparsity may set it."""
    n = SIZES[args.size].n_embd
    work = args.batch_size * args.seq_len * n * 4 * n  # T x d x h of each FFN (hidden 4d)
    rule = args.device == "cuda" and args.distributed == "none" and args.compile_mode == "default"
    graphs = rule and not config.permute and config.routes is None and work >= small_ffn_bound(True, config.chunk > 1)
    return "graphs" if graphs else "sparse"


@dataclass
class RunResult:
    name: str
    rows: list[dict] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(SEGMENTS, 0.0))
    tokens: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SEGMENTS, 0))
    final_val_loss: float = math.nan
    peak_memory_gib: float = math.nan

    def tokens_per_s(self, segments: tuple[str, ...] = SEGMENTS) -> float:
        secs = sum(self.seconds[s] for s in segments)
        return sum(self.tokens[s] for s in segments) / secs if secs else math.nan


class Health:
    """Sparsity health of the FFNs on one batch, with an eager probe of the uncompiled model.

    h_zero_frac: fraction of exact zeros in H = relu(Z)^2; h_kept_frac: fraction of sum |H| that
    the activation pattern keeps; h_static_frac: fraction of the pattern's kept (block, chunk)
    pairs whose chunk at least 90% of the layer's blocks keep (clustering.static_share: 1 when
    every block keeps the same chunks); weight_flip_rate: fraction of 2:4 weight-mask entries
    changed since the previous probe.
    """

    def __init__(
        self, model: GPT, pattern: tuple[int, int, int] | None, sharded: bool = False, chunk: int = 1,
        causal: bool = False, score: int | None = None, routed: bool = False, extra: int = 0,
        units: int | None = None,
    ) -> None:  # fmt: skip
        self.model = model
        self.routed = routed  # kept mass as each site's router routes (ops/routes.py)
        self.pattern = pattern
        self.chunk = chunk
        self.causal = causal
        self.score = score  # causal: rows of the previous block that score a block (None: V)
        self.extra = extra  # each token's own largest units outside the block's choice (token_extra)
        self.units = units  # per-token chunks ranked on each chunk's first units (score_units; None: all)
        self.sharded = sharded  # FSDP2: weights are shards; gather them (every rank probes)
        self.previous: list[torch.Tensor] | None = None

    @torch.no_grad()
    def probe(self, x: torch.Tensor, autocast) -> dict[str, float]:
        hs: list[torch.Tensor] = []
        xs: list[torch.Tensor] = []  # each FFN's input (a linear router reads it)
        seq = x.shape[-1] if self.causal else None  # x [B, S] token ids

        def hook(m, inp, out):
            hs.append(torch.relu(m.c_fc(inp[0])).square())
            if self.routed:  # in the dtype the op receives it (autocast's)
                x_in, kind = inp[0], inp[0].device.type
                dtype = torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else x_in.dtype
                xs.append(x_in.reshape(-1, x_in.shape[-1]).to(dtype))

        hooks = [b.mlp.register_forward_hook(hook) for b in self.model.blocks]
        try:  # eager, also where the blocks are compiled in place (FSDP2): the hooks read H
            with autocast(), torch.compiler.set_stance("force_eager"):
                self.model(x)
        finally:
            for h in hooks:
                h.remove()
        zeros = sum((h == 0).sum().item() for h in hs) / sum(h.numel() for h in hs)
        kept = static = oracle = math.nan
        if self.routed:
            pairs = [
                routes.kept_and_total(f"blocks.{i}.mlp", xi, h.reshape(-1, h.shape[-1]))
                for i, (xi, h) in enumerate(zip(xs, hs, strict=True))
            ]
            if all(p is not None for p in pairs):
                kept = sum(p[0] for p in pairs) / sum(p[1] for p in pairs)
            fits = routes.fitted_kept()
            if fits:
                oracle = sum(f["oracle"] for f in fits.values()) / len(fits)
        elif self.pattern is not None:
            flat = [h.reshape(-1, h.shape[-1]).float() for h in hs]
            v, _, m = self.pattern
            fits = seq is None or seq % v == 0
            perms = sparse_compile.unit_permutations()  # by site module path, 'blocks.i.mlp'
            chunk = fitted_chunk(flat[0].shape[1], m, self.chunk)  # the chunk the sites run with (fit_chunk)
            if fits and all(f.shape[0] % v == 0 and f.shape[1] % (m * chunk) == 0 for f in flat):
                site_perms = [perms.get(f"blocks.{i}.mlp") for i in range(len(flat))]
                units = fitted_units(self.units, self.chunk, chunk)
                kept = kept_mass(flat, self.pattern, chunk, site_perms, seq, self.score, self.extra, units)
                static = static_share(flat, self.pattern, chunk, site_perms, seq, score=self.score, units=units)
        flips = math.nan
        weights = [w for b in self.model.blocks for w in (b.mlp.c_fc.weight, b.mlp.c_proj.weight)]
        masks = [transposable_24_mask(distributed.full(w) if self.sharded else w) for w in weights]
        if self.previous is not None:
            flips = sum((a != b).sum().item() for a, b in zip(masks, self.previous, strict=True)) / sum(
                m.numel() for m in masks
            )
        self.previous = masks
        return {
            "h_zero_frac": zeros, "h_kept_frac": kept, "h_static_frac": static, "weight_flip_rate": flips,
            "route_oracle_frac": oracle,
        }  # fmt: skip


def _lr_warmup_steps(args: argparse.Namespace) -> int:
    return max(1, int(args.steps * args.lr_warmup_frac + 1e-9))  # 2400 x 0.05 = 120 steps


def _lr_decay_steps(args: argparse.Namespace) -> int:
    """wsd: the steps of the decay, at the end of the run (at least one)."""
    return max(1, int(args.steps * args.lr_decay_frac + 1e-9))


def _lr(step: int, args: argparse.Namespace) -> float:
    warm = _lr_warmup_steps(args)
    if step < warm:
        return args.lr * (step + 1) / warm
    if args.lr_schedule == "wsd":  # the peak, then the last D steps linear from it to 0.1 x peak
        decay = _lr_decay_steps(args)
        into = step - (args.steps - decay)
        return args.lr if into < 0 else args.lr * (1.0 - 0.9 * (into + 1) / decay)
    progress = (step - warm) / max(1, args.steps - warm)
    return args.lr * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress)))


def _lr_text(args: argparse.Namespace) -> str:
    """The schedule as the summary names it."""
    head = f"peak lr {args.lr:g}, warm-up {_lr_warmup_steps(args)} steps, "
    if args.lr_schedule == "wsd":
        return head + f"the peak, then the last {_lr_decay_steps(args)} steps linear to 0.1x (wsd)"
    return head + "cosine to 0.1x"


def _optimizer(model: GPT, args: argparse.Namespace) -> torch.optim.Optimizer:
    return model.adamw(args.lr, args.weight_decay, fused=args.device == "cuda")


VAL_SEED = 2  # the validation windows' seed (fixed: --seed sets the weights and the batch order)
CHECKED_ARGS = (
    "size", "steps", "batch_size", "seq_len", "lr", "lr_warmup_frac", "weight_decay", "warmup_frac", "final_dense_frac",
    "sparsity", "masked_decay", "runs", "log_every", "eval_every", "eval_iters", "final_eval_iters", "seed",
    "compile_mode", "device", "corpus", "recluster_every", "deterministic", "dense_every", "lr_schedule",
    "lr_decay_frac", "refit_routes",
)  # fmt: skip
CHECKED_SINCE = {
    "lr_schedule": "cosine",
    "lr_decay_frac": 0.1,
    "refit_routes": "all",
}  # what a checkpoint without the argument ran with


def checked_args(args: argparse.Namespace) -> dict[str, Any]:
    """The arguments a checkpoint holds and --resume must match: CHECKED_ARGS, less --lr-decay-frac under
    cosine and --refit-routes without routed tokens, where they do nothing (such a run resumes whatever
    their defaults)."""
    idle = {"lr_decay_frac"} if args.lr_schedule != "wsd" else set()
    idle |= {"refit_routes"} if args.config.routes is None else set()
    return {k: getattr(args, k) for k in CHECKED_ARGS if k not in idle}


def train_one(
    name: str,
    args: argparse.Namespace,
    corpus: Corpus,
    schedule: sparse_compile.PhaseSchedule,
    val_batches: list,
    d: distributed.Dist,
    ckpt: checkpoint.Checkpoint | None = None,
) -> RunResult | None:
    """One run; None if --stop-at or --time-limit stopped it (its state is then in OUT/checkpoint.pt)."""
    device = torch.device(args.device, d.local_rank) if args.device == "cuda" else torch.device(args.device)
    torch.manual_seed(args.seed)
    model = GPT(SIZES[args.size]).to(device)
    if name == "dense":
        mode = None if args.compile_mode == "default" else args.compile_mode
        compiled = distributed.compile_model(model, d, args.fsdp, mode=mode)
    else:
        compiled = distributed.compile_model(model, d, args.fsdp, backend="sparse", options=args.options)
    opt = _optimizer(model, args)
    batches = Batches(corpus.train, args.batch_size, args.seq_len, args.seed + 1, d.rank, d.world)
    gpu = device.type == "cuda"

    def autocast():
        return torch.autocast("cuda", dtype=torch.bfloat16) if gpu else contextlib.nullcontext()

    def sync():
        if gpu:
            torch.cuda.synchronize()

    def evaluate(n: int) -> float:
        with torch.no_grad(), autocast():
            local = sum(compiled(x, y)[1].item() for x, y in val_batches[:n]) / n
        return distributed.mean(local, d, device)

    health = Health(
        model, args.config.activation_pattern, d.world > 1 and d.mode == "fsdp", args.config.chunk,
        args.config.causal, args.config.score_rows, args.config.routes is not None, args.config.token_extra,
        args.config.score_units,
    )  # fmt: skip
    result = RunResult(name)
    if gpu:
        torch.cuda.reset_peak_memory_stats(device)
    tokens_per_step = args.batch_size * args.seq_len * d.world
    losses: list[float] = []
    interval_time, interval_tokens = 0.0, 0
    recluster = {"probe": 0.0, "fit": 0.0}  # seconds in this log interval: the probe forward, recluster()
    start = 0
    sparse_compile.reset_units()  # every run starts with its sites' hidden units in their own order
    state = ckpt.current if ckpt is not None else None
    if state is not None and state.name == name:
        sparse_compile.load_unit_permutations(state.units or {})
        sparse_compile.load_route_state(state.routes or {})
        model.load_state_dict(state.model)
        opt.load_state_dict(state.optimizer)
        batches.generator.set_state(state.batches)
        checkpoint.set_rng_state(state.rng)
        result = RunResult(**state.result)
        losses, interval_time, interval_tokens = (state.interval[k] for k in ("losses", "time", "tokens"))
        recluster = dict(state.interval.get("recluster", recluster))
        health.previous = state.health
        start = state.step
    first_steps = untimed_steps(start, schedule)

    def save(step: int) -> None:
        interval = {"losses": losses, "time": interval_time, "tokens": interval_tokens, "recluster": recluster}
        ckpt.current = checkpoint.RunState(
            name, step, model.state_dict(), opt.state_dict(), batches.generator.get_state(),
            checkpoint.rng_state(), dataclasses.asdict(result), interval, health.previous,
            sparse_compile.unit_permutations(), sparse_compile.route_state(),
        )  # fmt: skip
        checkpoint.save(Path(args.out), ckpt)

    routed = args.config.routes is not None

    def refit_on(x: torch.Tensor, y: torch.Tensor) -> None:
        """Probe the sites on this batch and refit them (timed: part of the recipe's cost)."""
        sync()
        t1 = time.perf_counter()
        with sparse_compile.probe_units(), torch.no_grad(), autocast():
            compiled(x, y)
        sync()
        t2 = time.perf_counter()
        sparse_compile.recluster(routes=args.refit_routes)
        recluster["probe"] += t2 - t1
        recluster["fit"] += time.perf_counter() - t2

    bar = tqdm(range(start, args.steps), desc=f"{name:>6}", disable=args.no_progress or not d.main, file=sys.stderr)
    for step in bar:
        in_sparse_window = schedule.in_sparse_window(step)
        segment = "sparse" if in_sparse_window else ("warmup" if step < schedule.dense_warmup_steps else "final")
        phase = schedule.step(step) if name == "sparse" else "dense"  # this step's (--dense-every's steps: dense)
        window = "sparse" if name == "sparse" and in_sparse_window else "dense"  # logged, and evaluated in
        for g in opt.param_groups:
            g["lr"] = _lr(step, args)
        x, y = batches.next(device)
        sync()
        t0 = time.perf_counter()
        since = step - schedule.dense_warmup_steps
        refit = phase == "sparse" and args.recluster_every and since % args.recluster_every == 0
        if refit and routed:  # routed sites route by a fitted router from their first sparse step on
            refit_on(x, y)
        loss = train_step(compiled, model, opt, x, y, autocast)
        if refit and not routed:
            refit_on(x, y)
        sync()
        dt = time.perf_counter() - t0
        if step not in first_steps:
            result.seconds[segment] += dt
            result.tokens[segment] += tokens_per_step
        interval_time += dt
        interval_tokens += tokens_per_step
        losses.append(loss.item())
        last = step == args.steps - 1
        evaluate_now = (step + 1) % args.eval_every == 0 or last  # a logged row too, whatever the log cadence
        if (step + 1) % args.log_every == 0 or evaluate_now:
            row = {
                "run": name,
                "step": step + 1,
                "segment": segment,
                "phase": window,
                "lr": _lr(step, args),
                "loss": distributed.mean(sum(losses) / len(losses), d, device),
                "val_loss": "",
                "val_loss_dense": "",
                "tokens_per_s": interval_tokens / distributed.mean(interval_time, d, device),
                "recluster_probe_s": distributed.mean(recluster["probe"], d, device),
                "recluster_fit_s": distributed.mean(recluster["fit"], d, device),
            }
            if evaluate_now:
                sparse_compile.set_phase(window)
                row["val_loss"] = evaluate(args.final_eval_iters if last else args.eval_iters)
                if window == "sparse":  # the same weights with dense FFNs: does the sparse model lean on
                    with sparse_compile.dense_phase():  # what its pattern sees (future tokens of a block)?
                        row["val_loss_dense"] = evaluate(args.eval_iters)
            row.update(health.probe(x, autocast))
            result.rows.append(row)
            bar.set_postfix(loss=f"{row['loss']:.3f}", phase=window)
            losses, interval_time, interval_tokens = [], 0.0, 0
            recluster = {"probe": 0.0, "fit": 0.0}
        out_of_time = args.deadline is not None and time.perf_counter() > args.deadline
        if ckpt is not None and (step + 1 == args.stop_at or (out_of_time and not last)):
            save(step + 1)
            sparse_compile.set_phase("sparse")
            return None
        if ckpt is not None and args.save_every and (step + 1) % args.save_every == 0 and not last:
            save(step + 1)
    result.final_val_loss = result.rows[-1]["val_loss"]
    if gpu:
        result.peak_memory_gib = torch.cuda.max_memory_allocated(device) / 2**30
    sparse_compile.set_phase("sparse")
    if ckpt is not None:
        ckpt.finished[name] = dataclasses.asdict(result)
        ckpt.current = None
        checkpoint.save(Path(args.out), ckpt)
    return result


def reports_text(reports: list[Report]) -> str:
    """The compile reports with sites, one after another; the run line (sparse_compile.report.run_line), which
    every report with sparse sites carries and which says the same of each graph, only in the first that has it."""
    line, seen, texts = f"\n{run_line()}\n", False, []
    for text in (str(r) for r in reports if r.sites):
        texts.append(text.replace(line, "\n") if seen else text)
        seen = seen or line in text
    return "\n".join(texts)


def _maybe(value: float, fmt: str) -> str:
    return "n/a" if math.isnan(value) else fmt.format(value)


def summary_table(results: dict[str, RunResult], keep: float | None = None) -> str:
    """The summary's table, one column per run. ``keep``: with routed tokens, the share of H one group keeps
    (4/M), what a random group keeps of a token's mass: the routed row's baseline."""
    names = list(results)
    rows = [
        ["final val loss", *(f"{results[n].final_val_loss:.4f}" for n in names)],
        *[[f"tokens/s, {s} steps", *(f"{results[n].tokens_per_s((s,)):,.0f}" for n in names)] for s in SEGMENTS],
        ["tokens/s, whole run", *(f"{results[n].tokens_per_s():,.0f}" for n in names)],
        ["peak GPU memory (GiB)", *(_maybe(results[n].peak_memory_gib, "{:.2f}") for n in names)],
    ]
    if {"dense", "sparse"} <= set(names):
        d, s = results["dense"], results["sparse"]
        rel = (s.final_val_loss - d.final_val_loss) / d.final_val_loss
        rows.append(["sparse vs dense: val loss", "", f"{100 * rel:+.2f}%"])
        rows.append(
            [
                "sparse vs dense: speedup, sparse steps",
                "",
                f"{s.tokens_per_s(('sparse',)) / d.tokens_per_s(('sparse',)):.3f}x",
            ]
        )
        rows.append(["sparse vs dense: speedup, whole run", "", f"{s.tokens_per_s() / d.tokens_per_s():.3f}x"])
    if "sparse" in names:
        both = [r for r in results["sparse"].rows if r.get("val_loss_dense", "") != ""]
        if both:  # the last evaluation of the sparse phase, the same weights run both ways
            r = both[-1]
            gap = (r["val_loss"] - r["val_loss_dense"]) / r["val_loss_dense"]
            value = f"{r['val_loss']:.4f} / {r['val_loss_dense']:.4f} ({100 * gap:+.2f}%)"
            label = f"sparse run at step {r['step']}: val loss sparse / dense FFNs"
            rows.append([label, *[""] * (len(names) - 1), value])
        fits = [
            r["route_oracle_frac"]
            for r in results["sparse"].rows
            if not math.isnan(r.get("route_oracle_frac", math.nan))
        ]
        if fits and keep is not None:  # do the groups still follow the model? (a first fit's own sample reads high)
            value = f"{fits[0]:.3f} / {fits[-1]:.3f} (a random group: {keep:.3f})"
            label = "routed groups: a refit sample's best-group share of its mass, first / last logged"
            rows.append([label, *[""] * (len(names) - 1), value])
    return tabulate(rows, headers=["", *names], tablefmt="github", disable_numparse=True)


def plot(results: dict[str, RunResult], schedule: sparse_compile.PhaseSchedule, steps: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, hx) = plt.subplots(2, 1, figsize=(8, 6), sharex=True, height_ratios=(3, 1.3))
    colors = {"dense": "tab:blue", "sparse": "tab:orange"}
    for name, r in results.items():
        ax.plot(
            [row["step"] for row in r.rows], [row["loss"] for row in r.rows], color=colors[name], label=f"{name} train"
        )
        val = [(row["step"], row["val_loss"]) for row in r.rows if row["val_loss"] != ""]
        ax.plot(*zip(*val, strict=True), "o--", color=colors[name], label=f"{name} val")
        both = [(row["step"], row["val_loss_dense"]) for row in r.rows if row.get("val_loss_dense", "") != ""]
        if both:
            ax.plot(*zip(*both, strict=True), "x", color=colors[name], label=f"{name} val, same weights, dense FFNs")
        hx.plot(
            [row["step"] for row in r.rows],
            [row["h_zero_frac"] for row in r.rows],
            color=colors[name],
            label=f"{name}: zeros in H",
        )
        hx.plot(
            [row["step"] for row in r.rows],
            [row["h_kept_frac"] for row in r.rows],
            ":",
            color=colors[name],
            label=f"{name}: |H| kept by pattern",
        )
    end = schedule.dense_from_step if schedule.dense_from_step is not None else steps
    for a in (ax, hx):
        a.axvspan(schedule.dense_warmup_steps, end, color="tab:orange", alpha=0.08, lw=0)
        for b in (schedule.dense_warmup_steps, end):
            a.axvline(b, color="gray", ls=":", lw=1)
    ax.set_ylabel("loss (nats/byte)")
    ax.set_title("dense vs sparse (shaded: sparse phase of the sparse run)")
    ax.legend(fontsize=8)
    hx.set_xlabel("step")
    hx.set_ylabel("fraction")
    hx.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def make_deterministic() -> None:
    """Every op deterministic run to run (an op without such an implementation raises, naming itself).
    Before the first cuBLAS call: cuBLAS reads its workspace setting when it creates a handle."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.deterministic:
        make_deterministic()
    d = distributed.setup(args.distributed, args.device)
    out = Path(args.out)
    env = environment(torch.device(args.device), "python -m bench.train", argv)
    if d.main:
        out.mkdir(parents=True, exist_ok=True)
        corpus = Corpus.load(args.data_dir, source=args.corpus)  # built once, before the other ranks read it
    if d.world > 1:
        torch.distributed.barrier()
    if not d.main:
        corpus = Corpus.load(args.data_dir, source=args.corpus)
    schedule = args.schedule  # built and checked by parse_args
    # The same validation windows for every seed, so that runs of different seeds compare.
    val = Batches(corpus.val, args.batch_size, args.seq_len, VAL_SEED, d.rank, d.world)
    val_batches = [val.next(args.device) for _ in range(args.final_eval_iters)]
    header = (
        f"model {args.size} ({GPT(SIZES[args.size]).num_params() / 1e6:.1f}M params), {args.steps} steps x "
        f"{args.batch_size}x{args.seq_len} tokens"
        + (f" per rank x {d.world} ranks ({d.mode})" if d.world > 1 else "")
        + (f", FSDP2 {args.fsdp.describe(args.device)}" if d.mode == "fsdp" else "")
        + f"; {_lr_text(args)}"
        + f"; corpus {corpus.n_files} files of {corpus.source} "
        f"({len(corpus.train) / 1e6:.1f} MB train, {len(corpus.val) / 1e6:.1f} MB val)\n"
        f"sparse: {args.config}; schedule: dense steps [0, {schedule.dense_warmup_steps}), sparse "
        f"[{schedule.dense_warmup_steps}, {schedule.dense_from_step})"
        + (f" with one step in {schedule.dense_every} dense" if schedule.dense_every else "")
        + ", dense after\n"
        + "\n".join(f"{k}: {v}" for k, v in env.items())
    )
    if d.main:
        print(header, flush=True)
    ckpt = None
    if args.save_every or args.stop_at or args.time_limit or args.resume:
        checked = checked_args(args)
        try:
            ckpt = (
                checkpoint.load(args.resume, checked, CHECKED_SINCE)
                if args.resume
                else checkpoint.Checkpoint(args=checked)
            )
        except ValueError as e:
            print(f"python -m bench.train: error: {e}", file=sys.stderr)
            return 2
    results = {}
    for name in args.runs:
        if ckpt is not None and name in ckpt.finished:
            results[name] = RunResult(**ckpt.finished[name])
            continue
        result = train_one(name, args, corpus, schedule, val_batches, d, ckpt)
        if result is None:  # the points logged so far, apart from log.csv (whose last row is the final)
            if d.main:
                rows = [row for r in results.values() for row in r.rows] + ckpt.current.result["rows"]
                write_csv(out / PARTIAL_LOG, rows, CSV_FIELDS)
            print(f"stopped {name} after step {ckpt.current.step}: go on with --resume {out}")
            return 0
        results[name] = result
    if d.main:
        write_csv(out / "log.csv", [row for r in results.values() for row in r.rows], CSV_FIELDS)
        (out / PARTIAL_LOG).unlink(missing_ok=True)
        plot(results, schedule, args.steps, out / "loss.png")
        keep = 4 / args.config.activation_pattern[2] if args.config.routes is not None else None
        table = summary_table(results, keep)
        if "sparse" in results:  # what ran sparse, with which kernels (the sparse run compiled last)
            table += "\n\n" + reports_text(sparse_compile.compile_reports())
        (out / "summary.txt").write_text(f"{header}\n\n{table}\n")
        print(f"\n{table}\n\nwrote {out / 'log.csv'}, {out / 'loss.png'}, {out / 'summary.txt'}")
    distributed.teardown(d)
    return 0


if __name__ == "__main__":
    sys.exit(main())
