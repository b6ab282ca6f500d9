"""python -m bench.wgrad_step: the chunked weight-gradient kernel (B2, B4) on a real step's operands (CUDA).

bench.e2e's profile of a training step gives each B2 / B4 call of the default pattern its time in
the step; bench.chunk_kernels times the same call on random activations. This separates what the
step's data changes from what the step's surroundings change. It trains the project's GPT at one
size's width (the first --layers of its blocks, bench.e2e's recipe: corpus batches, bf16 autocast,
fused AdamW, default options) for --steps steps, profiles two more steps (the kernel's mean time
per call in the step), and records the operands of every B2 and B4 call of the last step. For
each recorded call it prints how many blocks keep each chunk (mean, max, quantiles), then the
do_bench median of chunk_wgrad on:
  step                          the recorded operands, the op's program order (what ran in the step)
  one program per tile          the same without the TAIL schedule (tail=False: a last wave's tiles unsplit)
  chunk-id order, ...           the same, chunks in id order, 4 D tiles each or one (D tiles outer)
  most kept first, ...          the op's chunk order, one D tile or all 12 per chunk back to back
  step, split-K 2               each tile's K steps over two programs (float32 partials, summed)
  random values                 the recorded ids (the step's popularity) on normal random operands
  random ids                    the recorded operands, ids chosen from random Z (uniform popularity)
"""

import argparse
import dataclasses

import torch
import triton.testing

from bench.gpu_timing import start_gpu_bench


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    from bench.model import SIZES

    p = argparse.ArgumentParser(prog="python -m bench.wgrad_step", description=__doc__.split("\n")[0])
    p.add_argument("--size", default="3b", choices=sorted(SIZES), help="width of bench/model.py's size (default 3b)")
    p.add_argument("--layers", type=int, default=4, help="blocks of that size to train (default 4)")
    p.add_argument("--steps", type=int, default=6, help="training steps before the recorded one (default 6)")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--every", type=int, default=1, help="time the B2 and B4 calls of every k-th block (default 1)")
    p.add_argument("--data-dir", help="cache folder of the corpus (default: ~/.cache/sparse_compile)")
    args = p.parse_args(argv)
    for name in ("layers", "steps", "batch_size", "seq_len", "every"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} {getattr(args, name)}: expected an int >= 1")
    start_gpu_bench(p, "python -m bench.wgrad_step", argv)
    return args


def _ms(fn) -> float:
    return triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")


def kept_counts(offsets: torch.Tensor) -> str:
    """'mean m, max M (M/m), p50 / p90 / p99, min': blocks keeping each chunk, from chunk_csr's offsets."""
    n = offsets.diff().float()
    q = torch.quantile(n, torch.tensor([0.5, 0.9, 0.99], device=n.device)).tolist()
    mean = n.mean().item()
    return (
        f"kept blocks per chunk: mean {mean:.1f}, max {n.max().item():.0f} ({n.max().item() / mean:.2f}x), "
        f"p50 {q[0]:.0f} / p90 {q[1]:.0f} / p99 {q[2]:.0f}, min {n.min().item():.0f}"
    )


