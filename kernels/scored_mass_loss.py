"""The mass loss on the scoring rows (SparsityConfig.mass_loss_rows='scoring') on the chunked fast path.

The chunked path scored on S < V rows computes Z in full on the scoring rows alone (chunk_score_triton.py):
the last S rows of every block of V, then the first row of every sequence, n = T/V x S + T/seq rows in
that order. The mass loss on those rows (kernels/ffn_reference.py, ``mass_rows``) is
  L = (lambda / n) sum over the n rows t of D_t / sg(S_t),
D_t = sum of R_tu^2 over the units row t's own block drops (outside ids[t // V]), S_t = sum_u R_tu^2.
Its gradient
  dZ_s[t, u] = (lambda / n) 2 R_tu / S_t   on the dropped units, 0 on the kept ones (and where S_t = 0)
depends on Z_s and ids alone, not on dY, so the forward computes it from the Z_s it already has
(mass_dz_triton.mass_dz; mass_dz_ref here) and keeps dZ_s [n, h] (S/V of Z's size) until the backward.
Its support (dropped units) is disjoint from that of the kept entries' dZ_c, so the backward adds its
products apart (add_mass_grads):
  dX[rows] += dZ_s W1        [n, h] x [h, d]
  dW1      += dZ_s^T X_s     [h, n] x [n, d]
  db1      += sum_t dZ_s
two cuBLAS GEMMs of n/T (about S/V) of F1's work. dZ_s is rounded to the compute dtype once, as the
reference rounds its dZ (the kept entries' term is 0 on dropped units, so dZ's entries round alike); dX,
dW1 and db1 are rounded twice here (the kernels' outputs, then the add), once in the reference.
The forward computes dZ_s whenever the term is on, also under no_grad (a pass over [n, h] wasted there).
"""

import torch

from sparse_compile.kernels.ffn_reference import mass_loss_grad


def scoring_row_index(t: int, v: int, score_rows: int, seq: int, device: torch.device) -> torch.Tensor:
    """int64 [T/V x S + T/seq]: the token of each scoring row, in chunk_score_triton.scoring_rows' order."""
    last = torch.arange(v - score_rows, v, device=device) + torch.arange(0, t, v, device=device)[:, None]
    return torch.cat([last.reshape(-1), torch.arange(0, t, seq, device=device)])


def mass_dz_ref(zs: torch.Tensor, ids: torch.Tensor, v: int, score_rows: int, seq: int, lam: float) -> torch.Tensor:
    """zs [n, h] (Z on the scoring rows, scoring_row_index's order), ids [T/V, Kc] (each block's kept
    units) -> dZ_s [n, h] in zs' dtype: (lambda / n) 2 R / S_t on the units each row's block drops: the
    reference's term (mass_loss_grad) over the n rows, each with its own block's mask. Pure torch (the
    reference of mass_dz_triton.mass_dz)."""
    n, h = zs.shape
    blocks = ids.shape[0]
    if n != blocks * score_rows + blocks * v // seq:
        raise ValueError(
            f"mass_dz_ref: zs {tuple(zs.shape)}; expected {blocks * score_rows + blocks * v // seq} rows for {blocks} "
            f"blocks of {v}, score_rows={score_rows}, seq={seq}"
        )
    kept = torch.zeros(blocks, h, dtype=torch.bool, device=zs.device).scatter_(1, ids.long(), True)
    rows_block = scoring_row_index(blocks * v, v, score_rows, seq, zs.device) // v
    r = torch.relu(zs)
    return mass_loss_grad(torch.where(kept[rows_block], r, -r), lam)[1].to(zs.dtype)


def add_mass_grads(
    dx: torch.Tensor,
    dw1: torch.Tensor,
    db1: torch.Tensor,
    dz_s: torch.Tensor,
    x: torch.Tensor,
    w1: torch.Tensor,
    v: int,
    score_rows: int,
    seq: int,
) -> None:
    """dX [T, d], dW1 [h, d], db1 [h] (in place) += the products of dZ_s [n, h] (mass_dz) with W1 [h, d]
    and with x [T, d]'s scoring rows."""
    rows = scoring_row_index(x.shape[0], v, score_rows, seq, x.device)
    if dz_s.shape != (rows.numel(), w1.shape[0]):
        raise ValueError(f"add_mass_grads: dz_s {tuple(dz_s.shape)}; expected [{rows.numel()}, {w1.shape[0]}]")
    dx.index_add_(0, rows, dz_s @ w1)  # each row once: no two adds meet
    dw1.addmm_(dz_s.t(), x.index_select(0, rows))
    db1.add_(dz_s.sum(0))
