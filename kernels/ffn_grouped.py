"""Per-token chunks on grouped GEMMs: each token keeps 4 of every M chunks of c hidden units (the
pattern 1:4:M in chunks of c), and each chunk runs as an "expert" over the tokens that kept it
(torch._grouped_mm over the token rows sorted by chunk, as MoE layers run their experts).

Notation (ffn_reference.py): X [T, d], W1 [h, d] as E = h / c chunks W1c [E, c, d], W2 [d_out, h]
as W2c [E, d_out, c], H = relu(X W1^T + b1)^2.

Choice (``chunk_choice``): token t ranks the chunks of each run of M on its H over each chunk's first
r units (SparsityConfig.score_units; all c when None),
    S[t, e] = sum_{j < r} relu(x_t W1[e c + j] + b1[e c + j])^2   (the product in x's dtype, the sum in float32),
and keeps the first 4 of a stable descending sort (ties to the lower chunk): the choice of
activation_mask.vnm_mask(H, 1, 4, M, c, score_units=r). F1 runs on E r of the h units for it.

Rows (``chunk_rows``): the R = T k pairs (token, kept chunk), k = 4 E / M, stably sorted by chunk:
src [R] the token of each row, offs [E] int32 the cumulative row ends, inv [T k] the sorted position
of token t's j-th kept chunk. No shape depends on the data, and nothing waits on the host.

  forward   Xp = X[src]; Zp = Xp W1c^T + b1c (per chunk); Rp = relu(Zp); Yp = Rp^2 W2c^T;
            Y[t] = sum_j Yp[inv[t k + j]] + b2 (accumulated in float32; grouped_sums_triton on CUDA)
  backward  dYp = dY[src]; dZp = (dYp W2c) * 2 Rp; dW2c = dYp^T Rp^2; dW1c = dZp^T Xp and db1c = dZp^T 1
            (per chunk: offsets along R); dX[t] = sum_j (dZp W1c)[inv[t k + j]]; db2 = sum_t dY
Rounding (bf16): each GEMM's output is rounded, so Zp before b1 is added and each of a token's k
rows of Yp and of dX before their sum; the reference rounds each once, from one fused GEMM.
Every GEMM does 4/M of the dense one's work. A chunk GEMM reads a token row per c columns it
computes, about c FLOP per byte, so grouped GEMMs on small chunks are bound by memory, not FLOPs.
A chunk no token kept is an empty group; its weight gradients are set to zero here.
"""

import torch
import torch.nn.functional as F


