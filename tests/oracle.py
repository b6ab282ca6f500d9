"""Independent reference for the sparse FFN: masked dense math + autograd, masks held constant.

Shares only the mask functions with the op (their correctness is tested on its own in
test_reference_kernels.py); forward and all gradients come from plain autograd.
"""

import torch
import torch.nn.functional as F

from sparse_compile import SparsityConfig
from sparse_compile.kernels import transposable_24_mask, vnm_mask


def token_extra_loop(h: torch.Tensor, keep: torch.Tensor, r: int) -> torch.Tensor:
    """keep [T, F] with each row's r largest positive entries of h outside it added, row by row from
    a descending sort (the definition of SparsityConfig.token_extra)."""
    out = keep.clone()
    if r <= 0:
        return out
    for t in range(h.shape[0]):
        order = torch.sort(h[t].masked_fill(keep[t], -1.0), descending=True, stable=True).indices
        out[t, [u for u in order[:r].tolist() if h[t, u] > 0 and not keep[t, u]]] = True
    return out


def score_units_loop(h: torch.Tensor, m: int, c: int, r: int) -> torch.Tensor:
    """Per-token chunks (1:4:M in chunks of c), token by token and group by group: the 4 chunks of each
    group of M whose first r units hold the most of the token's H (float32 sums, ties to the lower chunk
    from a stable descending sort), kept whole (the definition of SparsityConfig.score_units)."""
    t, f = h.shape
    keep = torch.zeros(t, f, dtype=torch.bool)
    for i in range(t):
        for g in range(f // (m * c)):
            base = g * m * c
            scores = torch.stack([h[i, base + j * c : base + j * c + r].float().sum() for j in range(m)])
            for j in torch.sort(scores, descending=True, stable=True).indices[:4].tolist():
                keep[i, base + j * c : base + (j + 1) * c] = True
    return keep


def oracle_keep(h2: torch.Tensor, config: SparsityConfig, seq: int | None) -> torch.Tensor:
    """The activation mask [T, F] of ``config`` on h2 [T, F]: its V:N:M pattern (causal over ``seq``
    tokens; per-token chunks ranked on their first score_units units by score_units_loop), then each
    token's token_extra units (token_extra_loop)."""
    if config.score_units is not None:
        return score_units_loop(h2, config.activation_pattern[2], config.chunk, config.score_units)
    keep = vnm_mask(h2, *config.activation_pattern, config.chunk, seq, config.score_rows)
    return token_extra_loop(h2, keep, config.token_extra)


def oracle_ffn(x, w1, b1, w2, b2, config: SparsityConfig):
    """y and gradients (dict name -> grad) of sum(y * gy) for a random gy, straight-through weights."""
    leaves = {}

    def leaf(name, t, masked=False):
        if t is None:
            return None
        if masked and config.weights:
            t = t * transposable_24_mask(t)
        leaves[name] = t.detach().clone().requires_grad_(True)
        return leaves[name]

    xl, w1l, b1l, w2l, b2l = (
        leaf("x", x),
        leaf("w1", w1, True),
        leaf("b1", b1),
        leaf("w2", w2, True),
        leaf("b2", b2),
    )
    h = torch.relu(F.linear(xl, w1l, b1l)) ** 2
    pattern = config.activation_pattern
    if pattern is not None:
        h2 = h.reshape(-1, h.shape[-1])
        if h2.shape[0] % pattern[0] == 0:
            seq = (h.shape[-2] if h.dim() >= 3 else h2.shape[0]) if config.causal else None
            h = h * oracle_keep(h2.detach(), config, seq).reshape(h.shape)
    y = F.linear(h, w2l, b2l)
    return y, leaves
