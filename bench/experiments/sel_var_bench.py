"""One-read selection variants (bench/experiments/sel_var.py) against the package kernel, on the GPU:
exact vs the reference, median ms, fraction of copy. T = 16384, h in (8192, 16384), bf16 with bias."""

import sys

import torch
import triton.testing

from bench.gpu_timing import copy_gbps
from sparse_compile.kernels.activation_mask import vnm_compact_ref
from sparse_compile.kernels.activation_select_triton import vnm_select_compact

sys.path.insert(0, "bench/experiments")
import sel_var  # noqa: E402

t = 16384
ceiling = copy_gbps()
print(f"copy {ceiling:.0f} GB/s", flush=True)


def bench(h: int, v: int, n: int, m: int, z: torch.Tensor, b: torch.Tensor) -> None:
    want = vnm_compact_ref(z, b, v, n, m)
    nbytes = t * h * 2 + 2 * t * h * 4 // m * 2 + (t // v) * h * 4 // m * 4

    def row(label, fn):
        got = fn()
        exact = all(torch.equal(a, r) for a, r in zip(got, want, strict=True))
        ms = triton.testing.do_bench(fn, return_mode="median")
        frac = nbytes / ms / 1e6 / ceiling
        print(f"{h} {v}:{n}:{m} {label:28s} exact {exact!s:5} {ms:.3f} ms {frac:.2f} of copy", flush=True)

    row("default", lambda: vnm_select_compact(z, b, v, n, m))
    row(
        "onchip 64 cols gather_z",
        lambda: vnm_select_compact(z, b, v, n, m, block_g=64 // m, onchip=True, gather_z=True),
    )
    for name in ("g3", "g3a", "g3b"):
        k = getattr(sel_var, name + "_kernel")
        for cols in (64, 128):
            for warps in (4, 8):
                row(
                    f"{name} {cols} cols {warps} warps",
                    lambda k=k, c=cols, w=warps: sel_var.launch(k, z, b, v, n, m, c // m, w),
                )


for h in (16384, 8192):
    z = torch.randn(t, h, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(h, device="cuda", dtype=torch.bfloat16) * 0.1
    for v, n, m in [(128, 2, 16), (64, 2, 8), (128, 2, 8), (128, 4, 8)]:
        bench(h, v, n, m, z, b)
