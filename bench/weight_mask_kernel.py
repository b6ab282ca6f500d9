"""python -m bench.weight_mask_kernel: the Triton transposable 2:4 kernel on a GPU, exact and timed.

For each weight shape and dtype: checks W~ and the mask against the reference bit for bit, then
times both (triton.testing.do_bench medians). Bytes: read W, write W~ (2 x R*C*itemsize). The
ceiling is the measured copy rate (bench/select_kernel.py:copy_gbps).
"""

import argparse
import sys

import torch
import triton.testing
from tabulate import tabulate

from bench.env import environment, write_csv
from bench.select_kernel import copy_gbps
from sparse_compile.kernels import transposable_24_mask
from sparse_compile.kernels.weight_mask_triton import sparsify_24_triton

SHAPES = [(8192, 2048), (2048, 8192), (16384, 4096), (4096, 16384)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.weight_mask_kernel", description=__doc__)
    p.add_argument("--csv", help="write the rows here")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        p.error("needs a CUDA GPU")
    env = environment(torch.device("cuda"), "python -m bench.weight_mask_kernel", argv)
    print("\n".join(f"{k}: {v}" for k, v in env.items()), flush=True)
    ceiling = copy_gbps()
    print(f"measured copy: {ceiling:.0f} GB/s (read + write)", flush=True)
    rows = []
    for shape in SHAPES:
        for dtype in (torch.bfloat16, torch.float32):
            w = torch.randn(shape, device="cuda", dtype=dtype) * 0.02
            got, mask = sparsify_24_triton(w, with_mask=True)
            want = transposable_24_mask(w)
            exact = torch.equal(mask, want) and torch.equal(got, w * want)
            ms = triton.testing.do_bench(lambda w=w: sparsify_24_triton(w), return_mode="median")
            ms_ref = triton.testing.do_bench(lambda w=w: w * transposable_24_mask(w), return_mode="median")
            gbps = 2 * w.numel() * w.element_size() / ms / 1e6
            rows.append(
                {
                    "shape": f"{shape[0]}x{shape[1]}", "dtype": str(dtype).removeprefix("torch."), "exact": exact,
                    "ms": ms, "GB/s": gbps, "of copy": gbps / ceiling, "torch ms": ms_ref, "speedup": ms_ref / ms,
                    "git": env["git"],
                }
            )  # fmt: skip
            print(tabulate(rows[-1:], headers="keys", floatfmt=".3f", tablefmt="github"), flush=True)
    print(tabulate(rows, headers="keys", floatfmt=".3f", tablefmt="github"))
    if args.csv:
        write_csv(args.csv, rows)
    return 0 if all(r["exact"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
