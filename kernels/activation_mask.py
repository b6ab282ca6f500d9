"""V:N:M ("Venom") and 2:4 activation masks: pure-torch reference.

H (T x F, non-negative: H = relu(Z)^2) is cut into blocks of V tokens x M features.
Each block keeps 4 of its M columns, the 4 with the largest column L1 norm over the
block's V tokens (accumulated in float32); inside those 4 columns every row keeps its
N largest entries. Density N/M. 2:4 along features is V=1, N=2, M=4.

Ties, both steps: the lower column index wins (stable descending sort). Kept column ids
are stored ascending.
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


def vnm_select(h: torch.Tensor, v: int, n: int, m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Kept columns and in-row choice of the V:N:M pattern of ``h`` [T, F].

    Returns ``cols`` int64 [T/V, F/M, 4]: kept column ids inside each M-group, ascending;
    and ``keep`` bool [T, F/M, 4]: which of those 4 each row keeps (N per row).
    """
    _check(h, v, n, m)
    t, f = h.shape
    blocks = h.reshape(t // v, v, f // m, m)
    norms = blocks.sum(dim=1, dtype=torch.float32)  # [T/V, F/M, M]
    top = torch.sort(norms, dim=-1, descending=True, stable=True).indices[..., :4]
    cols = top.sort(dim=-1).values
    vals = torch.gather(blocks, 3, cols.unsqueeze(1).expand(t // v, v, f // m, 4))
    if n == 4:
        keep = torch.ones_like(vals, dtype=torch.bool)
    else:
        rank = torch.sort(vals, dim=-1, descending=True, stable=True).indices[..., :n]
        keep = torch.zeros_like(vals, dtype=torch.bool).scatter_(-1, rank, True)
    return cols, keep.reshape(t, f // m, 4)


def vnm_mask(h: torch.Tensor, v: int, n: int, m: int) -> torch.Tensor:
    """Boolean mask [T, F] of the V:N:M pattern of ``h`` (see module docstring)."""
    cols, keep = vnm_select(h, v, n, m)
    t, f = h.shape
    mask = torch.zeros(t // v, v, f // m, m, dtype=torch.bool, device=h.device)
    mask.scatter_(3, cols.unsqueeze(1).expand(t // v, v, f // m, 4), keep.reshape(t // v, v, f // m, 4))
    return mask.reshape(t, f)
