"""python -m bench.weight_grad_quality: what the token-dim weight-gradient approximation costs in quality.

Trains the GPT dense for --train-steps on the stdlib corpus (so the activations are real, not
random), then on one fresh batch computes the FFN weight gradients of the sparse model
(activations --activations) with exact B2/B4 and with each token-dim pattern
(weight_grad="tokens:V:N:M", with each --dense-fracs), and reports per pattern the cosine
similarity and relative error of dW1 (c_fc) and dW2 (c_proj) against exact: mean and worst layer.
"""

import argparse
import sys

import torch
from tabulate import tabulate

from bench.data import Batches, Corpus
from bench.env import environment, write_csv
from bench.model import GPT, SIZES


def ffn_grads(model: GPT, x: torch.Tensor, y: torch.Tensor, options: dict, autocast) -> list[torch.Tensor]:
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="sparse", options={"small_ffn": "sparse", **options})
    model.zero_grad(set_to_none=True)
    with autocast():
        _, loss = compiled(x, y)
    loss.backward()
    return [w.grad.float().clone() for b in model.blocks for w in (b.mlp.c_fc.weight, b.mlp.c_proj.weight)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.weight_grad_quality", description=__doc__)
    p.add_argument("--size", choices=sorted(SIZES), help="default: tiny on CPU, 125m on CUDA")
    p.add_argument("--train-steps", type=int, help="dense steps before measuring (default 100 CPU, 300 CUDA)")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--activations", default="64:2:8", help="the sparse model's activation pattern")
    p.add_argument("--patterns", default="tokens:64:2:8,tokens:64:4:8,tokens:128:2:16,tokens:1:2:4")
    p.add_argument("--dense-fracs", default="0,0.02", help="weight_grad_dense_frac values")
    p.add_argument("--csv", help="write the rows here")
    args = p.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    gpu = device.type == "cuda"
    size = args.size or ("125m" if gpu else "tiny")
    steps = args.train_steps if args.train_steps is not None else (300 if gpu else 100)
    env = environment(device, "python -m bench.weight_grad_quality", argv)
    print("\n".join(f"{k}: {v}" for k, v in env.items()), flush=True)

    def autocast():
        return torch.autocast("cuda", dtype=torch.bfloat16) if gpu else torch.autocast("cpu", enabled=False)

    corpus = Corpus.load()
    seq = SIZES[size].block_size
    torch.manual_seed(0)
    model = GPT(SIZES[size]).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3 if gpu else 2e-3)
    batches = Batches(corpus.train, args.batch_size, seq, seed=1)
    compiled = torch.compile(model)
    for _ in range(steps):
        x, y = batches.next(device)
        with autocast():
            _, loss = compiled(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    print(f"trained {steps} dense steps of {args.batch_size}x{seq} tokens ({size}); last loss {loss.item():.3f}")
    x, y = Batches(corpus.val, args.batch_size, seq, seed=7).next(device)
    exact = ffn_grads(model, x, y, {"activations": args.activations}, autocast)
    rows = []
    for pattern in args.patterns.split(","):
        for frac in (float(f) for f in args.dense_fracs.split(",")):
            opts = {"activations": args.activations, "weight_grad": pattern, "weight_grad_dense_frac": frac}
            approx = ffn_grads(model, x, y, opts, autocast)
            for name, idx in (("dW1 (c_fc)", 0), ("dW2 (c_proj)", 1)):
                pairs = list(zip(exact[idx::2], approx[idx::2], strict=True))
                cos = [torch.nn.functional.cosine_similarity(e.flatten(), a.flatten(), dim=0).item() for e, a in pairs]
                rel = [((a - e).norm() / e.norm()).item() for e, a in pairs]
                rows.append(
                    {
                        "weight_grad": pattern, "dense_frac": frac, "grad": name,
                        "cos mean": sum(cos) / len(cos), "cos worst": min(cos),
                        "rel err mean": sum(rel) / len(rel), "rel err worst": max(rel), "git": env["git"],
                    }
                )  # fmt: skip
    print(tabulate(rows, headers="keys", floatfmt=".4f", tablefmt="github"))
    if args.csv:
        write_csv(args.csv, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
