"""One call of the package's one-read selection and of the g3b variant at 128:2:16 and 64:2:8, for ncu."""

import sys

import torch

from sparse_compile.kernels.activation_select_triton import vnm_select_compact

sys.path.insert(0, "bench/experiments")
import sel_var  # noqa: E402

t = h = 16384
z = torch.randn(t, h, device="cuda", dtype=torch.bfloat16)
b = torch.randn(h, device="cuda", dtype=torch.bfloat16) * 0.1
for v, n, m in [(128, 2, 16), (64, 2, 8)]:
    vnm_select_compact(z, b, v, n, m, block_g=64 // m, onchip=True, gather_z=True)
    sel_var.launch(sel_var.g3b_kernel, z, b, v, n, m, 64 // m, 4)
torch.cuda.synchronize()
print("done")
