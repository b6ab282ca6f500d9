"""The one-read selection kernel (tile held on chip, kept columns by tl.gather) vs the default
two-read kernel at T = h = 16384, bf16 with bias: exact vs the reference, ms, fraction of copy."""

import torch
import triton.testing

from bench.gpu_timing import copy_gbps
from sparse_compile.kernels.activation_mask import vnm_compact_ref
from sparse_compile.kernels.activation_select_triton import vnm_select_compact

t = h = 16384
z = torch.randn(t, h, device="cuda", dtype=torch.bfloat16)
b = torch.randn(h, device="cuda", dtype=torch.bfloat16) * 0.1
ceiling = copy_gbps()
print(f"copy {ceiling:.0f} GB/s", flush=True)
for v, n, m in [(128, 2, 16), (128, 2, 8), (128, 4, 8), (64, 2, 8)]:
    want = vnm_compact_ref(z, b, v, n, m)
    nbytes = t * h * 2 + 2 * t * h * 4 // m * 2 + (t // v) * h * 4 // m * 4
    ms = triton.testing.do_bench(lambda: vnm_select_compact(z, b, v, n, m), return_mode="median")
    print(f"{v}:{n}:{m} default two-read: {ms:.3f} ms {nbytes / ms / 1e6 / ceiling:.2f} of copy", flush=True)
    for block_g in (1, 2, 4, 8, 16):
        if block_g * m > 128 or block_g * m < 16:
            continue
        for warps in (4, 8, 16):
            try:
                got = vnm_select_compact(z, b, v, n, m, block_g=block_g, num_warps=warps, onchip=True)
            except Exception as e:  # noqa: BLE001 - report and go on
                print(f"  block_g {block_g} warps {warps}: {type(e).__name__}: {str(e)[:200]}", flush=True)
                continue
            exact = all(torch.equal(a, r) for a, r in zip(got, want, strict=True))
            ms = triton.testing.do_bench(
                lambda bg=block_g, w=warps: vnm_select_compact(z, b, v, n, m, block_g=bg, num_warps=w, onchip=True),
                return_mode="median",
            )
            print(f"  onchip block_g {block_g:2d} ({block_g * m:3d} cols) warps {warps:2d}: exact {exact} "
                  f"{ms:.3f} ms {nbytes / ms / 1e6 / ceiling:.2f} of copy", flush=True)
