"""The 64-bit-constant code table in the fused 2:4 forward kernel and the compressor (act24_var.py) against
the package kernels, on the GPU: bit-exact vs the references, median ms, fraction of copy."""

import sys

import torch
import triton
import triton.testing

from bench.gpu_timing import copy_gbps
from sparse_compile.kernels.act24_cslt_triton import (
    _buffer,
    _check,
    _kept_codes,
    sqrelu_24_compress,
    sqrelu_24_compress_ref,
)
from sparse_compile.kernels.cslt_compress_triton import cslt_compress_ref, cslt_compress_triton, random_24

sys.path.insert(0, "bench/experiments")
import act24_var  # noqa: E402

ceiling = copy_gbps()
print(f"copy {ceiling:.0f} GB/s", flush=True)


def fwd(kernel, z, tiles, warps, table):
    m, k = _check(z)
    h_buf, h_meta = _buffer(m, k, z)
    r_buf, r_meta = _buffer(m, k, z)
    kernel[(m // 64, triton.cdiv(k // 32, tiles))](
        z, h_buf, r_buf, h_meta, r_meta, _kept_codes(z.device), k, TILES=tiles, TABLE=table, num_warps=warps
    )
    return h_buf, r_buf


def compress(a, tiles, warps):
    m, k = a.shape
    out = torch.empty(m, k // 2 + k // 16, dtype=a.dtype, device=a.device)
    meta = out.view(-1).view(torch.int16)[m * k // 2 :]
    act24_var.cslt_table_kernel[(m // 64, triton.cdiv(k // 32, tiles))](
        a, out, meta, _kept_codes(a.device), k, TILES=tiles, num_warps=warps
    )
    return out


def row(label, fn, want, nbytes):
    got = fn()
    exact = all(torch.equal(a.view(torch.int16), b.view(torch.int16)) for a, b in zip(got, want, strict=True))
    ms = triton.testing.do_bench(fn, return_mode="median")
    print(f"{label:44s} exact {exact!s:5} {ms:.3f} ms {nbytes / ms / 1e6 / ceiling:.2f} of copy", flush=True)


for h in (8192, 16384):
    t = 16384
    z = torch.randn(t, h, device="cuda", dtype=torch.bfloat16)
    want = sqrelu_24_compress_ref(z)
    nbytes = t * h * 2 + 2 * t * h * (1 / 2 + 1 / 16) * 2
    row(f"{h} fwd default", lambda z=z: sqrelu_24_compress(z), want, nbytes)
    for tiles in (4, 8, 16):
        for warps in (4, 8):
            for name, table in (("fwdA", True), ("fwdB", True), ("fwdB", False)):
                k = getattr(act24_var, name + "_kernel")
                row(f"{h} {name} table={table} tiles {tiles} warps {warps}",
                    lambda k=k, z=z, ti=tiles, w=warps, tb=table: fwd(k, z, ti, w, tb), want, nbytes)  # fmt: skip
    a = random_24(t, h, torch.Generator("cuda").manual_seed(0), torch.bfloat16)
    want = (cslt_compress_ref(a),)
    nbytes = t * h * 2 + t * h * (1 / 2 + 1 / 16) * 2
    row(f"{h} compress default", lambda a=a: (cslt_compress_triton(a),), want, nbytes)
    for tiles in (4, 8, 16):
        for warps in (4, 8):
            row(f"{h} compress table tiles {tiles} warps {warps}",
                lambda a=a, ti=tiles, w=warps: (compress(a, ti, w),), want, nbytes)  # fmt: skip
