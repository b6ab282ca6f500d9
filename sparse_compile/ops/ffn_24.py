"""sparse_compile::sqrelu_ffn_24: the FFN with 2:4 activations, F2 and B3 on cuSPARSELt or cuBLAS.

sqrelu_ffn_24(x, w1, b1, w2, b2, spec) -> (y, r_buf)
    The reference's function (ops/ffn_reference.py) on kernels/ffn_act24_cslt.py; backward keeps
    r_buf, the sm90 cuSPARSELt buffer of R~ [T, h/2 + h/16].
sqrelu_ffn_24_backward(dy, x, w1, w2, r_buf, spec) -> (dx, dw1, db1, dw2, db2)
"""

import math

import torch

from sparse_compile.ops.spec import (
    OpSpec,
    backward_operands,
    ffn_autograd,
    ffn_setup,
    forward_operands,
    grads_like,
    parse_spec,
)


def _act24_of(spec: str, tokens: int) -> OpSpec:
    op = parse_spec(spec)
    if op.activations != (1, 2, 4) or op.act24_alg is None or tokens % 64:
        raise ValueError(
            f"sqrelu_ffn_24: spec {spec!r} with T={tokens}: needs activations=2:4, act24_alg and T % 64 == 0"
        )
    return op


@torch.library.custom_op("sparse_compile::sqrelu_ffn_24", mutates_args=())
def sqrelu_ffn_24(
    x: torch.Tensor,
    w1: torch.Tensor,
    b1: torch.Tensor | None,
    w2: torch.Tensor,
    b2: torch.Tensor | None,
    spec: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    from sparse_compile.kernels.ffn_act24_cslt import sqrelu_ffn_forward_24  # Triton: imported when used

    _, x2, w1, b1, w2, b2 = forward_operands(x, w1, b1, w2, b2, spec)
    op = _act24_of(spec, x2.shape[0])
    y, r_buf = sqrelu_ffn_forward_24(x2, w1, b1, w2, b2, op.act24_alg, op.f1_alg)
    return y.reshape(*x.shape[:-1], w2.shape[0]), r_buf


@sqrelu_ffn_24.register_fake
def _(x, w1, b1, w2, b2, spec):
    tokens = math.prod(x.shape[:-1])
    h = w1.shape[0]
    return x.new_empty((*x.shape[:-1], w2.shape[0])), x.new_empty((tokens, h // 2 + h // 16))


@torch.library.custom_op("sparse_compile::sqrelu_ffn_24_backward", mutates_args=())
def sqrelu_ffn_24_backward(
    dy: torch.Tensor, x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, r_buf: torch.Tensor, spec: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    from sparse_compile.kernels.ffn_act24_cslt import sqrelu_ffn_backward_24

    dy2, x2, w1c, w2c = backward_operands(dy, x, w1, w2)
    op = _act24_of(spec, x2.shape[0])
    dx, dw1, db1, dw2, db2 = sqrelu_ffn_backward_24(
        dy2, x2, w1c, w2c, r_buf, op.act24_alg, op.weight_grad, op.dense_frac
    )
    return dx.reshape(x.shape), dw1, db1, dw2, db2


@sqrelu_ffn_24_backward.register_fake
def _(dy, x, w1, w2, r_buf, spec):
    return grads_like(x, w1, w2)


sqrelu_ffn_24.register_autograd(ffn_autograd(torch.ops.sparse_compile.sqrelu_ffn_24_backward), setup_context=ffn_setup)