def time_call(kernel, a: tuple, kw: dict) -> None:
    """Print the do_bench median of ``kernel(*a, **kw)`` (a chunk_wgrad call) and of its variants."""
    from sparse_compile.kernels.chunk_select_triton import vnm_select_chunks
    from sparse_compile.kernels.chunk_wgrad_triton import chunk_csr, chunk_order

    comp, ids, other, v, c, h = a[:6]
    z = torch.randn(comp.shape[0], h, device=comp.device, dtype=comp.dtype)
    _, _, ids_rand = vnm_select_chunks(z, None, v, 4, h * 4 // comp.shape[1], c)  # M = 4h / Kc
    del z
    csr_rand = chunk_csr(ids_rand, c, h)
    rand = (torch.randn_like(comp), ids, torch.randn_like(other), *a[3:])
    variants = {  # label: (args, kwargs, equal to the step's product)
        "step": (a, kw, True),
        "one program per tile (no tail split)": (a, {**kw, "tail": False}, False),
        "chunk-id order, 4 D tiles per chunk": (a, {**kw, "order": None, "tail": False}, False),
        "chunk-id order, D tiles outer": (a, {**kw, "order": None, "group_d": 1, "tail": False}, False),
        "most kept first, D tiles outer": (a, {**kw, "group_d": 1}, False),
        "most kept first, 12 D tiles per chunk": (a, {**kw, "group_d": 12}, False),
        "step, split-K 2": (a, {**kw, "split": 2}, False),
        "random values": (rand, kw, False),
        "random ids": ((comp, ids_rand, *a[2:]), {**kw, "csr": csr_rand, "order": chunk_order(csr_rand[0])}, False),
    }
    ref = kernel(*a, **kw)
    for label, (args, kwargs, check) in variants.items():
        out = kernel(*args, **kwargs)
        note = ("(equal)" if torch.equal(out, ref) else "(DIFFERS)") if check else ""
        ms = _ms(lambda args=args, kwargs=kwargs: kernel(*args, **kwargs))
        print(f"  {label:40s} {ms:.4f} ms {note}", flush=True)
    print(f"  random ids: {kept_counts(csr_rand[0])}", flush=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import sparse_compile
    import sparse_compile.kernels.ffn_gather as ffn_gather
    from bench.data import Batches, Corpus
    from bench.model import GPT, SIZES, train_step

    device = torch.device("cuda")
    cfg = dataclasses.replace(SIZES[args.size], n_layer=args.layers, block_size=max(2048, args.seq_len))
    torch.manual_seed(0)
    model = GPT(cfg).to(device)
    compiled = torch.compile(model, backend="sparse")
    opt = model.adamw(lr=1e-4, weight_decay=0.1, fused=True)
    corpus = Corpus.load(args.data_dir)
    batches = Batches(corpus.train, args.batch_size, args.seq_len, seed=1)
    data = [batches.next(device) for _ in range(4)]
    sparse_compile.set_phase("sparse")

    def autocast():
        return torch.autocast("cuda", dtype=torch.bfloat16)

    recorded: list[tuple[tuple, dict]] = []
    recording = False
    kernel = ffn_gather.chunk_wgrad

    def record(*a, **kw):
        if recording:
            recorded.append(
                (
                    tuple(t.clone() if isinstance(t, torch.Tensor) else t for t in a),
                    {k: (t.clone() if isinstance(t, torch.Tensor) else t) for k, t in kw.items()},
                )
            )
        return kernel(*a, **kw)

    ffn_gather.chunk_wgrad = record
    for i in range(args.steps):
        train_step(compiled, model, opt, *data[i % 4], autocast)
    torch.cuda.synchronize()
    acts = [torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        for i in range(2):
            train_step(compiled, model, opt, *data[(args.steps + i) % 4], autocast)
        torch.cuda.synchronize()
    for e in prof.key_averages():
        if e.key in ("_chunk_wgrad_kernel", "_gather_k_kernel", "_gather_n_kernel"):
            print(f"in the step: {e.key} {e.count} calls, mean {e.device_time_total / e.count / 1e3:.3f} ms")
    recording = True
    train_step(compiled, model, opt, *data[args.steps % 4], autocast)
    torch.cuda.synchronize()
    recording = False
    ffn_gather.chunk_wgrad = kernel
    print(f"{len(recorded)} calls recorded (backward order: last block first; B2 then B4 per block)")

    for k, (a, kw) in enumerate(recorded):
        if (k // 2) % args.every:
            continue
        comp, _, other = a[:3]
        which = "B2" if kw.get("transpose") else "B4"
        print(f"\ncall {k}: {which}, A {tuple(comp.shape)}, B {tuple(other.shape)}, {kept_counts(kw['csr'][0])}")
        time_call(kernel, a, kw)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
