"""python -m bench.op_host_time: host (CPU) time per call of the sparse FFN op, layer by layer (CUDA).

At one FFN shape (default: the 125M main job's, 16 x 1024 tokens, 768 -> 3072, causal 128:4:16), the
GPU is kept busy with ``torch.cuda._sleep`` so no call waits for it, and N calls are timed on the
host for each layer of the sparse path:
  op (dispatcher)   torch.ops.sparse_compile.sqrelu_ffn_vnm[_backward]: torch.library's autograd
                    and backend wrappers, the aliasing check, then the op's Python
  impl (python fn)  the op's Python function called directly (spec parsing, checks)
  kernels           kernels/ffn_gather.py's forward / backward (the launches)
beside one torch.mm and one empty_like for scale, and one launch of a one-program Triton kernel
through each layer of Triton's launch path (``kernel[grid]``; the same through ``triton.autotune``
with one config; a second kernel with a TMA descriptor argument; the compiled kernel's launcher
called directly; kernels/launch.py's FastLaunch, plain and autotuned), the kernel functions once
more with every launch through Triton's own path (FastLaunch off; their outputs checked bit-equal
first), with the CUDA kernels each call launches
(torch.profiler). The rows run in --rounds rounds, each in another order (round_orders), and each
row shows its median and range: a row's figure must not depend on where it ran. A cProfile of
the kernel calls follows. The differences between rows are what each layer costs. Then, without
cProfile's distortion, the forward's and backward's kernel functions with every function and
Triton kernel of the kernels package they call wrapped in a host timer (``anatomy``): host us per
op call spent inside each callee, nested callees counted in their callers too.
"""

import argparse
import cProfile
import importlib
import inspect
import io
import pkgutil
import pstats
import statistics
import time
from collections import defaultdict
from collections.abc import Callable

import torch
import triton
import triton.language as tl

from bench.gpu_timing import start_gpu_bench


@triton.jit
def _tiny_kernel(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) + 1, mask=offs < n)


# the same body, a second jit object under the autotuner
_tiny_tuned_kernel = triton.autotune(configs=[triton.Config({"BLOCK": 128}, num_warps=4)], key=["n"])(
    triton.jit(_tiny_kernel.fn)
)


@triton.jit
def _tiny_desc_kernel(x_desc, BLOCK: tl.constexpr):
    x_desc.store([0, 0], x_desc.load([0, 0]) + 1)


def launch_rows() -> dict:
    """One launch of a one-program kernel through each layer of Triton's launch path (the host
    cost per launch of kernel[grid], of an autotuned kernel, of a TMA descriptor argument, and of
    the compiled kernel's launcher alone)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    from sparse_compile.kernels.launch import FastLaunch

    x = torch.zeros(128, device="cuda", dtype=torch.float32)
    x2 = torch.zeros(16, 16, device="cuda", dtype=torch.float32)
    compiled = _tiny_kernel[(1,)](x, 128, BLOCK=128)
    _tiny_tuned_kernel[(1,)](x, 128)
    _tiny_desc_kernel[(1,)](TensorDescriptor.from_tensor(x2, [16, 16]), BLOCK=16)
    fast, fast_tuned = FastLaunch(_tiny_kernel), FastLaunch(_tiny_tuned_kernel)
    fast[(1,)](x, 128, BLOCK=128), fast_tuned[(1,)](x, 128)
    stream = torch.cuda.current_stream().cuda_stream
    fn, meta = compiled.function, compiled.packed_metadata
    return {
        "triton launch: kernel[grid]": lambda: _tiny_kernel[(1,)](x, 128, BLOCK=128),
        "triton launch: autotuned, 1 config": lambda: _tiny_tuned_kernel[(1,)](x, 128),
        "triton launch: TMA descriptor arg": lambda: _tiny_desc_kernel[(1,)](
            TensorDescriptor.from_tensor(x2, [16, 16]), BLOCK=16
        ),
        "triton launch: compiled.run": lambda: compiled.run(1, 1, 1, stream, fn, meta, None, None, None, x, 128, 128),
        "triton launch: FastLaunch": lambda: fast[(1,)](x, 128, BLOCK=128),
        "triton launch: FastLaunch, autotuned": lambda: fast_tuned[(1,)](x, 128),
    }


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


class _TimedKernel:
    """A Triton kernel (jit or autotuned) whose ``kernel[grid](...)`` launches are timed."""

    def __init__(self, kernel, record: Callable[[str, float], None], name: str) -> None:
        self._kernel, self._record, self._name = kernel, record, name

    def __getitem__(self, grid):
        launch = self._kernel[grid]

        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            out = launch(*args, **kwargs)
            self._record(self._name, time.perf_counter() - t0)
            return out

        return timed

    def __getattr__(self, name: str):
        return getattr(self._kernel, name)


def busy_calls(f: Callable[[], object], n: int, prof: cProfile.Profile | None = None) -> float:
    """Host us per call of n calls of f, timed (and profiled by ``prof``) behind ~2 s of GPU work
    queued first: no call waits for the GPU."""
    torch.cuda.synchronize()
    torch.cuda._sleep(int(3e9))
    if prof is not None:
        prof.enable()
    t0 = time.perf_counter()
    for _ in range(n):
        f()
    us = 1e6 * (time.perf_counter() - t0) / n
    if prof is not None:
        prof.disable()
    return us


def _triton_path(f: Callable[[], object]) -> Callable[[], object]:
    """f with FastLaunch off for its duration: every launch through Triton's own path."""
    from sparse_compile.kernels.launch import triton_path

    def call():
        with triton_path():
            return f()

    return call


