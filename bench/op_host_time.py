"""python -m bench.op_host_time: host (CPU) time per call of the sparse FFN op, layer by layer (CUDA).

At one FFN shape (default: the 125M main job's, 16 x 1024 tokens, 768 -> 3072, causal 128:4:16), the
GPU is kept busy with ``torch.cuda._sleep`` so no call waits for it, and N calls are timed on the
host for each layer of the sparse path:
  op (dispatcher)   torch.ops.sparse_compile.sqrelu_ffn_vnm[_backward]: torch.library's autograd
                    and backend wrappers, the aliasing check, then the op's Python
  impl (python fn)  the op's Python function called directly (spec parsing, checks)
  kernels           kernels/ffn_gather.py's forward / backward (the launches)
beside one torch.mm and one empty_like for scale, with the CUDA kernels each call launches
(torch.profiler). The rows run in --rounds rounds, each in another order (round_orders), and each
row shows its median and range: a row's figure must not depend on where it ran. A cProfile of
the kernel calls follows. The differences between rows are what each layer costs.
"""

import argparse
import cProfile
import io
import pstats
import statistics
import time

import torch

from bench.gpu_timing import start_gpu_bench


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.op_host_time", description=__doc__.split("\n")[0])
    p.add_argument("--shape", default="16,1024,768,3072", help="batch,seq,d,hidden (default: the 125M main job)")
    p.add_argument("--sparsity", default='{"activations": "128:4:16", "causal": true}', help="JSON options")
    p.add_argument("--calls", type=int, default=30, help="timed calls per row and round")
    p.add_argument("--rounds", type=int, default=3, help="rounds over the rows, each in another order (median shown)")
    args = p.parse_args(argv)
    for name in ("calls", "rounds"):
        if getattr(args, name) < 1:
            p.error(f"--{name} {getattr(args, name)}: expected an int >= 1")
    start_gpu_bench(p, "python -m bench.op_host_time", argv)
    return args


def round_orders(rows: list[str], rounds: int) -> list[list[str]]:
    """The rows' order in each round: round r is the rows rotated to start at row r * len(rows) //
    rounds, so with rounds <= len(rows) every row is timed at a different place in every round."""
    return [rows[k:] + rows[:k] for k in (r * len(rows) // rounds for r in range(rounds))]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from sparse_compile.config import BackendOptions, options_from_text
    from sparse_compile.kernels.ffn_gather import sqrelu_ffn_backward_gather, sqrelu_ffn_forward_gather
    from sparse_compile.ops.ffn_vnm import sqrelu_ffn_vnm, sqrelu_ffn_vnm_backward
    from sparse_compile.ops.spec import parse_spec

    b, s, d, h = (int(n) for n in args.shape.split(","))
    spec = BackendOptions.parse(options_from_text(args.sparsity)).config.op_spec()
    op = parse_spec(spec)
    v, n, m = op.activations
    seq = s if op.causal else None
    g = torch.Generator(device="cuda").manual_seed(0)

    def r(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(*shape, device="cuda", generator=g) * scale).bfloat16()

    x, w1, b1, w2, b2, dy = r(b, s, d), r(h, d, scale=0.03), r(h, scale=0.1), r(d, h, scale=0.02), r(d), r(b, s, d)
    ops = torch.ops.sparse_compile
    _, r_c, ids = ops.sqrelu_ffn_vnm(x, w1, b1, w2, b2, spec)
    x2, dy2 = x.reshape(-1, d), dy.reshape(-1, d)
    calls = {
        "fwd op (dispatcher)": lambda: ops.sqrelu_ffn_vnm(x, w1, b1, w2, b2, spec),
        "fwd impl (python fn)": lambda: sqrelu_ffn_vnm._init_fn(x, w1, b1, w2, b2, spec),
        "fwd kernels": lambda: sqrelu_ffn_forward_gather(x2, w1, b1, w2, b2, v, n, m, None, frozenset(), op.chunk, seq),
        "bwd op (dispatcher)": lambda: ops.sqrelu_ffn_vnm_backward(dy, x, w1, w2, r_c, ids, spec),
        "bwd impl (python fn)": lambda: sqrelu_ffn_vnm_backward._init_fn(dy, x, w1, w2, r_c, ids, spec),
        "bwd kernels": lambda: sqrelu_ffn_backward_gather(dy2, x2, w1, w2, r_c, ids, v, m, chunk=op.chunk),
        f"torch.mm [{b * s},{d}]x[{d},{h}]": lambda: x2 @ w1.t(),
        "empty_like": lambda: torch.empty_like(x2),
    }
    for f in calls.values():
        f(), f()
    times: dict[str, list[float]] = {name: [] for name in calls}
    for order in round_orders(list(calls), args.rounds):  # a row's figure must not depend on its place
        for name in order:
            torch.cuda.synchronize()
            torch.cuda._sleep(int(3e9))  # ~2 s of GPU work queued first: no call below waits for the GPU
            t0 = time.perf_counter()
            for _ in range(args.calls):
                calls[name]()
            times[name].append(1e6 * (time.perf_counter() - t0) / args.calls)
    torch.cuda.synchronize()
    print(f"{'call':40s} host us/call (GPU busy): median, min-max of {args.rounds} rounds   launches/call")
    for name, f in calls.items():
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            f()
            torch.cuda.synchronize()
        launches = sum(e.device_type == torch.autograd.DeviceType.CUDA for e in prof.events())
        t = times[name]
        print(f"{name:40s} {statistics.median(t):10.1f}  {min(t):8.1f}-{max(t):<8.1f}   {launches}", flush=True)
    for name in ("fwd kernels", "bwd kernels", "fwd op (dispatcher)"):
        torch.cuda.synchronize()
        torch.cuda._sleep(int(3e9))
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(args.calls):
            calls[name]()
        prof.disable()
        torch.cuda.synchronize()
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(22)
        print(f"== cProfile {name}, {args.calls} calls\n{out.getvalue()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
