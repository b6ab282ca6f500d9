"""python -m bench.ffn: time one squared-ReLU FFN (bias-free Linear -> relu^2 -> Linear), sparse vs dense.

Providers: sparse (torch.compile backend="sparse"), dense-eager, dense-compiled (default Inductor),
and on CUDA the torch 2:4 route a user would try today: both weights pruned and packed by
SparseSemiStructuredTensorCUSPARSELT.prune_dense_static_sort (cuSPARSELt, W and W^T packed, so the
backward's dX runs sparse too; plain to_sparse_semi_structured packs W only and its backward
raises), eager; those weights are frozen tensor subclasses, so its backward computes dX only (no
dW1, dW2: less work than the other rows).
Modes: fwd (forward with autograd state), full (fwd + bwd), bwd = full - fwd. Plus the sparse
path's mask computations alone. Medians of triton.testing.do_bench on CUDA (a timing loop on CPU);
TFLOP/s counts the dense FFN's FLOPs (fwd 4*T*d*h, bwd 8*T*d*h), so sparse and dense compare at
equal work. Every row carries device, versions and git revision; --csv writes them all.
"""

import argparse
import statistics
import sys
import time
from collections.abc import Callable

import torch
import torch.nn as nn
from tabulate import tabulate

import sparse_compile
from bench.env import environment, write_csv
from sparse_compile.config import DEFAULT_PRESET, BackendOptions, options_from_text
from sparse_compile.kernels import transposable_24_mask, vnm_mask

GPU_SHAPES = [(16384, 768, 3072), (16384, 2048, 8192), (16384, 4096, 16384), (4096, 1024, 4096)]
CPU_SHAPES = [(512, 64, 256)]


