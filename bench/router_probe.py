"""python -m bench.router_probe: which router keeps the most of each token's mass on held-out tokens?

Trains the project's GPT dense (bench.cluster_probe's data, optimizer and schedule, bf16 autocast on
CUDA) and, at each --fit-at step, fits every routed configuration (SparsityConfig.routes) with every
router (SparsityConfig.router) as sparse_compile.recluster() would: on a sample of --sample-rows rows
of x and H = relu(x W1^T + b1)^2 drawn evenly from --fit-batches training batches, per layer
(sparse_compile.route_fit.fit_routes). Then, on held-out validation batches, all layers pooled:
- kept: the fraction of sum H that the routed tokens keep (each token its router's group);
- oracle: the same with each token in the group keeping most of its H (the bound of those groups);
- agree: the fraction of tokens the router sends to that group;
- fit_s: the seconds of the fits.

Among routed training runs refitted alike (bench/RESULTS.md, 6b, 4096 sampled rows) the sparse phase's
kept mass ranks the final losses. This probe measures a dense-trained model, not the model a sparse phase
trains: it ranked the weighted router above the representatives as training did, and the linear router
above both, which training did not (6b). Configurations are
G@V:4:McC, e.g. 32@32:4:16c64 is {"activations": "32:4:16", "chunk": 64, "routes": 32}. Writes a
tabulate table and --csv.
"""

import argparse
import sys
import time

import torch
from tabulate import tabulate

from bench.cluster_probe import DenseRun, add_dense_run_args, hidden_and_inputs, parse_pattern, train_to
from bench.env import environment, write_csv
from bench.model import SIZES
from sparse_compile.contract import ROUTERS
from sparse_compile.ops import routes
from sparse_compile.route_fit import RouteFit, fit_routes, kept_by_group


def parse_routes(text: str) -> tuple[int, int, int, int]:
    """'32@32:4:16c64' -> (G, V, M, c) = (32, 32, 16, 64)."""
    groups, _, pattern = text.partition("@")
    try:
        g = int(groups)
        v, n, m, c = parse_pattern(pattern)
    except ValueError:
        raise ValueError(f"routes {text!r}: expected G@V:4:McC (for example 32@32:4:16c64)") from None
    if n != 4 or g < 2 or c < 2 or v < 2:
        raise ValueError(f"routes {text!r}: expected G >= 2 groups of V:4:M activations, V > 1, in chunks c > 1")
    return g, v, m, c


@torch.no_grad()
def measure(
    fit: RouteFit, router: str, x: torch.Tensor, h: torch.Tensor, pattern: tuple[int, int, int], c: int
) -> tuple[float, ...]:
    """(mass kept, mass the groups' oracle keeps, total mass, tokens routed to their best group) of held-out
    rows x [T, d], h [T, F] (units in their own order) under ``router`` with ``fit``'s state, routed as the op
    routes them (a site holding the fit: sparse_compile/ops/routes.route_of_rows)."""
    site = routes.RouteSite(fit.groups.shape[0], pattern, c, perm=fit.perm, groups=fit.groups, rep=fit.rep,
                            lin=fit.lin, router=router)  # fmt: skip
    hp = h.float()[:, fit.perm]  # the op's unit order
    u = hp.reshape(h.shape[0], -1, pattern[2], c).sum(dim=3)  # [T, runs, M] chunk masses
    by_group = kept_by_group(u, fit.groups)  # [T, G]
    best = by_group.argmax(dim=1)
    route = routes.route_of_rows(site, x, h, hp)
    kept = by_group.gather(1, route[:, None]).sum()
    return float(kept), float(by_group.max(dim=1).values.sum()), float(u.sum()), float((route == best).sum())


