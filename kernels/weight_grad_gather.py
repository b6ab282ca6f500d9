"""Token-dimension approximation of B2 / B4 on the compact operand (Triton; reference:
kernels/weight_grad_approx.py:token_vnm_grad, same semantics).

  a [T, h] (H~ or dZ), b [T, q] (dY or X):  grad [h, q] ~= a^T b with a sparse along T
  1. a^T in the fixed token order: at = a[perm]^T                       [h, T]   (two copies)
  2. its compact V:N:M form scored by |at| (vnm_select_abs):            [h, T*4/M] + ids [h/V, T*4/M]
  3. grad = per block of V hidden units, at_c @ b[perm[ids]]            gather-K GEMM, K = T*4/M
     (the permutation goes into the ids, so b is read in place, never permuted)
  4. the round(dense_frac * h) hidden units with the most non-zeros: exact rows a[:, rows]^T b.
FLOPs 2*h*q*T*4/M instead of 2*h*q*T; bytes: a read three times and written twice (the row
gather, the transpose, the selection's read) plus the compact operand, b gathered per tile like a
dense B. (a^T[:, perm] in one indexing op is slower: a strided gather of 2-byte elements.)
"""

import torch

from sparse_compile.kernels.activation_select_triton import vnm_select_abs
from sparse_compile.kernels.gather_gemm_triton import gather_k_mm
from sparse_compile.kernels.transpose_triton import transpose_copy
from sparse_compile.kernels.weight_grad_approx import dense_rows, token_perm


def gather_supports(pattern: tuple[int, int, int]) -> bool:
    """Whether token_vnm_grad_gather runs ``pattern``: the gather-K GEMM needs V a multiple of 16."""
    return pattern[0] % 16 == 0


def token_vnm_grad_gather(
    a: torch.Tensor, b: torch.Tensor, pattern: tuple[int, int, int], dense_frac: float = 0.0
) -> torch.Tensor:
    """[h, q] ~= a^T b, the token-dim V:N:M approximation; exact if T % M != 0 or h % V != 0."""
    v, n, m = pattern
    if not gather_supports(pattern):
        raise ValueError(f"token_vnm_grad_gather: V={v}; the gather-K GEMM needs V a multiple of 16")
    t, h = a.shape
    if t % m or h % v:
        return a.t() @ b
    perm = token_perm(t, a.device)
    at = transpose_copy(a.contiguous(), rows=perm)  # a[perm]^T, the row gather and the transpose in one pass
    at_c, ids = vnm_select_abs(at, v, n, m)
    del at
    out = gather_k_mm(at_c, perm.to(torch.int32)[ids.long()], b.contiguous(), v)
    rows = dense_rows(a, dense_frac)
    if len(rows):
        out[rows] = a[:, rows].t() @ b
    return out