class FFN(nn.Module):
    def __init__(self, d: int, h: int) -> None:
        super().__init__()
        self.fc = nn.Linear(d, h, bias=False)
        self.proj = nn.Linear(h, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(torch.relu(self.fc(x)).square())


def median_ms(fn: Callable[[], object], device: torch.device, reps: int) -> float:
    if device.type == "cuda":
        import triton.testing

        return triton.testing.do_bench(fn, warmup=25, rep=reps * 10, return_mode="median")
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


TORCH_24 = "torch 2:4 weights (semi-structured, no dW)"


def torch_semi_structured(base: FFN) -> nn.Module | None:
    """A copy of ``base`` with 2:4 weights as SparseSemiStructuredTensor (cuSPARSELt), or None if
    this torch/GPU refuses (the reason is printed)."""
    import copy

    from torch.sparse import SparseSemiStructuredTensorCUSPARSELT

    model = copy.deepcopy(base)
    try:
        for lin in (model.fc, model.proj):
            packed = SparseSemiStructuredTensorCUSPARSELT.prune_dense_static_sort(lin.weight.detach())
            lin.weight = nn.Parameter(packed, requires_grad=False)
        model(
            torch.randn(64, base.fc.in_features, device="cuda", dtype=base.fc.weight.dtype, requires_grad=True)
        ).sum().backward()
    except (RuntimeError, ValueError, NotImplementedError) as e:
        print(f"{TORCH_24}: not run: {e}".splitlines()[0], flush=True)
        return None
    return model


def bench_shape(
    t: int,
    d: int,
    h: int,
    dtype: torch.dtype,
    device: torch.device,
    sparsity: dict[str, dict],
    reps: int,
    compile_mode: str = "default",
) -> list[dict]:
    """Rows for one shape: the dense providers, then "sparse <label>" for each entry of ``sparsity``."""
    torch.manual_seed(0)
    base = FFN(d, h).to(device, dtype)
    nn.init.normal_(base.fc.weight, std=d**-0.5)
    nn.init.normal_(base.proj.weight, std=h**-0.5)
    x = torch.randn(t, d, device=device, dtype=dtype, requires_grad=True)
    gy = torch.randn(t, d, device=device, dtype=dtype)
    providers = {
        "dense-eager": base,
        "dense-compiled": torch.compile(base, mode=None if compile_mode == "default" else compile_mode),
    } | {f"sparse {label}": torch.compile(base, backend="sparse", options=opts) for label, opts in sparsity.items()}
    semi = torch_semi_structured(base) if device.type == "cuda" else None
    if semi is not None:
        providers[TORCH_24] = semi
    n_reports = len(sparse_compile.compile_reports())
    flops = {"fwd": 4 * t * d * h, "bwd": 8 * t * d * h, "full": 12 * t * d * h}
    rows = []
    for name, model in providers.items():
        model(x).backward(gy)  # compile and warm up

        def fwd(model=model):
            return model(x)

        def full(model=model):
            x.grad = None
            model(x).backward(gy)

        # Compiled backward graphs donate buffers (no retain_graph), so bwd = full - fwd.
        ms = {"fwd": median_ms(fwd, device, reps), "full": median_ms(full, device, reps)}
        ms["bwd"] = ms["full"] - ms["fwd"]
        for mode in ("fwd", "bwd", "full"):
            rows.append(
                {
                    "shape": f"{t}x{d}x{h}",
                    "provider": name,
                    "mode": mode,
                    "ms": ms[mode],
                    "tflops": flops[mode] / ms[mode] / 1e9,
                }
            )
    for report in sparse_compile.compile_reports()[n_reports:]:
        print(report, flush=True)
    best_dense = {m: min(r["ms"] for r in rows if r["mode"] == m and r["provider"].startswith("dense")) for m in flops}
    for r in rows:
        r["speedup_vs_best_dense"] = best_dense[r["mode"]] / r["ms"]
    hidden = torch.relu(torch.randn(t, h, device=device, dtype=dtype)).square()
    parts = {}
    for opts in sparsity.values():
        config = BackendOptions.parse(opts).config
        if config.weights:
            parts["transposable_24_mask(W1)"] = lambda: transposable_24_mask(base.fc.weight)
        if config.activation_pattern is not None:
            parts[f"vnm_mask(H, {config.activations})"] = lambda p=config.activation_pattern: vnm_mask(hidden, *p)
    for name, fn in parts.items():
        rows.append(
            {
                "shape": f"{t}x{d}x{h}",
                "provider": name,
                "mode": "part",
                "ms": median_ms(fn, device, reps),
                "tflops": float("nan"),
                "speedup_vs_best_dense": float("nan"),
            }
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.ffn", description=__doc__, formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.add_argument(
        "--shapes",
        help="T,d,h;T,d,h;... (default on CUDA: 16384,768,3072;16384,2048,8192;16384,4096,16384;4096,1024,4096; "
        "on CPU: 512,64,256)",
    )
    p.add_argument(
        "--sparsity",
        action="append",
        help="preset name or JSON options of backend='sparse'; repeat to compare several (default: the default preset)",
    )
    p.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), help="default bf16 on CUDA, fp32 on CPU")
    p.add_argument("--reps", type=int, default=20, help="timed repetitions per row")
    p.add_argument("--csv", help="write every row to this CSV file")
    p.add_argument(
        "--compile-mode",
        choices=("default", "reduce-overhead"),
        default="default",
        help="torch.compile mode of dense-compiled and the sparse rows (reduce-overhead: CUDA graphs)",
    )
    args = p.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = getattr(torch, args.dtype or ("bfloat16" if device.type == "cuda" else "float32"))
    try:
        # every shape runs sparse (the size rule would leave the small ones dense), unless the options say
        texts = args.sparsity or [DEFAULT_PRESET]
        sparsity = {text: {"small_ffn": "sparse", **options_from_text(text)} for text in texts}
        if args.compile_mode != "default":
            sparsity = {k: {**v, "mode": args.compile_mode} for k, v in sparsity.items()}
        for opts in sparsity.values():
            BackendOptions.parse(opts)
        shapes = (
            [tuple(int(v) for v in s.split(",")) for s in args.shapes.split(";")]
            if args.shapes
            else (GPU_SHAPES if device.type == "cuda" else CPU_SHAPES)
        )
        if any(len(s) != 3 for s in shapes):
            raise ValueError(f"--shapes {args.shapes!r}: expected T,d,h triples separated by ';'")
    except ValueError as e:
        p.error(str(e))
    env = environment(device, "python -m bench.ffn", argv)
    print("\n".join(f"{k}: {v}" for k, v in env.items()), f"\nsparsity: {list(sparsity)}, dtype: {dtype}", flush=True)
    rows = []
    for shape in shapes:
        rows += bench_shape(*shape, dtype, device, sparsity, args.reps, args.compile_mode)
        torch._dynamo.reset()
    for r in rows:
        r.update({"dtype": str(dtype).removeprefix("torch."), **env})
    if args.csv:
        write_csv(args.csv, rows)
    cols = ["shape", "provider", "mode", "ms", "tflops", "speedup_vs_best_dense"]
    print(tabulate([[r[c] for c in cols] for r in rows], headers=cols, floatfmt=".3f", tablefmt="github"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
