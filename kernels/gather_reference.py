"""Pure-torch references for the compact V:N:M operand: scatter back to dense, and the two gather GEMMs.

Compact form (kernels/activation_mask.py:vnm_compact_ref): c [T, Kc] holds, for each block of V
tokens, the values of the Kc = F*4/M hidden columns listed in ids [T/V, Kc] (int32, absolute).

  vnm_scatter_ref(c, ids, v, f)      -> D [T, F], D[t, ids[t // V, k]] = c[t, k], 0 elsewhere
  gather_k_mm_ref(c, ids, b, v)      -> c @ b[ids] per block  = D @ b        (F2: b = W2^T, B3: b = W1)
  gather_n_mm_ref(a, bt, ids, v, r)  -> (a @ bt[ids]^T) * 2 r per block     (B1 with dZ fused: bt = W2^T)

The GEMM references go through the dense scatter, so they share nothing with the gather kernels.
"""

import torch


def vnm_scatter_ref(c: torch.Tensor, ids: torch.Tensor, v: int, f: int) -> torch.Tensor:
    """Dense [T, f] with c's values at their columns, zeros elsewhere."""
    rows = ids.long().repeat_interleave(v, dim=0)
    return torch.zeros(c.shape[0], f, dtype=c.dtype, device=c.device).scatter_(1, rows, c)


def gather_k_mm_ref(
    c: torch.Tensor, ids: torch.Tensor, b: torch.Tensor, v: int, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """[T, N] = scatter(c) @ b (+ bias); b is [F, N]."""
    out = vnm_scatter_ref(c, ids, v, b.shape[0]).float() @ b.float()
    return (out if bias is None else out + bias.float()).to(c.dtype)


def gather_n_mm_ref(
    a: torch.Tensor, bt: torch.Tensor, ids: torch.Tensor, v: int, r: torch.Tensor | None = None
) -> torch.Tensor:
    """[T, Kc]: (a @ bt^T) at the compact columns; with r, rounded to a's dtype then times 2 r."""
    full = (a.float() @ bt.float().t()).to(a.dtype)
    out = full.gather(1, ids.long().repeat_interleave(v, dim=0))
    if r is None:
        return out
    return (out.float() * (2.0 * r.float())).to(a.dtype)
