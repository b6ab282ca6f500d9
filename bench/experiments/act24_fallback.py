"""The 2:4-activation forward when F2 runs on cuBLAS: before (the buffers pass, then activation_24's
masked H~ in a second pass over Z) against one pass writing r_buf and the dense H~ (dense_h=True);
median ms at T = 16384, bf16, h in (8192, 16384), outputs checked bit for bit."""

import torch
import triton.testing

from sparse_compile.kernels.act24_cslt_triton import sqrelu_24_compress
from sparse_compile.kernels.activation_24_triton import activation_24

for h in (8192, 16384):
    z = torch.randn(16384, h, device="cuda", dtype=torch.bfloat16)

    def before(z=z):
        _, r_buf = sqrelu_24_compress(z)
        return activation_24(z, masked=True)[2], r_buf

    def after(z=z):
        return sqrelu_24_compress(z, dense_h=True)

    same = all(torch.equal(a.view(torch.int16), b.view(torch.int16)) for a, b in zip(before(), after(), strict=True))
    ms = [triton.testing.do_bench(f, return_mode="median") for f in (before, after)]
    print(f"h {h}: same {same}  before {ms[0]:.3f} ms  after {ms[1]:.3f} ms", flush=True)
