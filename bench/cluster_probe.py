"""python -m bench.cluster_probe: how much kept mass does hidden-unit clustering buy?

Trains the project's GPT dense (bench.train's data and optimizer, bf16 autocast on CUDA) and, at
each --fit-at step, measures on held-out validation batches the fraction of sum |H| that each
activation pattern keeps (H = relu(Z)^2 of every FFN, all layers pooled), for:
- identity: the units in their own order (what the backend does today);
- clustered: the permutation of sparse_compile.clustering.cluster_units, fitted on --fit-batches
  training batches at that step (chunks of co-firing units, then groups of least overlap);
- chunks only (c > 1): the same without the grouping level;
- stale: the permutation fitted at the previous --fit-at step, applied at this one (how often
  re-clustering must run).

With --score-rows S,..: also, for every pattern, the causal pattern (each block's chunks chosen from
the previous block of its sequence; the sequence is the model's block size) and the causal
pattern scored on the previous block's last S rows only ({"causal": true, "score_rows": S}), in
the units' own order, with "agree": the fraction of the (block, group) chunk choices equal to the
causal pattern's. --no-cluster skips the clustering variants.

With --extras R,.. (block patterns, with --score-rows): also, for each causal variant, the pattern
with each token's own R largest units outside its block's choice (SparsityConfig.token_extra): its
kept mass and the work of the union of those units over tiles of V consecutive tokens
(bench/tile_union.extra_work; V from --tile-union, else the block's V).

With --tile-union V,.. (per-token patterns, 1:4:McC): also, for each variant's units, the work of
an exact tiled layout (bench/tile_union.py): tiles of V tokens in sequence order, and with --routes
G,.. tokens routed by their own choice to G centroids fitted on the fit batches.

Patterns are V:N:M with an optional chunk, as in the config: 128:2:16c64 is {"activations":
"128:2:16", "chunk": 64}. Writes a tabulate table and --csv.
"""

import argparse
import math
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass

import torch
from tabulate import tabulate

from bench.data import CORPORA, Batches, Corpus
from bench.env import environment, write_csv
from bench.model import GPT, SIZES, GPTConfig, train_step
from bench.tile_union import extra_work, layout_work, token_extras
from sparse_compile.clustering import block_mass, cluster_units, kept_mass
from sparse_compile.kernels.activation_mask import vnm_mask, vnm_select


def parse_pattern(text: str) -> tuple[int, int, int, int]:
    """'128:2:16c64' -> (128, 2, 16, 64); 'V:N:M' -> (V, N, M, 1)."""
    body, _, chunk = text.partition("c")
    try:
        v, n, m = (int(x) for x in body.split(":"))
        c = int(chunk) if chunk else 1
    except ValueError:
        raise ValueError(f"pattern {text!r}: expected V:N:M or V:N:McC (for example 128:2:16c64)") from None
    return v, n, m, c


