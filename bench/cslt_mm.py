"""python -m bench.cslt_mm: F1 = X W1^T with 2:4 W1 through cuSPARSELt vs dense cuBLAS, and the compressor.

For each (T, d, h): W1 [h, d] bf16 with a random 2:4 pattern along d, X [T, d]. Dense: X @ W1^T
(torch.mm, cuBLAS). Sparse: torch._cslt_sparse_mm(compress(W1), X^T, transpose_result=True), which
computes (W1 X^T)^T = Z [T, h], for every algorithm id cuSPARSELt offers at that shape (each checked
against the dense product: some ids are known to be wrong) and the one _cslt_sparse_mm_search picks.
Also times the compressors on W1 and on a [T, h] 2:4 activation: torch._cslt_compress and the Triton
kernel (kernels/cslt_compress_triton.py; checked bit-identical to it), with GB/s (read 2 bytes,
write 1.125 bytes per element) and the fraction of the measured copy rate. Medians of do_bench.
The speedup column is over dense mm for the GEMM rows, over torch._cslt_compress for the others.
"""

import argparse
import functools
import sys

import torch
import triton.testing
from tabulate import tabulate

from bench.env import write_csv
from bench.gpu_timing import start_gpu_bench, sweep_tilings
from sparse_compile.kernels.cslt_compress_triton import cslt_compress_triton, random_24
from sparse_compile.planning.measure import MAX_ALGS


def bench_shape(t: int, d: int, h: int, git: str, ceiling: float) -> list[dict]:
    gen = torch.Generator("cuda").manual_seed(0)
    w = random_24(h, d, gen, torch.bfloat16)
    x = torch.randn(t, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    want = x @ w.t()
    dense_ms = triton.testing.do_bench(lambda: x @ w.t(), return_mode="median")
    flops = 2 * t * d * h
    rows = [{"T": t, "d": d, "h": h, "what": "dense mm", "alg": "", "ok": True, "ms": dense_ms,
             "TFLOP/s": flops / dense_ms / 1e9, "speedup": 1.0, "git": git}]  # fmt: skip
    wc = torch._cslt_compress(w)
    xt = x.t()
    best = torch._cslt_sparse_mm_search(wc, xt, transpose_result=True)
    print(f"({t}, {d}, {h}): _cslt_sparse_mm_search picks alg {best}", flush=True)
    for alg in range(MAX_ALGS):
        try:
            got = torch._cslt_sparse_mm(wc, xt, transpose_result=True, alg_id=alg)
        except RuntimeError:
            break
        ok = got.shape == want.shape and torch.allclose(got.float(), want.float(), rtol=2e-2, atol=2e-1)
        ms = triton.testing.do_bench(lambda a=alg: torch._cslt_sparse_mm(wc, xt, transpose_result=True, alg_id=a),
                                     return_mode="median")  # fmt: skip
        rows.append({"T": t, "d": d, "h": h, "what": "cslt 2:4 W1" + (" (search)" if alg == best else ""),
                     "alg": alg, "ok": ok, "ms": ms, "TFLOP/s": flops / ms / 1e9, "speedup": dense_ms / ms,
                     "git": git})  # fmt: skip
    for name, a in (("W1 [h, d]", w), ("Z [T, h]", random_24(t, h, gen, torch.bfloat16))):
        nbytes = a.numel() * (2 + 1.125)
        ms_torch = triton.testing.do_bench(lambda a=a: torch._cslt_compress(a), return_mode="median")
        exact = torch.equal(cslt_compress_triton(a).view(torch.int16), torch._cslt_compress(a).view(torch.int16))
        ms = triton.testing.do_bench(lambda a=a: cslt_compress_triton(a), return_mode="median")
        for what, t_ms, ok in (("_cslt_compress", ms_torch, True), ("Triton compress", ms, exact)):
            rows.append({"T": t, "d": d, "h": h, "what": f"{what} {name}", "alg": "", "ok": ok, "ms": t_ms,
                         "GB/s": nbytes / t_ms / 1e6, "of copy": nbytes / t_ms / 1e6 / ceiling,
                         "speedup": ms_torch / t_ms, "git": git})  # fmt: skip
    return rows


def sweep_compress(ceiling: float) -> list[dict]:
    """The Triton compressor's tilings on a random 2:4 16384 x 16384 bf16 tensor, each checked
    bit-identical to torch._cslt_compress."""
    z = random_24(16384, 16384, torch.Generator("cuda").manual_seed(1), torch.bfloat16)
    want = torch._cslt_compress(z).view(torch.int16)
    configs = [{"tiles": t, "num_warps": nw} for t in (2, 4, 8, 16) for nw in (2, 4, 8)]
    return sweep_tilings(
        functools.partial(cslt_compress_triton, z),
        configs,
        lambda got: torch.equal(got.view(torch.int16), want),
        z.numel() * 3.125,
        ceiling,
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.cslt_mm", description=__doc__)
    p.add_argument("--shapes", default="16384,2048,8192;16384,4096,16384;4096,1024,4096", help="T,d,h;...")
    p.add_argument("--csv", help="write the rows here")
    p.add_argument(
        "--sweep", action="store_true", help="also time the compressor's (tiles, num_warps) on a 16384 x 16384 Z"
    )
    args = p.parse_args(argv)
    env, ceiling = start_gpu_bench(p, "python -m bench.cslt_mm", argv)
    rows = []
    for shape in args.shapes.split(";"):
        t, d, h = (int(s) for s in shape.split(","))
        rows += bench_shape(t, d, h, env["git"], ceiling)
    print(tabulate(rows, headers="keys", floatfmt=".3f", tablefmt="github"))
    if args.sweep:
        print(tabulate(sweep_compress(ceiling), headers="keys", floatfmt=".3f", tablefmt="github"))
    if args.csv:
        write_csv(args.csv, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
