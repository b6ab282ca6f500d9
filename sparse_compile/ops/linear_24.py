"""sparse_compile::linear_24(x, w~, b, alg, bwd_alg) -> y: a linear with a 2:4 weight.

y = x w~^T + b for a 2:4 (transposable) weight: cuSPARSELt with algorithm ``alg``
(kernels/cslt_linear.py), or cuBLAS for -1. Backward: dx = linear_24(dy, w~^T, None, bwd_alg)
(w~^T is 2:4 along its rows too), dw = dy^T x, db = sum dy. With 2:4 weights alone the rewrite
swaps the FFN's two linears for it and leaves relu and square to Inductor.
"""

import torch
import torch.nn.functional as F


@torch.library.custom_op("sparse_compile::linear_24", mutates_args=())
def linear_24(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, alg: int, bwd_alg: int) -> torch.Tensor:
    x2 = x.reshape(-1, x.shape[-1])
    if alg < 0:
        y = F.linear(x2, w, b)
    else:
        from sparse_compile.kernels.cslt_linear import cslt_linear  # Triton: imported when used

        y = cslt_linear(x2.contiguous(), w, b, alg)
    return y.reshape(*x.shape[:-1], w.shape[0])


@linear_24.register_fake
def _(x, w, b, alg, bwd_alg):
    return x.new_empty((*x.shape[:-1], w.shape[0]))


def _linear_24_setup(ctx, inputs, output) -> None:
    x, w, b, _, bwd_alg = inputs
    ctx.save_for_backward(x, w)
    ctx.bwd_alg = bwd_alg
    ctx.has_bias = b is not None


def _linear_24_backward(ctx, dy):
    x, w = ctx.saved_tensors
    dx = torch.ops.sparse_compile.linear_24(dy, w.t(), None, ctx.bwd_alg, -1)
    dy2 = dy.reshape(-1, dy.shape[-1])
    dw = dy2.t() @ x.reshape(-1, x.shape[-1])
    return dx, dw, dy2.sum(0) if ctx.has_bias else None, None, None


linear_24.register_autograd(_linear_24_backward, setup_context=_linear_24_setup)
