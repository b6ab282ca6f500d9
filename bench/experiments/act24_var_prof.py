"""One call each of the package's fused 2:4 forward kernel and compressor, and of the 64-bit-table forward
variant (act24_var.py, TILES 4, 8 warps), at 16384 x 16384 bf16, for ncu."""

import sys

import torch
import triton

from sparse_compile.kernels.act24_cslt_triton import _buffer, _kept_codes, sqrelu_24_compress
from sparse_compile.kernels.cslt_compress_triton import cslt_compress_triton, random_24

sys.path.insert(0, "bench/experiments")
import act24_var  # noqa: E402

m = k = 16384
z = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
a = random_24(m, k, torch.Generator("cuda").manual_seed(0), torch.bfloat16)
sqrelu_24_compress(z)
h_buf, h_meta = _buffer(m, k, z)
r_buf, r_meta = _buffer(m, k, z)
act24_var.fwdA_kernel[(m // 64, triton.cdiv(k // 32, 4))](
    z, h_buf, r_buf, h_meta, r_meta, _kept_codes(z.device), k, TILES=4, TABLE=True, num_warps=8
)
cslt_compress_triton(a)
torch.cuda.synchronize()
