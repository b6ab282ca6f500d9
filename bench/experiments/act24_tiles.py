"""Tilings of the fused 2:4 -> cuSPARSELt kernels (kernels/act24_cslt_triton.py) at T = h = 16384, bf16:
ms and fraction of copy per (TILES, num_warps), each output checked against the default tiling."""

import torch
import triton.testing

from bench.gpu_timing import copy_gbps
from sparse_compile.kernels.act24_cslt_triton import sqrelu_24_backward, sqrelu_24_compress

t = h = 16384
z = torch.randn(t, h, device="cuda", dtype=torch.bfloat16)
dh = torch.randn_like(z)
ceiling = copy_gbps()
buf = t * (h // 2 + h // 16) * 2
fwd_bytes, bwd_bytes = t * h * 2 + 2 * buf, t * h * 2 + 2 * buf + 2 * t * h * 2
ref_f = sqrelu_24_compress(z)
ref_b = sqrelu_24_backward(dh, ref_f[1])
print(f"copy {ceiling:.0f} GB/s")
for tiles in (2, 4, 8, 16):
    for warps in (2, 4, 8):
        f = sqrelu_24_compress(z, tiles, warps)
        b = sqrelu_24_backward(dh, ref_f[1], tiles, warps)
        ok = all(torch.equal(x.view(torch.int16), y.view(torch.int16)) for x, y in zip(f + b, ref_f + ref_b))
        ms_f = triton.testing.do_bench(lambda: sqrelu_24_compress(z, tiles, warps), return_mode="median")
        ms_b = triton.testing.do_bench(lambda: sqrelu_24_backward(dh, ref_f[1], tiles, warps), return_mode="median")
        print(f"TILES {tiles:2d} warps {warps}: same {ok}  fwd {ms_f:.3f} ms {fwd_bytes / ms_f / 1e6 / ceiling:.2f} of copy"
              f"  bwd {ms_b:.3f} ms {bwd_bytes / ms_b / 1e6 / ceiling:.2f} of copy", flush=True)
