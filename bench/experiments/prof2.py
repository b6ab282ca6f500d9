import torch
from sparse_compile.kernels.activation_select_triton import vnm_select_compact

z = torch.randn(16384, 16384, device="cuda", dtype=torch.bfloat16)
for p in [(128, 2, 16), (128, 2, 8)]:
    for _ in range(3):
        vnm_select_compact(z, None, *p)
torch.cuda.synchronize()
with torch.cuda.nvtx.range("s16"):
    vnm_select_compact(z, None, 128, 2, 16)
with torch.cuda.nvtx.range("s8"):
    vnm_select_compact(z, None, 128, 2, 8)
torch.cuda.synchronize()
