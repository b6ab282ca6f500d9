"""sparse_compile::sqrelu_ffn: the FFN on the pure-torch reference (masked dense math).

sqrelu_ffn(x, w1, b1, w2, b2, spec) -> (y, r_masked)
    x [..., d] -> y [..., d_out] with the activation pattern of ``spec`` (kernels/ffn_reference.py);
    r_masked [T, h] = relu(Z) * A is what backward needs (not differentiable); with a mass loss
    (SparsityConfig.mass_loss), relu(Z) * (2A - 1): the dropped units' R as well, negated.
sqrelu_ffn_backward(dy, x, w1, w2, r_masked, spec) -> (dx, dw1, db1, dw2, db2)
A call whose token count is not a multiple of V runs its activations dense and warns once.
"""

import math

import torch

from sparse_compile.kernels import sqrelu_ffn_backward_ref, sqrelu_ffn_forward_ref
from sparse_compile.kernels.scored_mass_loss import scoring_row_index
from sparse_compile.ops import unit_perms
from sparse_compile.ops.spec import (
    OpSpec,
    activation_pattern_for,
    backward_operands,
    causal_seq,
    ffn_autograd,
    ffn_setup,
    forward_operands,
    grads_like,
    parse_spec,
    permuted_weights,
    site_perm,
)


@torch.library.custom_op("sparse_compile::sqrelu_ffn", mutates_args=())
def sqrelu_ffn(
    x: torch.Tensor,
    w1: torch.Tensor,
    b1: torch.Tensor | None,
    w2: torch.Tensor,
    b2: torch.Tensor | None,
    spec: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    op, x2, w1, b1, w2, b2 = forward_operands(x, w1, b1, w2, b2, spec)
    pattern = activation_pattern_for(op, x2.shape[0])
    seq = causal_seq(op, x) if pattern is not None else None
    w1, b1, w2 = permuted_weights(op, pattern, x2, w1, b1, w2)
    y, r_masked = sqrelu_ffn_forward_ref(
        x2, w1, b1, w2, b2, pattern, op.chunk, seq, op.score_rows, op.token_extra, op.score_units, op.mass_loss > 0
    )  # the last: signed R for the mass loss's backward
    return y.reshape(*x.shape[:-1], w2.shape[0]), r_masked


@sqrelu_ffn.register_fake
def _(x, w1, b1, w2, b2, spec):
    tokens = math.prod(x.shape[:-1])
    return x.new_empty((*x.shape[:-1], w2.shape[0])), x.new_empty((tokens, w1.shape[0]))


@torch.library.custom_op("sparse_compile::sqrelu_ffn_backward", mutates_args=())
def sqrelu_ffn_backward(
    dy: torch.Tensor, x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, r_masked: torch.Tensor, spec: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    op = parse_spec(spec)
    perm = site_perm(op, activation_pattern_for(op, math.prod(dy.shape[:-1])), x.device)
    dy2, x2, w1c, w2c = backward_operands(dy, x, w1, w2, perm)
    rows = scoring_rows(op, x, dy.device) if op.mass_loss_rows == "scoring" else None
    dx, dw1, db1, dw2, db2 = sqrelu_ffn_backward_ref(
        dy2, x2, w1c, w2c, r_masked, op.weight_grad, op.dense_frac, op.mass_loss, rows
    )
    dw1, db1, dw2 = unit_perms.unpermute(dw1, db1, dw2, perm)
    return dx.reshape(x.shape), dw1, db1, dw2, db2


def scoring_rows(op: OpSpec, x: torch.Tensor, device: torch.device) -> torch.Tensor | None:
    """bool [T] for x [..., seq, d]: the last score_rows rows of every V-token block and each sequence's
    first token (kernels/scored_mass_loss.scoring_row_index: the rows whose H the chunked fast path computes
    in full where it applies; SparsityConfig.mass_loss_rows='scoring'), each once; None where the call ran
    dense (T not a multiple of V)."""
    tokens = math.prod(x.shape[:-1])
    if activation_pattern_for(op, tokens) is None:
        return None
    rows = torch.zeros(tokens, dtype=torch.bool, device=device)
    rows[scoring_row_index(tokens, op.activations[0], op.score_rows, causal_seq(op, x), device)] = True
    return rows


@sqrelu_ffn_backward.register_fake
def _(dy, x, w1, w2, r_masked, spec):
    return grads_like(x, w1, w2)


sqrelu_ffn.register_autograd(ffn_autograd(torch.ops.sparse_compile.sqrelu_ffn_backward), setup_context=ffn_setup)