@torch.no_grad()
def hidden_and_inputs(
    model: GPT,
    batches: list[tuple[torch.Tensor, torch.Tensor]],
    autocast: Callable[[], AbstractContextManager],
    inputs: bool = True,
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """(H = relu(c_fc(x))^2 of every layer [sum of tokens, F] in bf16, each layer's FFN input x [sum of
    tokens, d] or, without ``inputs``, nothing) over ``batches``."""
    hs: list[list[torch.Tensor]] = [[] for _ in model.blocks]
    xs: list[list[torch.Tensor]] = [[] for _ in model.blocks]

    def record(i: int, m: torch.nn.Module, inp: tuple[torch.Tensor, ...]) -> None:
        hs[i].append(torch.relu(m.c_fc(inp[0])).square().reshape(-1, m.c_fc.out_features).to(torch.bfloat16))
        if inputs:
            xs[i].append(inp[0].reshape(-1, inp[0].shape[-1]))

    hooks = [
        b.mlp.register_forward_hook(lambda m, inp, out, i=i: record(i, m, inp)) for i, b in enumerate(model.blocks)
    ]
    try:
        with autocast():
            for x, _ in batches:
                model(x)
    finally:
        for h in hooks:
            h.remove()
    return [torch.cat(h) for h in hs], [torch.cat(x) for x in xs if x]


def hidden(
    model: GPT, batches: list[tuple[torch.Tensor, torch.Tensor]], autocast: Callable[[], AbstractContextManager]
) -> list[torch.Tensor]:
    """H = relu(c_fc(x))^2 of every layer [sum of tokens, F], bf16, over ``batches``."""
    return hidden_and_inputs(model, batches, autocast, inputs=False)[0]


@dataclass
class DenseRun:
    """The dense model these probes train, its data and optimizer (bench.train's), bf16 autocast on CUDA."""

    cfg: GPTConfig
    model: GPT
    compiled: torch.nn.Module
    opt: torch.optim.Optimizer
    train: Batches
    val_batches: list[tuple[torch.Tensor, torch.Tensor]]
    gpu: bool

    @classmethod
    def make(cls, args: argparse.Namespace, size: str, batch_size: int, device: str) -> "DenseRun":
        """From args.seed, .lr, .eval_batches, .data_dir and .corpus."""
        torch.manual_seed(args.seed)
        cfg = SIZES[size]
        corpus = Corpus.load(args.data_dir, source=args.corpus)
        train = Batches(corpus.train, batch_size, cfg.block_size, args.seed)
        val = Batches(corpus.val, batch_size, cfg.block_size, 2)
        val_batches = [val.next(device) for _ in range(args.eval_batches)]
        model = GPT(cfg).to(device)
        gpu = device == "cuda"
        return cls(cfg, model, torch.compile(model), model.adamw(args.lr, 0.1, fused=gpu), train, val_batches, gpu)

    def autocast(self) -> torch.autocast:
        return torch.autocast("cuda" if self.gpu else "cpu", dtype=torch.bfloat16, enabled=self.gpu)


def train_to(
    compiled: torch.nn.Module,
    model: GPT,
    opt: torch.optim.Optimizer,
    train: Batches,
    device: str,
    steps: list[int],
    lr: float,
    autocast: Callable[[], AbstractContextManager],
) -> Iterator[tuple[int, torch.Tensor]]:
    """Train dense, yielding (step, last loss) at each of ``steps`` (ascending): linear warm-up over 5% of
    the last, then cosine to 0.1 x ``lr`` at the last."""
    if not steps or steps[0] < 1:
        raise ValueError(f"steps {steps}: expected ascending steps >= 1 to measure at")
    done = 0
    for target in steps:
        for step in range(done, target):
            for g in opt.param_groups:
                warm = max(1, steps[-1] // 20)
                g["lr"] = lr * min(1.0, (step + 1) / warm) * (0.55 + 0.45 * math.cos(math.pi * step / steps[-1]))
            loss = train_step(compiled, model, opt, *train.next(device), autocast)
        done = target
        yield target, loss


def add_dense_run_args(p: argparse.ArgumentParser, fit_batches: int, fit_help: str, lr: float) -> None:
    """The arguments DenseRun.make and the probes' sampling read: --batch-size, --fit-batches, --eval-batches,
    --lr, --corpus, --data-dir, --seed."""
    p.add_argument("--batch-size", type=int, help="sequences per step (default: 16 CUDA, 8 CPU)")
    p.add_argument("--fit-batches", type=int, default=fit_batches, help=fit_help)
    p.add_argument("--eval-batches", type=int, default=2, help="validation batches the kept mass is measured on")
    p.add_argument("--lr", type=float, default=lr)
    p.add_argument("--corpus", choices=CORPORA, default="packages")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--seed", type=int, default=0)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.cluster_probe", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--size", choices=sorted(SIZES), help="model size (default: 125m on CUDA, tiny on CPU)")
    p.add_argument("--fit-at", default=None, help="steps at which to measure, comma-separated (default: 300,600 CUDA)")
    p.add_argument("--patterns", default="64:2:8,128:2:16,128:2:16c32,128:2:16c64", help="comma-separated patterns")
    add_dense_run_args(p, fit_batches=2, fit_help="training batches the permutation is fitted on", lr=1e-3)
    p.add_argument("--csv", help="write the rows here")
    p.add_argument("--score-rows", default="", help="comma-separated S: the causal pattern scored on S rows too")
    p.add_argument("--no-cluster", action="store_true", help="only the units' own order (and --score-rows)")
    p.add_argument("--tile-union", default="", help="comma-separated V: per-token patterns' tiled work (above)")
    p.add_argument("--routes", default="", help="comma-separated G: --tile-union with tokens routed to G groups")
    p.add_argument("--extras", default="", help="comma-separated R: block patterns with token_extra R (above)")
    args = p.parse_args(argv)
    try:
        score_rows = [int(s) for s in args.score_rows.split(",") if s.strip()]
        tiles = [int(s) for s in args.tile_union.split(",") if s.strip()]
        routes = [int(s) for s in args.routes.split(",") if s.strip()]
        extras = [int(s) for s in args.extras.split(",") if s.strip()]
    except ValueError:
        p.error(f"--score-rows {args.score_rows!r}, --tile-union {args.tile_union!r}, --routes {args.routes!r}, "
                f"--extras {args.extras!r}: expected comma-separated ints")  # fmt: skip
    if extras and (not score_rows or routes or any(r < 1 for r in extras)):
        p.error(f"--extras {args.extras!r}: ints >= 1, with --score-rows (the causal block choice), without --routes")
    if routes and not tiles:
        p.error(f"--routes {args.routes}: needs --tile-union")
    if any(x < 1 for x in tiles + routes):
        p.error(f"--tile-union {args.tile_union!r}, --routes {args.routes!r}: expected ints >= 1")
    gpu = torch.cuda.is_available()
    device = "cuda" if gpu else "cpu"
    size = args.size or ("125m" if gpu else "tiny")
    fit_at = sorted(int(s) for s in (args.fit_at or ("300,600" if gpu else "20,40")).split(","))
    batch_size = args.batch_size or (16 if gpu else 8)
    try:
        patterns = {text: parse_pattern(text) for text in args.patterns.split(",")}
    except ValueError as e:
        p.error(str(e))
    if extras and any(v == 1 for v, n, m, c in patterns.values()):
        p.error(f"--extras: needs block patterns (V > 1), got --patterns {args.patterns}")
    if tiles and not extras and any(v != 1 or n != 4 or c < 2 for v, n, m, c in patterns.values()):
        p.error(f"--tile-union: needs per-token chunk patterns 1:4:McC, got --patterns {args.patterns}")
    env = environment(torch.device(device), "python -m bench.cluster_probe", argv)
    print("\n".join(f"{k}: {v}" for k, v in env.items()))

    run = DenseRun.make(args, size, batch_size, device)
    cfg, model, train, val_batches, autocast = run.cfg, run.model, run.train, run.val_batches, run.autocast
    rows: list[dict] = []
    previous: dict[str, list[torch.Tensor]] = {}
    for step, loss in train_to(run.compiled, model, run.opt, train, device, fit_at, args.lr, autocast):
        fit = hidden(model, [train.next(device) for _ in range(args.fit_batches)], autocast)
        held = hidden(model, val_batches, autocast)
        zeros = sum((h == 0).sum().item() for h in held) / sum(h.numel() for h in held)
        print(f"step {step}: train loss {loss.item():.4f}, H zero fraction {zeros:.3f}", flush=True)
        for text, (v, n, m, c) in patterns.items():
            if score_rows:  # the causal pattern over the model's sequences, scored on all V rows or the last S
                seq = cfg.block_size
                full = [vnm_select(h.float(), v, n, m, c, seq)[0] for h in held]
                for s in [None, *score_rows]:
                    cols = full if s is None else [vnm_select(h.float(), v, n, m, c, seq, s)[0] for h in held]
                    agree = sum((a == b).all(-1).sum().item() for a, b in zip(cols, full, strict=True))
                    agree /= sum(a.shape[0] * a.shape[1] for a in full)
                    name = "causal" if s is None else f"causal, last {s} rows"
                    rows.append({"step": step, "pattern": text, "variant": name,
                                 "kept": kept_mass(held, (v, n, m), c, seq=seq, score=s), "agree": agree})  # fmt: skip
                    print(f"  {text:>12} {name:>22}: kept {rows[-1]['kept']:.4f}, agree {agree:.3f}", flush=True)
                    keeps = [vnm_mask(h.float(), v, n, m, c, seq, s) for h in held] if extras else []
                    for r in extras:  # each token's own r largest units on top of this causal choice
                        kept = kept_mass(held, (v, n, m), c, seq=seq, score=s, extra=r)
                        added = [token_extras(h.float(), k, r) for h, k in zip(held, keeps, strict=True)]
                        for tv in tiles or [v]:
                            work = sum(extra_work(e, tv) for e in added)
                            how = f"{name}, +{r} per token, tiles of {tv}"
                            rows.append({"step": step, "pattern": text, "variant": how, "kept": kept,
                                         "work": work / len(held)})  # fmt: skip
                            print(f"  {text:>12} {how:>40}: kept {kept:.4f}, extra work {work / len(held):.4f}")
            variants = {"identity": None}
            fit_s = 0.0
            if not args.no_cluster:
                t0 = time.perf_counter()
                profiles = [block_mass(h, v) for h in fit]  # fitted where H is (the GPU on CUDA)
                perms = [cluster_units(pr, m, c) for pr in profiles]
                fit_s = time.perf_counter() - t0
                variants["clustered"] = perms
                if c > 1:
                    variants["chunks only"] = [cluster_units(pr, m, c, group=False) for pr in profiles]
                if text in previous:
                    variants["stale (previous fit)"] = previous[text]
                previous[text] = perms
            for name, ps in variants.items():
                kept = kept_mass(held, (v, n, m), c, ps)
                rows.append({"step": step, "pattern": text, "variant": name, "kept": kept,
                             "fit_s": fit_s if name == "clustered" else ""})  # fmt: skip
                print(f"  {text:>12} {name:>22}: kept {kept:.4f}", flush=True)
                if tiles and v == 1 and name in ("identity", "clustered"):  # per-token patterns' layouts
                    units = [h if q is None else h[:, q] for h, q in zip(held, ps or [None] * len(held), strict=True)]
                    fit_units = [h if q is None else h[:, q] for h, q in zip(fit, ps or [None] * len(fit), strict=True)]
                    works = layout_work(units, fit_units, m, c, tiles, [None, *routes])
                    for tv in tiles:
                        for gr in [None, *routes]:
                            how = f"{name}, tiles of {tv}, " + ("sequence order" if gr is None else f"{gr} routes")
                            work = works[(tv, gr)]
                            rows.append({"step": step, "pattern": text, "variant": how, "kept": kept, "work": work})
                            print(f"  {text:>12} {how:>40}: work {work:.4f}", flush=True)
        if args.csv:  # after every step: a run stopped later keeps the steps it measured
            write_csv(args.csv, rows, ["step", "pattern", "variant", "kept", "fit_s", "agree", "work"])
    print(tabulate(rows, headers="keys", tablefmt="github", floatfmt=".4f"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
