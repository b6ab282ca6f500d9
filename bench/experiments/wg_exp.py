"""One-off: the pieces of token_vnm_grad_gather at T=16384, h=16384, q=4096 (bf16) vs exact a^T b."""
import torch
import triton.testing

from sparse_compile.kernels.activation_select_triton import vnm_select_abs
from sparse_compile.kernels.gather_gemm_triton import gather_k_mm
from sparse_compile.kernels.weight_grad_approx import token_perm
from sparse_compile.kernels.weight_grad_gather import token_vnm_grad_gather


def ms(fn):
    return triton.testing.do_bench(fn, warmup=10, rep=50, return_mode="median")


t, h, q = 16384, 16384, 4096
a = (torch.relu(torch.randn(t, h, device="cuda")) ** 2).to(torch.bfloat16)
b = torch.randn(t, q, device="cuda", dtype=torch.bfloat16)
perm = token_perm(t, a.device)
for v, n, m in [(128, 2, 16), (64, 4, 8)]:
    at = a.index_select(0, perm).t().contiguous()
    at_c, ids = vnm_select_abs(at, v, n, m)
    idt = perm.to(torch.int32)[ids.long()]
    rows = [
        ("exact a^T b", lambda: a.t() @ b),
        ("a^T[:, perm] one op", lambda: a.t()[:, perm].contiguous()),
        ("a[perm]^T two copies", lambda: a.index_select(0, perm).t().contiguous()),
        ("select abs", lambda: vnm_select_abs(at, v, n, m)),
        ("ids through perm", lambda: perm.to(torch.int32)[ids.long()]),
        ("gather_k", lambda: gather_k_mm(at_c, idt, b, v)),
        ("total", lambda: token_vnm_grad_gather(a, b, (v, n, m))),
        ("total dense_frac 0.02", lambda: token_vnm_grad_gather(a, b, (v, n, m), 0.02)),
    ]
    for name, fn in rows:
        print(f"{v}:{n}:{m} {name:24s} {ms(fn):.3f} ms", flush=True)
