"""python -m bench.grouped_chunks: the GEMM time of a per-token chunk choice run as grouped GEMMs
(MoE-style: each chunk of C hidden units is an "expert", each token keeps k = h / (4 C) of them),
forward and backward of one FFN, beside the dense FFN's six GEMMs in the same process (CUDA, bf16).

Per FFN with T tokens, d model, h hidden, rows R = T k sorted by chunk (offsets per chunk):
  forward   Xp = X[src] (R x d); Zp = Xp W1c^T per chunk (R x C); Hp = relu(Zp)^2;
            Yp = Hp W2c^T per chunk (R x d); Y = sum of each token's k rows of Yp
  backward  dYp = dY[src]; dHp = dYp W2c (R x C); dZp = 2 relu(Zp) dHp;
            dW2c = dYp^T Hp and dW1c = dZp^T Xp per chunk (offsets along R);
            dXp = dZp W1c (R x d); dX = sum of each token's k rows of dXp
A chunk's GEMM has C columns (F1, dH) or an inner dimension of C (F2, dX): the intensity of a chunk
GEMM is about C FLOP per byte of its token rows, so small chunks are bound by memory, not FLOPs.
The routing here is random (each token k distinct chunks), which balances the chunks' row counts;
with --score-units r each token's chunks come instead from SparsityConfig.score_units' choice (4 of
every 16 chunks ranked on the token's H over each chunk's first r units: one more GEMM, T x d x E r,
and a top-4), timed with the routing and the grouped GEMMs as the call a kernel would make.
"""

import argparse
import functools
import sys

import torch

from bench.ffn import median_ms
from bench.gpu_timing import start_gpu_bench

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
    t, h = x.shape[0], w1.shape[0]
    keep = torch.zeros(t, e, dtype=torch.bool, device=x.device).scatter_(1, choice, True)
    keep = keep.repeat_interleave(h // e, dim=1)
    x, w1, w2, dy = x.float(), w1.float(), w2.float(), dy.float()
    z = x @ w1.t()
    hh = torch.relu(z).square() * keep
    dz = (dy @ w2) * keep * 2 * torch.relu(z)
    return hh @ w2.t(), dz @ w1, dz.t() @ x, dy.t() @ hh


def routing(choice: torch.Tensor, e: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """From ``choice`` [T, k] (each token's k distinct chunk ids): (src [T k]: the token of each row
    sorted by chunk, stable; offs [E] int32: cumulative row ends per chunk; inv [T k]: the sorted
    position of token t's j-th chunk, row t k + j)."""
    t, k = choice.shape
    flat = choice.reshape(-1)
    order = torch.sort(flat, stable=True).indices
    counts = torch.bincount(flat, minlength=e)
    inv = torch.empty_like(order)
    inv[order] = torch.arange(order.numel(), device=choice.device)
    return order // k, counts.cumsum(0).to(torch.int32), inv


def chunk_weights(w1: torch.Tensor, w2: torch.Tensor, e: int) -> tuple[torch.Tensor, torch.Tensor]:
    """W1 [h, d] and W2 [d, h] as e chunks of C = h / e units: W1c [E, C, d] (a view) and W2c
    [E, d, C] (a copy: each chunk's columns of W2 made one contiguous matrix)."""
    d, c = w1.shape[1], w1.shape[0] // e
    return w1.view(e, c, d), w2.view(d, e, c).permute(1, 0, 2).contiguous()


def grouped_ffn(
    x: torch.Tensor, w1c: torch.Tensor, w2c: torch.Tensor, dy: torch.Tensor, src: torch.Tensor, offs: torch.Tensor,
    inv: torch.Tensor, k: int,
) -> Grads:  # fmt: skip
    """The per-chunk FFN of the module docstring with torch._grouped_mm, on chunk_weights' W1c and
    W2c and routing's rows. Returns Y, dX and the full dW1 [h, d], dW2 [d, h]."""
    t, d = x.shape
    xp = x.index_select(0, src)
    zp = torch._grouped_mm(xp, w1c.transpose(1, 2), offs=offs)  # [R, C]
    hp = torch.relu(zp).square()
    yp = torch._grouped_mm(hp, w2c.transpose(1, 2), offs=offs)  # [R, d]
    y = yp.index_select(0, inv).view(t, k, d).sum(1)
    dyp = dy.index_select(0, src)
    dzp = torch._grouped_mm(dyp, w2c, offs=offs) * 2 * torch.relu(zp)  # [R, C]
    dw2 = torch._grouped_mm(dyp.t(), hp, offs=offs)  # [E, d, C]
    dw1 = torch._grouped_mm(dzp.t(), xp, offs=offs)  # [E, C, d]
    dx = torch._grouped_mm(dzp, w1c, offs=offs).index_select(0, inv).view(t, k, d).sum(1)
    return y, dx, dw1.reshape(-1, d), dw2.permute(1, 0, 2).reshape(d, -1)


def scored_choice(x: torch.Tensor, w1: torch.Tensor, e: int, m: int, r: int) -> torch.Tensor:
    """Each token's 4 of every ``m`` of the e chunks of W1 [h, d], ranked by its H = relu(X W1^T)^2 summed
    (float32) over each chunk's first ``r`` units (SparsityConfig.score_units): [T, 4 e / m] chunk ids,
    F1 on only those E r rows of W1."""
    t, c = x.shape[0], w1.shape[0] // e
    rep = (torch.arange(e, device=x.device)[:, None] * c + torch.arange(r, device=x.device)).reshape(-1)
    scores = torch.relu(x @ w1.index_select(0, rep).t()).square().float().view(t, e // m, m, r).sum(-1)
    top = torch.topk(scores, 4, dim=-1).indices  # [T, E/m, 4]: ties have measure zero on real activations
    return (top + m * torch.arange(e // m, device=x.device)[:, None]).reshape(t, -1)


def scored_grouped_ffn(x, w1, w2, dy, e: int, m: int, r: int) -> Grads:
    """scored_choice, routing and grouped_ffn in one call, as an op would run them."""
    choice = scored_choice(x, w1, e, m, r)
    return grouped_ffn(x, *chunk_weights(w1, w2, e), dy, *routing(choice, e), choice.shape[1])


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
            run = functools.partial(grouped_ffn, x, *chunk_weights(w1, w2, e), dy, *routing(choice, e), k)
        else:
            choice = scored_choice(x, w1, e, 16, a.score_units)
            run = functools.partial(scored_grouped_ffn, x, w1, w2, dy, e, 16, a.score_units)
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
