"""Squared-ReLU FFN with routed tokens on the gather kernels (math: kernels/routing.py).

route     = argmax(X R^T + r)                  [T, G] scores: a GEMM with G columns
dest, bg  = route_plan(route)                  tokens sorted by group, groups padded to V
X_p       = X[src]                             padded rows: src = each row's token (token 0 for
                                               the padding, whose R~ is then set to 0)
ids       = cols[bg]                           [blocks, h*4/M]: each block its group's units
F1  R~    = relu(X_p W1[ids]^T + b1[ids]), H~ = R~^2
                                               gather-N GEMM with the activation epilogue: only
                                               the kept chunks (4/M of F1), Z [T, h] never written
F2  Y_p   = H~ W2^T[ids] + b2, Y = Y_p[dest]    gather-K GEMM
backward: dY_p = dY[src], then kernels/ffn_gather.py's chunk backward (B1 gather-N with dZ
epilogue, B2/B4 block-sparse along tokens, B3 gather-K) on the padded rows, dX = dX_p[dest],
db2 = sum of dY. The padding rows add nothing: their R~ is 0, so their dZ~ = (dY W2) * 2 R~
and H~ = R~^2 are 0, and so are their terms of dW1, db1 and dW2. All moves are gathers
(index_select); db2 sums the tokens' rows of dY, not the padded ones. Only R~ [rows, h*4/M], ids and
dest live from forward to backward.
"""

import torch

from sparse_compile.kernels.ffn_gather import sqrelu_ffn_backward_gather, w2t_for_gather
from sparse_compile.kernels.gather_gemm_triton import gather_k_mm, gather_n_mm
from sparse_compile.kernels.routing import padded_sources, padding_rows, route_plan


def sqrelu_ffn_forward_routed(
    x: torch.Tensor,
    w1: torch.Tensor,
    b1: torch.Tensor | None,
    w2: torch.Tensor,
    b2: torch.Tensor | None,
    route: torch.Tensor,
    cols: torch.Tensor,
    v: int,
    chunk: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [T, d], route int64 [T], cols int32 [G, h*4/M] -> (y [T, d_out], r_c [rows, h*4/M],
    ids int32 [rows/V, h*4/M], dest int64 [T])."""
    dest, block_group = route_plan(route, cols.shape[0], v)
    ids = cols.index_select(0, block_group)
    x_p = x.index_select(0, padded_sources(dest, ids.shape[0] * v))
    h_c = torch.empty(x_p.shape[0], ids.shape[1], device=x.device, dtype=x.dtype)
    r_c = gather_n_mm(x_p, w1, ids, v, chunk=chunk, act=True, bias=b1, square_out=h_c)
    # the padding rows' R~ to 0 (backward then needs no zero rows of dY): a write of those rows alone
    r_c.index_fill_(0, padding_rows(dest, r_c.shape[0]), 0)
    y_p = gather_k_mm(h_c, ids, w2t_for_gather(w2, chunk), v, b2, chunk=chunk)
    return y_p.index_select(0, dest), r_c, ids, dest


def sqrelu_ffn_backward_routed(
    dy: torch.Tensor,
    x: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    r_c: torch.Tensor,
    ids: torch.Tensor,
    dest: torch.Tensor,
    v: int,
    m: int,
    chunk: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dx [T, d], dw1, db1, dw2, db2) of the forward above, from its saved r_c, ids and dest."""
    src = padded_sources(dest, r_c.shape[0])
    dx_p, dw1, db1, dw2, db2 = sqrelu_ffn_backward_gather(
        dy.index_select(0, src), x.index_select(0, src), w1, w2, r_c, ids, v, m, chunk=chunk, db2_rows=dy
    )
    return dx_p.index_select(0, dest), dw1, db1, dw2, db2
