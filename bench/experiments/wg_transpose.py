"""The token-dim weight-gradient approximation (kernels/weight_grad_gather.py) with a[perm]^T as one
transpose_copy pass, against the exact a^T b and against the old row gather + torch transposed copy:
median ms at T = 16384, h = 16384, q = 4096, bf16; the new and old transposed operands compared."""

import torch
import triton.testing

from sparse_compile.kernels.transpose_triton import transpose_copy
from sparse_compile.kernels.weight_grad_approx import token_perm
from sparse_compile.kernels.weight_grad_gather import token_vnm_grad_gather

t, h, q = 16384, 16384, 4096
a = torch.randn(t, h, device="cuda", dtype=torch.bfloat16)
b = torch.randn(t, q, device="cuda", dtype=torch.bfloat16)
perm = token_perm(t, a.device)
same = torch.equal(transpose_copy(a, rows=perm), a.index_select(0, perm).t().contiguous())
rows = [
    ("exact a^T b", lambda: a.t() @ b),
    ("a[perm]^T, torch (before)", lambda: a.index_select(0, perm).t().contiguous()),
    ("a[perm]^T, transpose_copy", lambda: transpose_copy(a, rows=perm)),
    ("approximation 128:2:16, total", lambda: token_vnm_grad_gather(a, b, (128, 2, 16))),
    ("approximation 64:4:8, total", lambda: token_vnm_grad_gather(a, b, (64, 4, 8))),
]
print(f"transposed operands equal: {same}", flush=True)
for label, fn in rows:
    print(f"{label:32s} {triton.testing.do_bench(fn, return_mode='median'):.3f} ms", flush=True)
