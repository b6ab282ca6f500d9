import torch
from sparse_compile.kernels.activation_select_triton import vnm_select_compact
from sparse_compile.kernels.gather_gemm_triton import gather_k_mm

t, d, h = 16384, 4096, 16384
z = torch.randn(t, h, device="cuda", dtype=torch.bfloat16)
for _ in range(3):
    h_c, r_c, ids = vnm_select_compact(z, None, 128, 2, 16)
w2t = (torch.randn(h, d, device="cuda") * h**-0.5).to(torch.bfloat16)
for _ in range(3):
    gather_k_mm(h_c, ids, w2t, 128)
torch.cuda.synchronize()
with torch.cuda.nvtx.range("sel"):
    vnm_select_compact(z, None, 128, 2, 16)
with torch.cuda.nvtx.range("gk"):
    gather_k_mm(h_c, ids, w2t, 128)
torch.cuda.synchronize()
print("done")
