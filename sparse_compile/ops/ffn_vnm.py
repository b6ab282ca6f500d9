"""sparse_compile::sqrelu_ffn_vnm: the FFN with V:N:M activations on the compact operand.

sqrelu_ffn_vnm(x, w1, b1, w2, b2, spec) -> (y, r_c, ids, dz_s)
    The reference's function (ops/ffn_reference.py) on the Triton gather kernels
    (kernels/ffn_gather.py); backward keeps r_c [T, h*4/M] and ids [T/V, h*4/M], and dz_s: with the
    mass loss on the scoring rows (SparsityConfig.mass_loss_rows='scoring'), its dZ on those rows
    [T/V x S + T/seq, h] (kernels/scored_mass_loss.py); else [0, h].
sqrelu_ffn_vnm_backward(dy, x, w1, w2, r_c, ids, dz_s, spec) -> (dx, dw1, db1, dw2, db2)
"""

import math

import torch

from sparse_compile.ops import unit_perms
from sparse_compile.ops.spec import (
    OpSpec,
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


def _vnm_of(spec: str, tokens: int) -> tuple[int, int, int]:
    pattern = parse_spec(spec).activations
    if pattern is None or tokens % pattern[0]:
        raise ValueError(f"sqrelu_ffn_vnm: spec {spec!r} with T={tokens}: needs V:N:M activations and T % V == 0")
    return pattern


def _mass_rows(op: OpSpec, x: torch.Tensor) -> int:
    """Rows of dz_s: T/V x score_rows + T/seq with the mass loss on the scoring rows, else 0 (the "all"
    rows' term needs H in full: the plan sends it to the reference)."""
    if not op.mass_loss:
        return 0
    if op.mass_loss_rows != "scoring" or not op.causal or op.score_rows is None:
        raise ValueError(
            f"sqrelu_ffn_vnm: mass_loss_rows={op.mass_loss_rows!r}, causal={op.causal}, score_rows={op.score_rows}; "
            "the gather path takes the term on the scoring rows of a causal pattern with score_rows"
        )
    tokens = math.prod(x.shape[:-1])
    return tokens // op.activations[0] * op.score_rows + tokens // causal_seq(op, x)


@torch.library.custom_op("sparse_compile::sqrelu_ffn_vnm", mutates_args=())
def sqrelu_ffn_vnm(
    x: torch.Tensor,
    w1: torch.Tensor,
    b1: torch.Tensor | None,
    w2: torch.Tensor,
    b2: torch.Tensor | None,
    spec: str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    from sparse_compile.kernels.ffn_gather import sqrelu_ffn_forward_gather  # Triton: imported when used

    op, x2, w1, b1, w2, b2 = forward_operands(x, w1, b1, w2, b2, spec)
    v, n, m = _vnm_of(spec, x2.shape[0])
    _mass_rows(op, x)  # checks the rows
    w1, b1, w2 = permuted_weights(op, (v, n, m), x2, w1, b1, w2)
    y, r_c, ids, dz_s = sqrelu_ffn_forward_gather(
        x2, w1, b1, w2, b2, v, n, m, op.f1_alg, op.dense_gemms, op.chunk, causal_seq(op, x), op.score_rows,
        op.mass_loss,
    )  # fmt: skip
    dz_s = x2.new_empty((0, w1.shape[0])) if dz_s is None else dz_s
    return y.reshape(*x.shape[:-1], w2.shape[0]), r_c, ids, dz_s


@sqrelu_ffn_vnm.register_fake
def _(x, w1, b1, w2, b2, spec):
    op = parse_spec(spec)
    v, _, m = op.activations
    tokens = math.prod(x.shape[:-1])
    kc = w1.shape[0] * 4 // m
    return (
        x.new_empty((*x.shape[:-1], w2.shape[0])),
        x.new_empty((tokens, kc)),
        x.new_empty((tokens // v, kc), dtype=torch.int32),
        x.new_empty((_mass_rows(op, x), w1.shape[0])),
    )


@torch.library.custom_op("sparse_compile::sqrelu_ffn_vnm_backward", mutates_args=())
def sqrelu_ffn_vnm_backward(
    dy: torch.Tensor,
    x: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    r_c: torch.Tensor,
    ids: torch.Tensor,
    dz_s: torch.Tensor,
    spec: str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    from sparse_compile.kernels.ffn_gather import sqrelu_ffn_backward_gather

    v, n, m = _vnm_of(spec, math.prod(x.shape[:-1]))
    op = parse_spec(spec)
    perm = site_perm(op, (v, n, m), x.device)
    dy2, x2, w1c, w2c = backward_operands(dy, x, w1, w2, perm)
    mass = (dz_s, op.score_rows, causal_seq(op, x)) if _mass_rows(op, x) else None
    dx, dw1, db1, dw2, db2 = sqrelu_ffn_backward_gather(
        dy2, x2, w1c, w2c, r_c, ids, v, m, op.weight_grad, op.dense_frac, op.dense_gemms, op.chunk, mass=mass
    )
    dw1, db1, dw2 = unit_perms.unpermute(dw1, db1, dw2, perm)
    return dx.reshape(x.shape), dw1, db1, dw2, db2


@sqrelu_ffn_vnm_backward.register_fake
def _(dy, x, w1, w2, r_c, ids, dz_s, spec):
    return grads_like(x, w1, w2)


sqrelu_ffn_vnm.register_autograd(
    ffn_autograd(torch.ops.sparse_compile.sqrelu_ffn_vnm_backward), setup_context=ffn_setup
)
