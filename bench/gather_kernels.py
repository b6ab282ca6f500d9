"""python -m bench.gather_kernels: the compact V:N:M kernels on a GPU, checked then timed per GEMM.

Per (T, d, h) and pattern V:N:M (bf16): builds Z, its compact form (h_c, r_c, ids), W1 [h, d],
W2 [d, h], dY [T, d]; checks each kernel at full size against its reference (gather GEMMs in
fp32 through the dense scatter, max error relative to the output's scale; scatter bit-exact),
then times (triton.testing.do_bench medians), side by side in the same run:
  no-gather the same Triton kernel with ids = 0..Kc-1 (contiguous rows: what the gather costs)
  dense     the cuBLAS GEMM the kernel replaces (K or N = h)
  ceiling   cuBLAS on the reduced size, one dense GEMM with Kc = h*4/M (what a perfect gather reaches)
  kernel    F2/B3: gather_k_mm; B1: gather_n_mm with the dZ epilogue; plus scatter and selection
  TMA       the same kernel loading its contiguous operand (c, dY) through a TMA descriptor
  default   the kernel as the FFN calls it (TMA on sm90+; gather_n also persistent, one program per SM)
"of ceiling" = ceiling ms / kernel ms; memory kernels are against the measured copy rate.
"""

import argparse
import sys

import torch
import triton.testing
from tabulate import tabulate

from bench.env import write_csv
from bench.gpu_timing import start_gpu_bench
from sparse_compile.kernels import gather_gemm_triton
from sparse_compile.kernels.activation_select_triton import vnm_select_compact
from sparse_compile.kernels.compact_scatter_triton import vnm_scatter
from sparse_compile.kernels.gather_gemm_triton import gather_k_mm, gather_n_mm
from sparse_compile.kernels.gather_reference import gather_k_mm_ref, gather_n_mm_ref, vnm_scatter_ref
from sparse_compile.planning.measure import max_rel_err

SHAPES = [(16384, 2048, 8192), (16384, 4096, 16384)]
PATTERNS = [(128, 2, 8), (128, 2, 16), (64, 2, 8)]


def _ms(fn) -> float:
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def _tuned(kernel) -> str:
    """The autotuner's choice for the last launched key, e.g. '128x256x64 s5 w8'."""
    c = kernel.best_config
    return f"{c.kwargs['BLOCK_M']}x{c.kwargs['BLOCK_N']}x{c.kwargs['BLOCK_K']} s{c.num_stages} w{c.num_warps}"


