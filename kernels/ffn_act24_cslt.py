"""Squared-ReLU FFN with 2:4 activations: F2 and B3 on cuSPARSELt with the activation sparse (or cuBLAS).

Same math as kernels/ffn_reference.py with the V:N:M pattern 1:2:4, GEMM by GEMM:
  F1  Z = X W1^T + b1               cuBLAS, or cuSPARSELt on W~1 (2:4 weights) given an algorithm id
      h_buf, r_buf = compress(Z)    one pass: relu^2, the 2:4 choice, two sm90 buffers (sqrelu_24_compress_triton.py)
  F2  Y = H~ W2^T + b2              cuSPARSELt, H~ the sparse operand (2:4 along h = K)
  B1  dH = dY W2                    cuBLAS (every entry of dH is computed; the kept half is used)
      dz_buf, dZ~, H~ = bwd(dH, r_buf)  one pass
  B3  dX = dZ~ W1                   cuSPARSELt, dZ~ the sparse operand
  B2  dW2 = dY^T H~, B4 dW1 = dZ~^T X   exact, cuBLAS on the dense masked operands (2:4 along h is
                                    not along these GEMMs' K = T), or the token-dim approximation
Between forward and backward only r_buf [T, h/2 + h/16] is kept. With algorithm -1 (cuSPARSELt
measured slower at the site's shape) the same pass writes the dense H~ instead of h_buf, F2 runs on
cuBLAS over it, and B3 over the dense dZ~ the backward pass writes anyway.
"""

import torch
import torch.nn.functional as F

from sparse_compile.kernels.cslt_linear import cslt_linear
from sparse_compile.kernels.ffn_reference import weight_grads
from sparse_compile.kernels.sqrelu_24_compress_triton import sqrelu_24_backward, sqrelu_24_compress
from sparse_compile.kernels.transpose_triton import transpose_copy


def sqrelu_ffn_forward_24(
    x: torch.Tensor,
    w1: torch.Tensor,
    b1: torch.Tensor | None,
    w2: torch.Tensor,
    b2: torch.Tensor | None,
    alg: int,
    f1_alg: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, d] -> (y [T, d_out], r_buf); ``alg``: cuSPARSELt's algorithm for F2 (-1: cuBLAS),
    ``f1_alg`` for F1 (None: cuBLAS)."""
    if f1_alg is None:
        z = F.linear(x, w1, b1)
    else:
        z = cslt_linear(x, w1, b1, f1_alg)
    if alg < 0:
        h, r_buf = sqrelu_24_compress(z, dense_h=True)
        return F.linear(h, w2, b2), r_buf
    h_buf, r_buf = sqrelu_24_compress(z)
    del z
    y = torch._cslt_sparse_mm(h_buf, transpose_copy(w2), alg_id=alg)  # cuSPARSELt's bias is per row of H~
    if b2 is not None:
        y += b2
    return y, r_buf


def sqrelu_ffn_backward_24(
    dy: torch.Tensor,
    x: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    r_buf: torch.Tensor,
    alg: int,
    weight_grad: tuple[int, int, int] | None = None,
    dense_frac: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dx [T, d], dw1 [h, d], db1 [h], dw2 [d_out, h], db2 [d_out]) of the forward above."""
    dz_buf, dz, h = sqrelu_24_backward(dy @ w2, r_buf)
    dw1, dw2 = weight_grads(dy, x, h, dz, weight_grad, dense_frac)
    del h
    dx = dz @ w1 if alg < 0 else torch._cslt_sparse_mm(dz_buf, w1.contiguous(), alg_id=alg)
    return dx, dw1, dz.sum(0), dw2, dy.sum(0)
