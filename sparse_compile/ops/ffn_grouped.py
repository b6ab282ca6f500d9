"""sparse_compile::sqrelu_ffn_grouped: per-token chunks (1:4:M in chunks of c) on grouped GEMMs
(kernels/ffn_grouped.py).

sqrelu_ffn_grouped(x, w1, b1, w2, b2, spec) -> (y, rp, src, offs, inv)
    each token keeps 4 of every M chunks, ranked on its own H over each chunk's first score_units
    units (all c without); rp = relu(Zp) [T k, c] on the rows sorted by chunk, src / offs / inv
    the sort (what the backward reads), k = 4 h / (M c).
sqrelu_ffn_grouped_backward(dy, x, w1, w2, rp, src, offs, inv, spec) -> (dx, dw1, db1, dw2, db2)
"""

import math

import torch

from sparse_compile.kernels.ffn_grouped import chunk_choice, grouped_ffn_backward, grouped_ffn_forward
from sparse_compile.ops import unit_perms
from sparse_compile.ops.spec import (
    backward_operands,
    ffn_autograd,
    ffn_setup,
    forward_operands,
    grads_like,
    parse_spec,
    permuted_weights,
    site_perm,
)


def _pattern(spec: str) -> tuple[tuple[int, int, int], int]:
    op = parse_spec(spec)
    pattern = op.activations
    if pattern is None or pattern[:2] != (1, 4) or op.chunk < 2:
        raise ValueError(f"sqrelu_ffn_grouped: spec {spec!r} needs activations 1:4:M in chunks of c > 1")
    return pattern, op.chunk


@torch.library.custom_op("sparse_compile::sqrelu_ffn_grouped", mutates_args=())
def sqrelu_ffn_grouped(
    x: torch.Tensor,
    w1: torch.Tensor,
    b1: torch.Tensor | None,
    w2: torch.Tensor,
    b2: torch.Tensor | None,
    spec: str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    op, x2, w1, b1, w2, b2 = forward_operands(x, w1, b1, w2, b2, spec)
    pattern, c = _pattern(spec)
    w1, b1, w2 = permuted_weights(op, pattern, x2, w1, b1, w2)
    choice = chunk_choice(x2, w1, b1, pattern[2], c, op.score_units)
    y, rp, src, offs, inv = grouped_ffn_forward(x2, w1, b1, w2, b2, choice, c)
    return y.reshape(*x.shape[:-1], w2.shape[0]), rp, src, offs, inv


@sqrelu_ffn_grouped.register_fake
def _(x, w1, b1, w2, b2, spec):
    (_, _, m), c = _pattern(spec)
    rows = math.prod(x.shape[:-1]) * 4 * w1.shape[0] // (m * c)
    index = lambda n: x.new_empty((n,), dtype=torch.int64)  # noqa: E731
    y = x.new_empty((*x.shape[:-1], w2.shape[0]))
    return y, x.new_empty((rows, c)), index(rows), x.new_empty((w1.shape[0] // c,), dtype=torch.int32), index(rows)


@torch.library.custom_op("sparse_compile::sqrelu_ffn_grouped_backward", mutates_args=())
def sqrelu_ffn_grouped_backward(
    dy: torch.Tensor,
    x: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    rp: torch.Tensor,
    src: torch.Tensor,
    offs: torch.Tensor,
    inv: torch.Tensor,
    spec: str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    pattern, c = _pattern(spec)
    perm = site_perm(parse_spec(spec), pattern, x.device)
    dy2, x2, w1c, w2c = backward_operands(dy, x, w1, w2, perm)
    dx, dw1, db1, dw2, db2 = grouped_ffn_backward(dy2, x2, w1c, w2c, rp, src, offs, inv, c)
    dw1, db1, dw2 = unit_perms.unpermute(dw1, db1, dw2, perm)
    return dx.reshape(x.shape), dw1, db1, dw2, db2


@sqrelu_ffn_grouped_backward.register_fake
def _(dy, x, w1, w2, rp, src, offs, inv, spec):
    return grads_like(x, w1, w2)


sqrelu_ffn_grouped.register_autograd(
    ffn_autograd(torch.ops.sparse_compile.sqrelu_ffn_grouped_backward), setup_context=ffn_setup
)