def evenly(t: torch.Tensor, rows: int) -> torch.Tensor:
    """At most ``rows`` rows of t, every len(t) // rows-th (as a probed routed call samples them)."""
    return t[:: max(1, t.shape[0] // rows)][:rows]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.router_probe", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--size", choices=sorted(SIZES), help="model size (default: 125m-d1024 on CUDA, tiny on CPU)")
    p.add_argument("--fit-at", default=None, help="steps at which to fit and measure (default: 1200 CUDA, 20 CPU)")
    p.add_argument("--routes", default="32@32:4:16c64", help="comma-separated G@V:4:McC configurations")
    p.add_argument("--routers", default=",".join(ROUTERS), help=f"comma-separated, of {', '.join(ROUTERS)}")
    p.add_argument("--sample-rows", type=int, default=4096, help="rows of x and H each fit sees, per layer")
    add_dense_run_args(p, fit_batches=1, fit_help="training batches the sample is drawn from", lr=5e-4)
    p.add_argument("--csv", help="write the rows here")
    args = p.parse_args(argv)
    try:
        configs = {text: parse_routes(text) for text in args.routes.split(",")}
    except ValueError as e:
        p.error(str(e))
    routers = [r for r in args.routers.split(",") if r]
    if not routers or any(r not in ROUTERS for r in routers):
        p.error(f"--routers {args.routers!r}: expected comma-separated names of {', '.join(ROUTERS)}")
    if args.sample_rows < 2:
        p.error(f"--sample-rows {args.sample_rows}: expected an int >= 2")
    gpu = torch.cuda.is_available()
    device = "cuda" if gpu else "cpu"
    size = args.size or ("125m-d1024" if gpu else "tiny")
    try:
        fit_at = sorted(int(s) for s in (args.fit_at or ("1200" if gpu else "20")).split(","))
    except ValueError:
        fit_at = []
    if not fit_at or fit_at[0] < 1:
        p.error(f"--fit-at {args.fit_at!r}: expected comma-separated steps >= 1")
    env = environment(torch.device(device), "python -m bench.router_probe", argv)
    print("\n".join(f"{k}: {v}" for k, v in env.items()))

    run = DenseRun.make(args, size, args.batch_size or (16 if gpu else 8), device)
    rows: list[dict] = []
    for step, loss in train_to(run.compiled, run.model, run.opt, run.train, device, fit_at, args.lr, run.autocast):
        fit_batches = [run.train.next(device) for _ in range(args.fit_batches)]
        fit_h, fit_x = hidden_and_inputs(run.model, fit_batches, run.autocast)
        held_h, held_x = hidden_and_inputs(run.model, run.val_batches, run.autocast)
        if gpu:  # the routed op receives x in autocast's dtype
            fit_x, held_x = ([x.to(torch.bfloat16) for x in xs] for xs in (fit_x, held_x))
        print(f"step {step}: train loss {loss.item():.4f}", flush=True)
        for text, (g, v, m, c) in configs.items():
            for router in routers:
                sums = [0.0] * 4  # kept, oracle, total, tokens at their best group; over the layers
                fit_s = 0.0
                for xs, hs, xh, hh in zip(fit_x, fit_h, held_x, held_h, strict=True):
                    t0 = time.perf_counter()
                    fit = fit_routes(evenly(xs, args.sample_rows).float(), evenly(hs, args.sample_rows), g, m, c,
                                     router=router)  # fmt: skip
                    if gpu:
                        torch.cuda.synchronize()
                    fit_s += time.perf_counter() - t0
                    sums = [a + b for a, b in zip(sums, measure(fit, router, xh, hh, (v, 4, m), c), strict=True)]
                kept, oracle, total, at_best = sums
                agree = at_best / sum(hh.shape[0] for hh in held_h)
                row = {"step": step, "routes": text, "router": router, "kept": kept / total, "oracle": oracle / total,
                       "agree": agree, "fit_s": fit_s}  # fmt: skip
                rows.append(row)
                print(f"  {text:>16} {router:>16}: kept {row['kept']:.4f} (groups' oracle {row['oracle']:.4f}), "
                      f"agree {agree:.3f}, fit {fit_s:.1f} s", flush=True)  # fmt: skip
        if args.csv:  # after every step: a run stopped later keeps the steps it measured
            write_csv(args.csv, rows, ["step", "routes", "router", "kept", "oracle", "agree", "fit_s"])
    print(tabulate(rows, headers="keys", tablefmt="github", floatfmt=".4f"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