def chunk_choice(
    x: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor | None, m: int, c: int, r: int | None = None
) -> torch.Tensor:
    """int64 [T, 4 E / M]: each row of x [T, d]'s kept chunks of W1 [h, d] (E = h / c chunks), 4 in
    every run of M, ranked on the first ``r`` units of each chunk (None: all c), in run order."""
    t, e = x.shape[0], w1.shape[0] // c
    if r is None or r == c:
        z = F.linear(x, w1, b1)
    else:
        rep = (torch.arange(e, device=x.device)[:, None] * c + torch.arange(r, device=x.device)).reshape(-1)
        z = F.linear(x, w1.index_select(0, rep), None if b1 is None else b1.index_select(0, rep))
    rr = torch.relu(z)
    scores = (rr * rr).view(t, e // m, m, r or c).sum(-1, dtype=torch.float32)  # [T, E/M, M]
    top = torch.sort(scores, dim=-1, descending=True, stable=True).indices[..., :4]
    return (top + m * torch.arange(e // m, device=x.device)[:, None]).reshape(t, 4 * (e // m))


def choice_mask(choice: torch.Tensor, h: int, c: int) -> torch.Tensor:
    """bool [T, h]: the units of each token's ``choice`` [T, k] of chunks of c units (the pattern's mask)."""
    keep = torch.zeros(choice.shape[0], h // c, dtype=torch.bool, device=choice.device).scatter_(1, choice, True)
    return keep.repeat_interleave(c, dim=1)


def chunk_rows(choice: torch.Tensor, e: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """From ``choice`` [T, k] (each token's k distinct chunk ids of e): (src [T k] the token of each row
    sorted by chunk, stable; chunk [T k] each sorted row's chunk; offs [e] int32 the cumulative row ends
    per chunk; inv [T k] the sorted position of token t's j-th chunk, row t k + j)."""
    t, k = choice.shape
    chunk, order = torch.sort(choice.reshape(-1), stable=True)
    ends = torch.searchsorted(chunk, torch.arange(e, device=choice.device), right=True)
    inv = torch.empty_like(order)
    inv[order] = torch.arange(order.numel(), device=choice.device)
    return order // k, chunk, ends.to(torch.int32), inv


def chunk_weights(w1: torch.Tensor, w2: torch.Tensor, c: int) -> tuple[torch.Tensor, torch.Tensor]:
    """W1 [h, d] and W2 [d_out, h] as chunks of c units: W1c [E, c, d] (a view) and W2c [E, d_out, c]
    (a copy: each chunk's columns of W2 one contiguous matrix)."""
    d_out, e = w2.shape[0], w1.shape[0] // c
    return w1.view(e, c, w1.shape[1]), w2.view(d_out, e, c).permute(1, 0, 2).contiguous()


def _per_token_sum(rows: torch.Tensor, inv: torch.Tensor, k: int, bias: torch.Tensor | None = None) -> torch.Tensor:
    """[T, n]: each token's k rows of ``rows`` [T k, n] (sorted by chunk), plus ``bias`` [n] when given, summed
    in float32 and rounded once to rows' dtype (on CUDA without the gathered copy: grouped_sums_triton)."""
    if rows.is_cuda:
        from sparse_compile.kernels.grouped_sums_triton import token_sum  # Triton: imported when used

        return token_sum(rows, inv, k, bias)
    total = rows.index_select(0, inv).view(-1, k, rows.shape[1]).float().sum(1)
    return (total if bias is None else total + bias.float()).to(rows.dtype)


def _counts(offs: torch.Tensor) -> torch.Tensor:
    """int64 [E]: each chunk's rows, from ``offs`` [E] (the cumulative row ends)."""
    return torch.diff(offs.long(), prepend=offs.new_zeros(1).long())


def _chunk_colsum(rows: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """float32 [E, c]: the column sums of each chunk's run of ``rows`` [R, c] (rows sorted by chunk,
    ``offs`` the runs' ends), in a fixed order (grouped_sums_triton.segment_colsum on CUDA)."""
    if rows.is_cuda:
        from sparse_compile.kernels.grouped_sums_triton import segment_colsum

        return segment_colsum(rows, offs)
    chunk = torch.repeat_interleave(torch.arange(offs.numel()), _counts(offs))
    return torch.zeros(offs.numel(), rows.shape[1]).index_add_(0, chunk, rows.float())


def _nonempty(grad: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """``grad`` [E, ...] of a grouped GEMM along rows, with the groups no row fell in set to zero."""
    return torch.where((_counts(offs) > 0).view(-1, *([1] * (grad.dim() - 1))), grad, 0)  # 0 * NaN stays NaN


def grouped_ffn_forward(
    x: torch.Tensor,
    w1: torch.Tensor,
    b1: torch.Tensor | None,
    w2: torch.Tensor,
    b2: torch.Tensor | None,
    choice: torch.Tensor,
    c: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [T, d] -> (y [T, d_out], Rp [T k, c], src, offs, inv: what the backward reads), each token on
    its ``choice`` [T, k] of chunks (module docstring)."""
    t, e, k = x.shape[0], w1.shape[0] // c, choice.shape[1]
    src, chunk, offs, inv = chunk_rows(choice, e)
    if t == 0:
        y = x.new_zeros((0, w2.shape[0]))
        return y, x.new_zeros((0, c)), src, offs, inv
    w1c, w2c = chunk_weights(w1, w2, c)
    xp = x.index_select(0, src)
    zp = torch._grouped_mm(xp, w1c.transpose(1, 2), offs=offs)  # [R, c]
    if b1 is not None:
        zp += b1.view(e, c).index_select(0, chunk)
    rp = torch.relu(zp)
    yp = torch._grouped_mm(rp * rp, w2c.transpose(1, 2), offs=offs)  # [R, d_out]
    return _per_token_sum(yp, inv, k, b2), rp, src, offs, inv


def grouped_ffn_backward(
    dy: torch.Tensor,
    x: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    rp: torch.Tensor,
    src: torch.Tensor,
    offs: torch.Tensor,
    inv: torch.Tensor,
    c: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients (dx [T, d], dw1 [h, d], db1 [h], dw2 [d_out, h], db2 [d_out]) of grouped_ffn_forward,
    the choice held constant; all in dy's dtype."""
    t, d = x.shape
    d_out, e = w2.shape[0], w1.shape[0] // c
    if t == 0:
        zero = lambda *shape: dy.new_zeros(shape)  # noqa: E731
        return zero(0, d), zero(e * c, d), zero(e * c), zero(d_out, e * c), zero(d_out)
    w1c, w2c = chunk_weights(w1, w2, c)
    dyp = dy.index_select(0, src)
    dhp = torch._grouped_mm(dyp, w2c, offs=offs)  # [R, c]
    dzp = dhp.mul_(rp).mul_(2.0)  # d/dz relu(z)^2 = 2 relu(z); the product rounded once, as in float32
    dw2 = _nonempty(torch._grouped_mm(dyp.t(), rp * rp, offs=offs), offs)  # [E, d_out, c]
    dw1 = _nonempty(torch._grouped_mm(dzp.t(), x.index_select(0, src), offs=offs), offs)  # [E, c, d]
    db1 = _chunk_colsum(dzp, offs).to(dy.dtype)  # [E, c]
    dx = _per_token_sum(torch._grouped_mm(dzp, w1c, offs=offs), inv, inv.numel() // t)
    return dx, dw1.reshape(-1, d), db1.reshape(-1), dw2.permute(1, 0, 2).reshape(d_out, -1), dy.sum(0)
