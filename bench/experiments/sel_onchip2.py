"""The one-read selection kernel gathering Z (16-bit) vs gathering relu(Z) (float32), at
T = h = 16384, bf16 with bias: exact vs the reference, ms, fraction of copy; the default beside."""

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
    print(f"{v}:{n}:{m} default: {ms:.3f} ms {nbytes / ms / 1e6 / ceiling:.2f} of copy", flush=True)
    for block_g in (32 // m, 64 // m, 128 // m):
        for warps in (4, 8):
            for gz in (False, True):
                kw = {"block_g": block_g, "num_warps": warps, "onchip": True, "gather_z": gz}
                got = vnm_select_compact(z, b, v, n, m, **kw)
                exact = all(torch.equal(a, r) for a, r in zip(got, want, strict=True))
                ms = triton.testing.do_bench(lambda k=kw: vnm_select_compact(z, b, v, n, m, **k), return_mode="median")
                print(f"  block_g {block_g:2d} ({block_g * m:3d} cols) warps {warps} gather_z {gz!s:5}: exact {exact} "
                      f"{ms:.3f} ms {nbytes / ms / 1e6 / ceiling:.2f} of copy", flush=True)
