"""Squared-ReLU FFN with routed tokens on the gather kernels (math: kernels/routing.py).

  route     = argmax(X R^T + r)                  [T, G] scores: a GEMM with G columns
  dest, bg  = route_plan(route)                  tokens sorted by group, groups padded to V
  X_p       = X scattered to the padded rows     zero rows between groups
  ids       = cols[bg]                           [blocks, h*4/M]: each block its group's units
  F1  R~    = relu(X_p W1[ids]^T + b1[ids]), H~ = R~^2
                                                 gather-N GEMM with the activation epilogue: only
                                                 the kept chunks (4/M of F1), Z [T, h] never written
  F2  Y_p   = H~ W2^T[ids] + b2, Y = Y_p[dest]    gather-K GEMM
  backward: dY_p = dY scattered to the padded rows, then kernels/ffn_gather.py's chunk backward
  (B1 gather-N with dZ epilogue, B2/B4 block-sparse along tokens, B3 gather-K) on the padded rows,
  dX = dX_p[dest]. The zero rows add nothing: dY_p is 0 there, so dZ~ is 0 and so are their
  weight-gradient terms. Only R~ [rows, h*4/M], ids and dest live from forward to backward.
"""

import torch

from sparse_compile.kernels.ffn_gather import _w2t, sqrelu_ffn_backward_gather
from sparse_compile.kernels.gather_gemm_triton import gather_k_mm, gather_n_mm
from sparse_compile.kernels.routing import route_plan


def pad_rows(x: torch.Tensor, dest: torch.Tensor, rows: int) -> torch.Tensor:
    """[rows, d]: row dest[t] holds x[t]; the other rows are 0."""
    out = x.new_zeros(rows, x.shape[1])
    return out.index_copy_(0, dest, x)


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
    ids = cols[block_group].contiguous()
    x_p = pad_rows(x, dest, ids.shape[0] * v)
    h_c = torch.empty(x_p.shape[0], ids.shape[1], device=x.device, dtype=x.dtype)
    r_c = gather_n_mm(x_p, w1, ids, v, chunk=chunk, act=True, bias=b1, square_out=h_c)
    y_p = gather_k_mm(h_c, ids, _w2t(w2, chunk), v, b2, chunk=chunk)
    return y_p[dest], r_c, ids, dest


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
    rows = r_c.shape[0]
    dx_p, dw1, db1, dw2, db2 = sqrelu_ffn_backward_gather(
        pad_rows(dy, dest, rows), pad_rows(x, dest, rows), w1, w2, r_c, ids, v, m, chunk=chunk
    )
    return dx_p[dest], dw1, db1, dw2, db2
