"""The whole-row compressor variant (act24_var.cslt_rows_kernel) against the package compressor on the GPU:
bit-exact vs cslt_compress_ref, median ms, fraction of copy, at 16384 x (8192, 16384) bf16."""

import sys

import torch
import triton
import triton.testing

from bench.gpu_timing import copy_gbps
from sparse_compile.kernels.act24_cslt_triton import _kept_codes
from sparse_compile.kernels.cslt_compress_triton import cslt_compress_ref, cslt_compress_triton, random_24

sys.path.insert(0, "bench/experiments")
import act24_var  # noqa: E402

ceiling = copy_gbps()
print(f"copy {ceiling:.0f} GB/s", flush=True)


def rows(a: torch.Tensor, tiles: int, warps: int) -> torch.Tensor:
    m, k = a.shape
    out = torch.empty(m, k // 2 + k // 16, dtype=a.dtype, device=a.device)
    meta = out.view(-1).view(torch.int16)[m * k // 2 :]
    act24_var.cslt_rows_kernel[(m // 64, triton.cdiv(k // 32, tiles))](
        a, out, meta, _kept_codes(a.device), k, TILES=tiles, num_warps=warps
    )
    return out


for k in (8192, 16384):
    m = 16384
    a = random_24(m, k, torch.Generator("cuda").manual_seed(k), torch.bfloat16)
    want = cslt_compress_ref(a).view(torch.int16)
    also = torch._cslt_compress(a).view(torch.int16)
    nbytes = m * k * 2 + m * k * (1 / 2 + 1 / 16) * 2
    for label, fn in [("default", lambda a=a: cslt_compress_triton(a))] + [
        (f"rows tiles {t} warps {w}", lambda a=a, t=t, w=w: rows(a, t, w)) for t in (2, 4, 8) for w in (4, 8)
    ]:
        got = fn().view(torch.int16)
        exact = torch.equal(got, want) and torch.equal(got, also)
        ms = triton.testing.do_bench(fn, return_mode="median")
        print(f"{m}x{k} {label:22s} exact {exact!s:5} {ms:.3f} ms {nbytes / ms / 1e6 / ceiling:.2f} of copy", flush=True)
