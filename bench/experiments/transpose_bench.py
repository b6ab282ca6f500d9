"""transpose_copy (kernels/transpose_triton.py) against torch's w.t().contiguous() on the GPU, bf16,
for the W2 shapes of the FFN benchmarks: equal outputs, median ms, fraction of copy."""

import torch
import triton.testing

from bench.gpu_timing import copy_gbps
from sparse_compile.kernels.transpose_triton import transpose_copy

ceiling = copy_gbps()
print(f"copy {ceiling:.0f} GB/s", flush=True)
for r, c in [(4096, 16384), (2048, 8192), (768, 3072)]:
    w = torch.randn(r, c, device="cuda", dtype=torch.bfloat16)
    nbytes = 2 * r * c * 2
    same = torch.equal(transpose_copy(w), w.t().contiguous())
    rows = [("torch", lambda w=w: w.t().contiguous())]
    rows += [
        (f"triton block {b} warps {nw}", lambda w=w, b=b, nw=nw: transpose_copy(w, b, nw))
        for b in (32, 64, 128)
        for nw in (4, 8)
    ]
    for label, fn in rows:
        ms = triton.testing.do_bench(fn, return_mode="median")
        print(f"{r}x{c} {label:24s} same {same} {ms:.4f} ms {nbytes / ms / 1e6 / ceiling:.2f} of copy", flush=True)
