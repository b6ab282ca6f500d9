"""python -m bench.grouped_chunks: the GEMM time of a per-token chunk choice run as grouped GEMMs
(MoE-style: each chunk of C hidden units is an "expert", each token keeps k = h / (4 C) of them),
forward and backward of one FFN, beside the dense FFN's six GEMMs in the same process (CUDA, bf16).

The per-chunk FFN is the library's grouped path (kernels/ffn_grouped.py: the rows sorted by chunk,
torch._grouped_mm per chunk, each token's rows summed back), timed with its row sort. A chunk's GEMM
has C columns (F1, dH) or an inner dimension of C (F2, dX): the intensity of a chunk GEMM is about
C FLOP per byte of its token rows, so small chunks are bound by memory, not FLOPs.
The routing here is random (each token k distinct chunks), which balances the chunks' row counts;
with --score-units r each token's chunks come instead from SparsityConfig.score_units' choice (4 of
every 16 chunks ranked on the token's H over each chunk's first r units: one more GEMM, T x d x E r,
and a sort of each run of 16), timed in the call as the library's op runs it.
"""

import argparse
import functools
import sys

import torch

from bench.ffn import median_ms
from bench.gpu_timing import start_gpu_bench
from sparse_compile.kernels.ffn_grouped import choice_mask, chunk_choice, grouped_ffn_backward, grouped_ffn_forward

Grads = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]  # Y, dX, dW1, dW2


def dense_ffn(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, dy: torch.Tensor) -> Grads:
    """The dense FFN's six GEMMs: Y = relu(X W1^T)^2 W2^T, and dX, dW1, dW2 from dY."""
    z = x @ w1.t()
    hh = torch.relu(z).square()
    y = hh @ w2.t()
    dh = dy @ w2
    dw2 = dy.t() @ hh
    dz = dh * 2 * torch.relu(z)
    return y, dz @ w1, dz.t() @ x, dw2


def masked_ffn(
    x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, dy: torch.Tensor, choice: torch.Tensor, e: int
) -> Grads:
    """The reference: dense math in float32 with each token's H kept on its chosen chunks only
    (``choice`` [T, k] ids of the e chunks of C = h / e units), the straight-through mask of the op."""
    h = w1.shape[0]
    keep = choice_mask(choice, h, h // e)
    x, w1, w2, dy = x.float(), w1.float(), w2.float(), dy.float()
    z = x @ w1.t()
    hh = torch.relu(z).square() * keep
    dz = (dy @ w2) * keep * 2 * torch.relu(z)
    return hh @ w2.t(), dz @ w1, dz.t() @ x, dy.t() @ hh


def grouped_ffn(
    x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, dy: torch.Tensor, choice: torch.Tensor, c: int
) -> Grads:
    """Forward and backward of the per-token chunk FFN on torch._grouped_mm (kernels/ffn_grouped.py, the
    library's grouped path: the row sort included) on each token's ``choice`` [T, k] of the chunks of
    c units. Returns Y, dX and the full dW1 [h, d], dW2 [d, h]."""
    y, rp, src, offs, inv = grouped_ffn_forward(x, w1, None, w2, None, choice, c)
    dx, dw1, _, dw2, _ = grouped_ffn_backward(dy, x, w1, w2, rp, src, offs, inv, c)
    return y, dx, dw1, dw2


def scored_grouped_ffn(x, w1, w2, dy, m: int, c: int, r: int) -> Grads:
    """The score_units choice (chunk_choice: F1 on each chunk's first r units, 4 of every m) and
    grouped_ffn in one call, as the library's op runs them."""
    return grouped_ffn(x, w1, w2, dy, chunk_choice(x, w1, None, m, c, r), c)


def random_choice(t: int, e: int, k: int, device: torch.device) -> torch.Tensor:
    """Each token's k distinct chunks of e, uniformly at random (balanced chunk row counts)."""
    return torch.rand(t, e, device=device).topk(k, dim=1).indices


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.grouped_chunks", description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=16384)
    p.add_argument("--d", type=int, default=2048)
    p.add_argument("--hidden", type=int, default=8192)
    p.add_argument("--chunks", default="32,64,128,256,512")
    p.add_argument("--reps", type=int, default=20, help="median over reps x 10 ms of calls")
    p.add_argument("--profile", action="store_true", help="print each chunk size's CUDA kernels by total time")
    p.add_argument(
        "--score-units", type=int, default=None, metavar="R",
        help="choose each token's 4 of every 16 chunks on its H over each chunk's first R units, timed in the call",
    )  # fmt: skip
    a = p.parse_args(argv)
    for c in (int(s) for s in a.chunks.split(",")):
        if a.score_units is not None and not (a.hidden % (16 * c) == 0 and 1 <= a.score_units < c):
            p.error(
                f"--score-units {a.score_units} with chunks of {c}: needs hidden {a.hidden} a multiple of 16 chunks "
                f"and R in [1, {c - 1}]"
            )
    start_gpu_bench(p, "python -m bench.grouped_chunks", argv)
    dev, dt = torch.device("cuda"), torch.bfloat16
    t, d, h = a.tokens, a.d, a.hidden
    x, dy = torch.randn(t, d, device=dev, dtype=dt), torch.randn(t, d, device=dev, dtype=dt)
    w1 = torch.randn(h, d, device=dev, dtype=dt) / d**0.5
    w2 = torch.randn(d, h, device=dev, dtype=dt) / h**0.5
    dense = median_ms(functools.partial(dense_ffn, x, w1, w2, dy), dev, a.reps)
    print(f"T={t} d={d} h={h}, keep 1/4")
    print(f"dense FFN fwd+bwd: {dense:.3f} ms ({6 * 2 * t * d * h / dense / 1e9:.0f} TFLOP/s)")
    print("chunk,k,grouped_ms,dense_ms,speedup_vs_dense,max_rel_err")
    for c in (int(s) for s in a.chunks.split(",")):
        e, k = h // c, h // (4 * c)
        if a.score_units is None:
            choice = random_choice(t, e, k, dev)
            run = functools.partial(grouped_ffn, x, w1, w2, dy, choice, c)
        else:
            choice = chunk_choice(x, w1, None, 16, c, a.score_units)
            run = functools.partial(scored_grouped_ffn, x, w1, w2, dy, 16, c, a.score_units)
        ref = masked_ffn(x, w1, w2, dy, choice, e)
        err = max(((g.float() - r).norm() / r.norm()).item() for g, r in zip(run(), ref, strict=True))
        ms = median_ms(run, dev, a.reps)
        print(f"{c},{k},{ms:.3f},{dense:.3f},{dense / ms:.3f},{err:.1e}")
        if a.profile:
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                for _ in range(5):
                    run()
                torch.cuda.synchronize()
            print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12, max_name_column_width=60))


if __name__ == "__main__":
    main(sys.argv[1:])
