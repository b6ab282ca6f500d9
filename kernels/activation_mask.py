"""V:N:M ("Venom") and 2:4 activation masks: pure-torch reference.

H (T x F, non-negative: H = relu(Z)^2) is cut into blocks of V tokens x M features.
Each block keeps 4 of its M columns, the 4 with the largest column L1 norm over the
block's V tokens (accumulated in float32); inside those 4 columns every row keeps its
N largest entries. Density N/M. 2:4 along features is V=1, N=2, M=4.

Ties, both steps: the lower column index wins (the order of a stable descending sort).
Kept column ids are stored ascending. Selection is sort-free: an entry's rank is the number
of entries greater than it plus the number equal to it at a lower index, and the k entries
of rank < k are kept (one elementwise pass over [..., K, K] comparisons; K is M or 4).
"""

import torch


def _check(h: torch.Tensor, v: int, n: int, m: int) -> None:
    if h.dim() != 2:
        raise ValueError(f"vnm: expected a 2-D activation [T, F], got shape {tuple(h.shape)}")
    t, f = h.shape
    if t % v:
        raise ValueError(f"vnm: token count T={t} is not a multiple of V={v}")
    if f % m:
        raise ValueError(f"vnm: feature count F={f} is not a multiple of M={m}")
    if n not in (1, 2, 4) or m % 4 or m < 4:
        raise ValueError(f"vnm: pattern {v}:{n}:{m} needs N in (1, 2, 4) and M a multiple of 4")


def top_k_mask(values: torch.Tensor, k: int) -> torch.Tensor:
    """Bool mask of the k largest entries along the last dim; ties go to the lower index."""
    a = values.unsqueeze(-1)  # [..., K, 1]: this entry
    b = values.unsqueeze(-2)  # [..., 1, K]: every other entry
    idx = torch.arange(values.shape[-1], device=values.device)
    ahead = (b > a) | ((b == a) & (idx.unsqueeze(0) < idx.unsqueeze(1)))
    return ahead.sum(-1) < k


def vnm_select(h: torch.Tensor, v: int, n: int, m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Kept columns and in-row choice of the V:N:M pattern of ``h`` [T, F].

    Returns ``cols`` int64 [T/V, F/M, 4]: kept column ids inside each M-group, ascending;
    and ``keep`` bool [T, F/M, 4]: which of those 4 each row keeps (N per row).
    """
    _check(h, v, n, m)
    t, f = h.shape
    blocks = h.reshape(t // v, v, f // m, m)
    norms = blocks.sum(dim=1, dtype=torch.float32)  # [T/V, F/M, M]
    chosen = top_k_mask(norms, 4)
    # ascending ids of the 4 chosen columns: sort the column index, pushing unchosen ones to the end
    ids = torch.arange(m, device=h.device).expand_as(norms)
    cols = torch.where(chosen, ids, m + ids).sort(dim=-1).values[..., :4]
    vals = torch.gather(blocks, 3, cols.unsqueeze(1).expand(t // v, v, f // m, 4))
    keep = torch.ones_like(vals, dtype=torch.bool) if n == 4 else top_k_mask(vals, n)
    return cols, keep.reshape(t, f // m, 4)


def vnm_mask(h: torch.Tensor, v: int, n: int, m: int) -> torch.Tensor:
    """Boolean mask [T, F] of the V:N:M pattern of ``h`` (see module docstring)."""
    _check(h, v, n, m)
    t, f = h.shape
    blocks = h.reshape(t // v, v, f // m, m)
    chosen = top_k_mask(blocks.sum(dim=1, dtype=torch.float32), 4).unsqueeze(1)  # [T/V, 1, F/M, M]
    if n == 4:
        return chosen.expand(t // v, v, f // m, m).reshape(t, f)
    # N largest per row among the chosen columns: unchosen entries rank below every chosen one.
    ranked = torch.where(chosen, blocks.float(), float("-inf"))
    return (top_k_mask(ranked, n) & chosen).reshape(t, f)