def bench_one(t: int, d: int, h: int, v: int, n: int, m: int, copy: float) -> list[dict]:
    g = torch.Generator(device="cuda").manual_seed(0)
    bf = torch.bfloat16
    z = torch.randn(t, h, device="cuda", dtype=bf, generator=g)
    w2t = (torch.randn(h, d, device="cuda", generator=g) * h**-0.5).to(bf)  # W2^T, contiguous [h, d]
    w2 = w2t.t().contiguous()
    dy = torch.randn(t, d, device="cuda", dtype=bf, generator=g)
    h_c, r_c, ids = vnm_select_compact(z, None, v, n, m)
    kc = h_c.shape[1]
    want_k, want_n = gather_k_mm_ref(h_c, ids, w2t, v), gather_n_mm_ref(dy, w2t, ids, v, r_c)
    variants = [{"tma": False}, {"tma": True}]
    checks = {  # the worst of the pointer, TMA (and persistent) variants
        "F2/B3 gather_k": max(max_rel_err(gather_k_mm(h_c, ids, w2t, v, **kw), want_k) for kw in variants),
        "B1 gather_n+dZ": max(
            max_rel_err(gather_n_mm(dy, w2t, ids, v, r_c, persistent=p, **kw), want_n)
            for kw in variants
            for p in (False, True)
        ),
        "scatter": float(not torch.equal(vnm_scatter(r_c, ids, v, m), vnm_scatter_ref(r_c, ids, v, h))),
    }
    dense_h = torch.randn(t, h, device="cuda", dtype=bf, generator=g)
    w2t_k = w2t[:kc].contiguous()
    first = torch.arange(kc, device="cuda", dtype=torch.int32).expand(t // v, kc).contiguous()
    gemm = {  # name: (dense, ceiling, kernel, the kernel with TMA for its contiguous operand, the kernel
        #                with its defaults, kernel on the first Kc rows (no gather), flops, Triton kernel)
        "F2/B3 gather_k": (
            lambda: dense_h @ w2t,
            lambda: h_c @ w2t_k,
            lambda: gather_k_mm(h_c, ids, w2t, v, tma=False),
            lambda: gather_k_mm(h_c, ids, w2t, v, tma=True),
            lambda: gather_k_mm(h_c, ids, w2t, v),
            lambda: gather_k_mm(h_c, first, w2t, v, tma=False),
            2 * t * kc * d,
            gather_gemm_triton._gather_k_kernel,
        ),
        "B1 gather_n+dZ": (
            lambda: dy @ w2,
            lambda: dy @ w2t_k.t(),
            lambda: gather_n_mm(dy, w2t, ids, v, r_c, tma=False, persistent=False),
            lambda: gather_n_mm(dy, w2t, ids, v, r_c, tma=True, persistent=False),
            lambda: gather_n_mm(dy, w2t, ids, v, r_c),
            lambda: gather_n_mm(dy, w2t, first, v, r_c, tma=False, persistent=False),
            2 * t * kc * d,
            gather_gemm_triton._gather_n_kernel,
        ),
    }
    shape = f"{t}x{d}x{h}"
    pattern = f"{v}:{n}:{m}"
    rows = []
    for name, (dense, ceiling, kernel, kernel_tma, default, no_gather, flops, triton_kernel) in gemm.items():
        ms_d, ms_c, ms_k = _ms(dense), _ms(ceiling), _ms(kernel)
        config = _tuned(triton_kernel)
        ms_t = _ms(kernel_tma)
        config_t = _tuned(triton_kernel)
        ms_default = _ms(default)
        config_default = _tuned(triton_kernel)
        ms_n = _ms(no_gather)
        rows.append(
            {
                "shape": shape, "pattern": pattern, "kernel": name, "max rel err": checks[name],
                "ms": ms_k, "TFLOP/s": flops / ms_k / 1e9, "dense ms": ms_d, "ceiling ms": ms_c,
                "of ceiling": ms_c / ms_k, "vs dense": ms_d / ms_k, "no-gather ms": ms_n, "config": config,
                "TMA ms": ms_t, "TMA of ceiling": ms_c / ms_t, "TMA config": config_t,
                "default ms": ms_default, "default of ceiling": ms_c / ms_default, "default config": config_default,
            }
        )  # fmt: skip
    memory = {  # name: (fn, bytes moved, error)
        "scatter": (lambda: vnm_scatter(r_c, ids, v, m), t * kc * 2 + t * h * 2, checks["scatter"]),
        "select": (lambda: vnm_select_compact(z, None, v, n, m), t * h * 2 + 2 * t * kc * 2, 0.0),
    }
    for name, (fn, nbytes, err) in memory.items():
        ms_k = _ms(fn)
        rows.append(
            {
                "shape": shape, "pattern": pattern, "kernel": name, "max rel err": err, "ms": ms_k,
                "GB/s": nbytes / ms_k / 1e6, "of ceiling": nbytes / ms_k / 1e6 / copy,
            }
        )  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.gather_kernels", description=__doc__)
    p.add_argument("--shapes", help="T,d,h;... (default: 16384,2048,8192;16384,4096,16384)")
    p.add_argument("--patterns", help="V:N:M,... (default: 128:2:8,128:2:16,64:2:8)")
    p.add_argument("--csv", help="write the rows here")
    args = p.parse_args(argv)
    shapes = [tuple(map(int, s.split(","))) for s in args.shapes.split(";")] if args.shapes else SHAPES
    patterns = [tuple(map(int, s.split(":"))) for s in args.patterns.split(",")] if args.patterns else PATTERNS
    env, copy = start_gpu_bench(p, "python -m bench.gather_kernels", argv)
    rows = []
    for shape in shapes:
        for pattern in patterns:
            rows += bench_one(*shape, *pattern, copy)
            print(tabulate(rows[-4:], headers="keys", floatfmt=".3f", tablefmt="github"), flush=True)
    keys = list(dict.fromkeys(k for r in rows for k in r))
    print(tabulate([[r.get(k, "") for k in keys] for r in rows], headers=keys, floatfmt=".3f", tablefmt="github"))
    if args.csv:
        write_csv(args.csv, [{**r, "git": env["git"]} for r in rows], keys + ["git"])
    bad = [r for r in rows if r["max rel err"] > 2e-2]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
