"""python -m bench.weight_mask_kernel: the Triton transposable 2:4 kernel on a GPU, exact and timed.

For each weight shape, dtype and kernel ("pairs", the default, and the first "dot" version):
checks W~ and the mask against the reference bit for bit, then times both (triton.testing.do_bench
medians). Bytes: read W, write W~ (2 x R*C*itemsize). The
ceiling is the measured copy rate (bench/gpu_timing.py:copy_gbps).
"""

import argparse
import functools
import sys

import torch
import triton.testing
from tabulate import tabulate

from bench.env import write_csv
from bench.gpu_timing import start_gpu_bench, sweep_tilings
from sparse_compile.kernels import transposable_24_mask
from sparse_compile.kernels.weight_mask_triton import sparsify_24_triton

SHAPES = [(8192, 2048), (2048, 8192), (16384, 4096), (4096, 16384)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.weight_mask_kernel", description=__doc__)
    p.add_argument("--csv", help="write the rows here")
    p.add_argument(
        "--sweep",
        action="store_true",
        help="also time (tiles, num_warps) of the pairs kernel, bf16 and fp32 16384x4096",
    )
    args = p.parse_args(argv)
    env, ceiling = start_gpu_bench(p, "python -m bench.weight_mask_kernel", argv)
    rows = []
    for shape in SHAPES:
        for dtype in (torch.bfloat16, torch.float32):
            w = torch.randn(shape, device="cuda", dtype=dtype) * 0.02
            want = transposable_24_mask(w)
            ms_ref = triton.testing.do_bench(lambda w=w: w * transposable_24_mask(w), return_mode="median")
            for method in ("pairs", "dot"):
                got, mask = sparsify_24_triton(w, with_mask=True, method=method)
                exact = torch.equal(mask, want) and torch.equal(got, w * want)
                ms = triton.testing.do_bench(
                    lambda w=w, m=method: sparsify_24_triton(w, method=m), return_mode="median"
                )
                gbps = 2 * w.numel() * w.element_size() / ms / 1e6
                rows.append(
                    {
                        "shape": f"{shape[0]}x{shape[1]}", "dtype": str(dtype).removeprefix("torch."), "method": method,
                        "exact": exact, "ms": ms, "GB/s": gbps, "of copy": gbps / ceiling, "torch ms": ms_ref,
                        "speedup": ms_ref / ms, "git": env["git"],
                    }
                )  # fmt: skip
                print(tabulate(rows[-1:], headers="keys", floatfmt=".3f", tablefmt="github"), flush=True)
    if args.sweep:
        for dtype in (torch.bfloat16, torch.float32):
            w = torch.randn(16384, 4096, device="cuda", dtype=dtype) * 0.02
            want = w * transposable_24_mask(w)
            configs = [{"tiles": t, "num_warps": nw} for t in (32, 64, 128, 256) for nw in (1, 2, 4, 8) if t >= 32 * nw]
            sweep = sweep_tilings(
                functools.partial(sparsify_24_triton, w),
                configs,
                lambda got, want=want: torch.equal(got, want),
                2 * w.numel() * w.element_size(),
                ceiling,
                dtype=str(dtype).removeprefix("torch."),
            )
            print(tabulate(sweep, headers="keys", floatfmt=".3f", tablefmt="github"), flush=True)
    print(tabulate(rows, headers="keys", floatfmt=".3f", tablefmt="github"))
    if args.csv:
        write_csv(args.csv, rows)
    return 0 if all(r["exact"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
