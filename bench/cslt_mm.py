"""python -m bench.cslt_mm: F1 = X W1^T with 2:4 W1 through cuSPARSELt vs dense cuBLAS, and the compressor.

For each (T, d, h): W1 [h, d] bf16 with a random 2:4 pattern along d, X [T, d]. Dense: X @ W1^T
(torch.mm, cuBLAS). Sparse: torch._cslt_sparse_mm(compress(W1), X^T, transpose_result=True), which
computes (W1 X^T)^T = Z [T, h], for every algorithm id cuSPARSELt offers at that shape (each checked
against the dense product: some ids are known to be wrong) and the one _cslt_sparse_mm_search picks.
Also times torch._cslt_compress on W1 and on a [T, h] activation. Medians of do_bench, one GPU.
"""

import argparse
import sys

import torch
import triton.testing
from tabulate import tabulate

from bench.env import environment, write_csv


def random_24(rows: int, cols: int, gen: torch.Generator) -> torch.Tensor:
    """[rows, cols] bf16 normal values, 2 of every 4 along cols kept at random positions."""
    w = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16, generator=gen)
    keep = torch.rand(rows, cols // 4, 4, device="cuda", generator=gen).argsort(-1).argsort(-1) < 2
    return w * keep.reshape(rows, cols)


def bench_shape(t: int, d: int, h: int, git: str) -> list[dict]:
    gen = torch.Generator("cuda").manual_seed(0)
    w = random_24(h, d, gen)
    x = torch.randn(t, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    want = x @ w.t()
    dense_ms = triton.testing.do_bench(lambda: x @ w.t(), return_mode="median")
    flops = 2 * t * d * h
    rows = [{"T": t, "d": d, "h": h, "what": "dense mm", "alg": "", "ok": True, "ms": dense_ms,
             "TFLOP/s": flops / dense_ms / 1e9, "vs dense": 1.0, "git": git}]  # fmt: skip
    wc = torch._cslt_compress(w)
    xt = x.t()
    best = torch._cslt_sparse_mm_search(wc, xt, transpose_result=True)
    for alg in range(16):
        try:
            got = torch._cslt_sparse_mm(wc, xt, transpose_result=True, alg_id=alg)
        except RuntimeError:
            break
        ok = got.shape == want.shape and torch.allclose(got.float(), want.float(), rtol=2e-2, atol=2e-1)
        ms = triton.testing.do_bench(lambda a=alg: torch._cslt_sparse_mm(wc, xt, transpose_result=True, alg_id=a),
                                     return_mode="median")  # fmt: skip
        rows.append({"T": t, "d": d, "h": h, "what": "cslt 2:4 W1" + (" (search)" if alg == best else ""),
                     "alg": alg, "ok": ok, "ms": ms, "TFLOP/s": flops / ms / 1e9, "vs dense": dense_ms / ms,
                     "git": git})  # fmt: skip
    copy = lambda n: 2 * n * 2  # noqa: E731  read + write of n bf16 elements
    for name, a in (("compress W1 [h, d]", w), ("compress Z [T, h]", random_24(t, h, gen))):
        ms = triton.testing.do_bench(lambda a=a: torch._cslt_compress(a), return_mode="median")
        rows.append({"T": t, "d": d, "h": h, "what": name, "alg": "", "ok": True, "ms": ms,
                     "TFLOP/s": copy(a.numel()) / ms / 1e9, "vs dense": "GB/s in TFLOP/s column",
                     "git": git})  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.cslt_mm", description=__doc__)
    p.add_argument("--shapes", default="16384,2048,8192;16384,4096,16384;4096,1024,4096", help="T,d,h;...")
    p.add_argument("--csv", help="write the rows here")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        p.error("needs a CUDA GPU")
    env = environment(torch.device("cuda"), "python -m bench.cslt_mm", argv)
    print("\n".join(f"{k}: {v}" for k, v in env.items()), flush=True)
    rows = []
    for shape in args.shapes.split(";"):
        t, d, h = (int(s) for s in shape.split(","))
        rows += bench_shape(t, d, h, env["git"])
    print(tabulate(rows, headers="keys", floatfmt=".3f", tablefmt="github"))
    if args.csv:
        write_csv(args.csv, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