def anatomy(calls: dict[str, Callable[[], object]], n: int) -> str:
    """Host us per call of each of ``calls`` spent inside every function and Triton kernel the
    modules of sparse_compile.kernels define or import from each other, timed by wrapping those
    module attributes (GPU kept busy; the wrappers restored after)."""
    from triton.runtime.autotuner import Autotuner
    from triton.runtime.jit import JITFunction

    import sparse_compile.kernels as pkg
    from sparse_compile.kernels.launch import FastLaunch
    from sparse_compile.kernels.tune_cache import TuneStore

    modules = [importlib.import_module(f"{pkg.__name__}.{i.name}") for i in pkgutil.iter_modules(pkg.__path__)]
    totals: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)

    def record(name: str, dt: float) -> None:
        totals[name] += dt
        counts[name] += 1

    def timed_fn(fn: Callable, name: str) -> Callable:
        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            out = fn(*args, **kwargs)
            record(name, time.perf_counter() - t0)
            return out

        return timed

    saved = []
    for mod in modules:
        for attr, obj in list(vars(mod).items()):
            if isinstance(obj, TuneStore) and "load" not in vars(obj):
                for method in ("load", "save"):
                    saved.append((obj, method, None))
                    setattr(obj, method, timed_fn(getattr(obj, method), f"{attr}.{method}"))
            elif isinstance(obj, (JITFunction, Autotuner, FastLaunch)):
                saved.append((mod, attr, obj))
                setattr(mod, attr, _TimedKernel(obj, record, f"launch {attr}"))
            elif inspect.isfunction(obj) and obj.__module__.startswith(pkg.__name__):
                saved.append((mod, attr, obj))
                setattr(mod, attr, timed_fn(obj, f"{obj.__module__.rsplit('.', 1)[-1]}.{obj.__name__}"))
    lines = []
    try:
        for label, f in calls.items():
            f()
            totals.clear(), counts.clear()
            total = busy_calls(f, n)
            torch.cuda.synchronize()
            lines.append(f"== anatomy: {label}, {total:.1f} us per call (timers included)")
            for name in sorted(totals, key=totals.get, reverse=True):
                lines.append(f"  {name:60s} {1e6 * totals[name] / n:8.1f} us  {counts[name] / n:4.1f} calls")
    finally:
        for mod, attr, obj in reversed(saved):
            if obj is None:  # a timed method set on the instance: the class's shows again
                delattr(mod, attr)
            else:
                setattr(mod, attr, obj)
    return "\n".join(lines)


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
    _, r_c, ids, dz_s = ops.sqrelu_ffn_vnm(x, w1, b1, w2, b2, spec)
    x2, dy2 = x.reshape(-1, d), dy.reshape(-1, d)
    calls = {
        "fwd op (dispatcher)": lambda: ops.sqrelu_ffn_vnm(x, w1, b1, w2, b2, spec),
        "fwd impl (python fn)": lambda: sqrelu_ffn_vnm._init_fn(x, w1, b1, w2, b2, spec),
        "fwd kernels": lambda: sqrelu_ffn_forward_gather(x2, w1, b1, w2, b2, v, n, m, None, frozenset(), op.chunk, seq),
        "bwd op (dispatcher)": lambda: ops.sqrelu_ffn_vnm_backward(dy, x, w1, w2, r_c, ids, dz_s, spec),
        "bwd impl (python fn)": lambda: sqrelu_ffn_vnm_backward._init_fn(dy, x, w1, w2, r_c, ids, dz_s, spec),
        "bwd kernels": lambda: sqrelu_ffn_backward_gather(dy2, x2, w1, w2, r_c, ids, v, m, chunk=op.chunk),
        f"torch.mm [{b * s},{d}]x[{d},{h}]": lambda: x2 @ w1.t(),
        "empty_like": lambda: torch.empty_like(x2),
    } | launch_rows()
    for name in ("fwd kernels", "bwd kernels"):  # the same calls, every launch through Triton's path
        calls[f"{name}, Triton's launch path"] = _triton_path(calls[name])
    for f in calls.values():
        f(), f()
    for name in ("fwd kernels", "bwd kernels"):
        fast, triton_path = calls[name](), calls[f"{name}, Triton's launch path"]()
        same = all(torch.equal(a, b) for a, b in zip(fast, triton_path, strict=True))
        print(f"{name}: FastLaunch and Triton's launch path bit-equal: {same}")
    times: dict[str, list[float]] = {name: [] for name in calls}
    for order in round_orders(list(calls), args.rounds):  # a row's figure must not depend on its place
        for name in order:
            times[name].append(busy_calls(calls[name], args.calls))
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
        prof = cProfile.Profile()
        busy_calls(calls[name], args.calls, prof)
        torch.cuda.synchronize()
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(22)
        print(f"== cProfile {name}, {args.calls} calls\n{out.getvalue()}")
    print(anatomy({k: calls[k] for k in ("fwd kernels", "bwd kernels")}, args.calls))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
