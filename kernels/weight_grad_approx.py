"""Token-dimension approximation of the weight gradients B2 = dY^T H~ and B4 = dZ^T X (reference).

Both are A^T B with A [T, h] (H~ or dZ), B [T, q] (dY or X) and K = T. The approximation makes A
sparse along the tokens with a V:N:M pattern on A^T [h, T]: per block of V hidden units x M tokens
keep the 4 token columns of largest L1 norm of |A|, then per hidden unit the N largest of those 4.
Tokens are first put in a fixed random order (seed 0, one permutation per T), so that an M-group
of tokens is not a run of neighbours. The hidden units in the top ``dense_frac`` by count of
non-zeros over T (ties: lower index) keep their exact rows. Because every block of V hidden
units keeps the same 4/M of the tokens, a gather-K GEMM (kernels/gather_gemm_triton.py) can
compute it with K shrunk by M/4; this file is the semantics (masked dense math), not that kernel.
"""

import functools

import torch

from sparse_compile.kernels.activation_mask import vnm_mask


@functools.cache
def _perm(tokens: int, device: torch.device) -> torch.Tensor:
    return torch.randperm(tokens, generator=torch.Generator().manual_seed(0)).to(device)


def token_perm(tokens: int, device: torch.device | str) -> torch.Tensor:
    """The fixed token order used for ``tokens`` tokens (int64 [T])."""
    return _perm(tokens, torch.device(device))


def dense_rows(a: torch.Tensor, dense_frac: float) -> torch.Tensor:
    """Indices of the round(dense_frac * h) columns of a [T, h] with the most non-zeros (ties: lower index)."""
    k = round(dense_frac * a.shape[1])
    counts = (a != 0).sum(0)
    return torch.sort(counts, descending=True, stable=True).indices[:k]


def token_vnm_grad(
    a: torch.Tensor, b: torch.Tensor, pattern: tuple[int, int, int], dense_frac: float = 0.0
) -> torch.Tensor:
    """[h, q] ~= a^T b with a [T, h] sparsified along T as described above; exact if T % M != 0 or h % V != 0."""
    v, n, m = pattern
    t, h = a.shape
    if t % m or h % v:
        return a.t() @ b
    perm = token_perm(t, a.device)
    at = a.t()[:, perm]  # [h, T] in the fixed token order
    bp = b[perm]
    keep = vnm_mask(at.abs(), v, n, m)
    out = (at * keep) @ bp
    rows = dense_rows(a, dense_frac)
    if len(rows):
        out[rows] = at[rows] @ bp
    return out
