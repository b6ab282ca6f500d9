"""The fused ops the FFN pass rewrites into, and their device dispatch.

sparse_compile::sparsify_weight(w, pattern, decay) -> w~
    w~ = w * M(w), M the transposable 2:4 mask. Backward: straight-through,
    grad(w) = grad(w~) + decay * (w - w~)  (masked decay; w - w~ = (1 - M) * w).
sparse_compile::sqrelu_ffn(x, w1, b1, w2, b2, spec) -> (y, r_masked)
    x [..., d] -> y [..., d_out] with the activation pattern of ``spec`` (kernels/ffn_reference.py);
    r_masked [T, h] = relu(Z) * A is what backward needs (not differentiable).
sparse_compile::sqrelu_ffn_backward(dy, x, w1, w2, r_masked, spec) -> (dx, dw1, db1, dw2, db2)
sparse_compile::sqrelu_ffn_vnm(x, w1, b1, w2, b2, spec) -> (y, r_c, ids)
    The same function for V:N:M activations on the compact operand (kernels/ffn_gather.py);
    backward keeps r_c [T, h*4/M] and ids [T/V, h*4/M]. The rewrite picks it (dispatch.py).
sparse_compile::sqrelu_ffn_vnm_backward(dy, x, w1, w2, r_c, ids, spec) -> (dx, dw1, db1, dw2, db2)
sparse_compile::sqrelu_ffn_24(x, w1, b1, w2, b2, spec) -> (y, r_buf)
    The same function for 2:4 activations, F2 and B3 on cuSPARSELt or cuBLAS (kernels/ffn_act24.py);
    backward keeps r_buf, the sm90 cuSPARSELt buffer of R~ [T, h/2 + h/16].
sparse_compile::sqrelu_ffn_24_backward(dy, x, w1, w2, r_buf, spec) -> (dx, dw1, db1, dw2, db2)
sparse_compile::linear_24(x, w~, b, alg, bwd_alg) -> y
    y = x w~^T + b for a 2:4 (transposable) weight: cuSPARSELt with algorithm ``alg`` (-1: cuBLAS).
    Backward: dx = linear_24(dy, w~^T, None, bwd_alg) (w~^T is 2:4 along its rows too), dw = dy^T x,
    db = sum dy. With 2:4 weights alone the rewrite swaps the FFN's two linears for it and leaves
    relu and square to Inductor.
"""

import functools
import math
import warnings
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from sparse_compile.config import parse_activation_pattern, parse_weight_grad
from sparse_compile.dispatch import DEVICES
from sparse_compile.gather_choice import GATHER_GEMMS
from sparse_compile.kernels import (
    sqrelu_ffn_backward_ref,
    sqrelu_ffn_forward_ref,
    transposable_24_mask,
)

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@dataclass(frozen=True)
class OpSpec:
    weights: str | None
    activations: tuple[int, int, int] | None
    kernels: str
    weight_grad: tuple[int, int, int] | None = None  # token-dim V:N:M of B2/B4, None = exact
    dense_frac: float = 0.0
    f1_alg: int | None = None  # F1 through cuSPARSELt with this algorithm id (2:4 weights, sm90)
    dense_gemms: frozenset[str] = frozenset()  # of F2, B1, B3: on cuBLAS instead of the gather kernels
    act24_alg: int | None = None  # 2:4 activations: F2 and B3 through cuSPARSELt with this id (-1: cuBLAS)


@functools.cache
def parse_spec(spec: str) -> OpSpec:
    """'weights=2:4;activations=64:2:8;kernels=auto;weight_grad=dense;dense_frac=0.02' -> OpSpec
    (see SparsityConfig.op_spec)."""
    fields = dict(item.split("=", 1) for item in spec.split(";"))
    dense_gemms = frozenset(fields["dense_gemms"].split("+")) if fields.get("dense_gemms") else frozenset()
    if not dense_gemms <= set(GATHER_GEMMS):
        raise ValueError(
            f"op spec {spec!r}: dense_gemms={fields['dense_gemms']!r}; allowed: {', '.join(GATHER_GEMMS)} joined by '+'"
        )
    act = fields["activations"]
    weights = fields["weights"]
    return OpSpec(
        weights=None if weights == "none" else weights,
        activations=None if act == "none" else parse_activation_pattern(act),
        kernels=fields["kernels"],
        weight_grad=parse_weight_grad(fields.get("weight_grad", "dense")),
        dense_frac=float(fields.get("dense_frac", 0.0)),
        f1_alg=int(fields["f1_alg"]) if "f1_alg" in fields else None,
        dense_gemms=dense_gemms,
        act24_alg=int(fields["act24_alg"]) if "act24_alg" in fields else None,
    )


def _check_inputs(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> None:
    for name, t in (("x", x), ("w1", w1), ("w2", w2)):
        if t.dtype not in FLOAT_DTYPES:
            raise ValueError(f"sqrelu_ffn: {name}.dtype={t.dtype}; expected one of {FLOAT_DTYPES}")
    if not (x.dtype == w1.dtype == w2.dtype):
        raise ValueError(f"sqrelu_ffn: dtypes differ: x {x.dtype}, w1 {w1.dtype}, w2 {w2.dtype}")
    if w1.dim() != 2 or w2.dim() != 2 or x.shape[-1] != w1.shape[1] or w2.shape[1] != w1.shape[0]:
        raise ValueError(
            f"sqrelu_ffn: shapes do not chain: x {tuple(x.shape)}, w1 {tuple(w1.shape)}, w2 {tuple(w2.shape)}"
        )
    if x.device.type not in DEVICES:
        raise ValueError(f"sparse_compile: no kernels for device {x.device.type!r}; supported: {DEVICES}")


@functools.cache
def _warn_dense_fallback(tokens: int, v: int) -> None:
    warnings.warn(
        f"sparse_compile: a call with T={tokens} tokens (not a multiple of V={v}) ran its FFN activations dense "
        f"(2:4 weights, if configured, stay sparse). Use a batch*sequence that is a multiple of {v} to keep "
        "activations sparse.",
        stacklevel=3,
    )


def _activation_pattern_for(spec: OpSpec, tokens: int) -> tuple[int, int, int] | None:
    pattern = spec.activations
    if pattern is not None and tokens % pattern[0]:
        _warn_dense_fallback(tokens, pattern[0])
        return None
    return pattern


# --- weights ---------------------------------------------------------------------------------


@torch.library.custom_op("sparse_compile::sparsify_weight", mutates_args=())
def sparsify_weight(w: torch.Tensor, pattern: str, decay: float) -> torch.Tensor:
    if pattern != "2:4":
        raise ValueError(f"sparsify_weight: pattern={pattern!r}; expected '2:4'")
    if w.device.type == "cuda" and w.stride(-1) == 1:  # same answer as the reference (see its docstring)
        from sparse_compile.kernels.weight_mask_triton import sparsify_24_triton

        return sparsify_24_triton(w)
    return w * transposable_24_mask(w)


@sparsify_weight.register_fake
def _(w: torch.Tensor, pattern: str, decay: float) -> torch.Tensor:
    return torch.empty_like(w)


def _sparsify_weight_setup(ctx, inputs, output) -> None:
    w, _, decay = inputs
    ctx.decay = decay
    if decay:
        ctx.save_for_backward(w, output)


def _sparsify_weight_backward(ctx, grad):
    if not ctx.decay:
        return grad, None, None
    w, w_masked = ctx.saved_tensors
    return grad + ctx.decay * (w - w_masked), None, None


sparsify_weight.register_autograd(_sparsify_weight_backward, setup_context=_sparsify_weight_setup)


# --- the FFN -----------------------------------------------------------------------------------


@torch.library.custom_op("sparse_compile::sqrelu_ffn", mutates_args=())
def sqrelu_ffn(
    x: torch.Tensor,
    w1: torch.Tensor,
    b1: torch.Tensor | None,
    w2: torch.Tensor,
    b2: torch.Tensor | None,
    spec: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    _check_inputs(x, w1, w2)
    x2 = x.reshape(-1, x.shape[-1])
    pattern = _activation_pattern_for(parse_spec(spec), x2.shape[0])
    y, r_masked = sqrelu_ffn_forward_ref(x2, w1, b1, w2, b2, pattern)
    return y.reshape(*x.shape[:-1], w2.shape[0]), r_masked


@sqrelu_ffn.register_fake
def _(x, w1, b1, w2, b2, spec):
    tokens = math.prod(x.shape[:-1])
    return x.new_empty((*x.shape[:-1], w2.shape[0])), x.new_empty((tokens, w1.shape[0]))


@torch.library.custom_op("sparse_compile::sqrelu_ffn_backward", mutates_args=())
def sqrelu_ffn_backward(
    dy: torch.Tensor, x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, r_masked: torch.Tensor, spec: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    dy2 = dy.reshape(-1, dy.shape[-1])
    op = parse_spec(spec)
    dx, dw1, db1, dw2, db2 = sqrelu_ffn_backward_ref(
        dy2, x.reshape(-1, x.shape[-1]), w1, w2, r_masked, op.weight_grad, op.dense_frac
    )
    return dx.reshape(x.shape), dw1, db1, dw2, db2


def _grads_like(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Fake (dx, dw1, db1, dw2, db2) of either backward op."""
    return (
        torch.empty_like(x),
        torch.empty_like(w1),
        w1.new_empty(w1.shape[0]),
        torch.empty_like(w2),
        w2.new_empty(w2.shape[0]),
    )


@sqrelu_ffn_backward.register_fake
def _(dy, x, w1, w2, r_masked, spec):
    return _grads_like(x, w1, w2)


def _ffn_setup(ctx, inputs, output) -> None:
    """Both FFN ops: keep x, w1, w2 and the op's extra outputs (what its backward op reads)."""
    x, w1, b1, w2, b2, spec = inputs
    saved = output[1:]
    ctx.mark_non_differentiable(*saved)
    ctx.save_for_backward(x, w1, w2, *saved)
    ctx.has_bias = (b1 is not None, b2 is not None)
    ctx.spec = spec


def _ffn_autograd(backward_op):
    """The autograd backward of an FFN op whose backward op is (dy, x, w1, w2, *saved, spec) -> grads."""

    def backward(ctx, dy, *_):
        dx, dw1, db1, dw2, db2 = backward_op(dy.contiguous(), *ctx.saved_tensors, ctx.spec)
        has_b1, has_b2 = ctx.has_bias
        return dx, dw1, db1 if has_b1 else None, dw2, db2 if has_b2 else None, None

    return backward


sqrelu_ffn.register_autograd(_ffn_autograd(torch.ops.sparse_compile.sqrelu_ffn_backward), setup_context=_ffn_setup)


# --- the FFN, V:N:M activations on the compact operand ------------------------------------------


def _vnm_of(spec: str, tokens: int) -> tuple[int, int, int]:
    pattern = parse_spec(spec).activations
    if pattern is None or tokens % pattern[0]:
        raise ValueError(f"sqrelu_ffn_vnm: spec {spec!r} with T={tokens}: needs V:N:M activations and T % V == 0")
    return pattern


@torch.library.custom_op("sparse_compile::sqrelu_ffn_vnm", mutates_args=())
def sqrelu_ffn_vnm(
    x: torch.Tensor,
    w1: torch.Tensor,
    b1: torch.Tensor | None,
    w2: torch.Tensor,
    b2: torch.Tensor | None,
    spec: str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    from sparse_compile.kernels.ffn_gather import sqrelu_ffn_forward_gather  # Triton: imported when used

    _check_inputs(x, w1, w2)
    x2 = x.reshape(-1, x.shape[-1])
    v, n, m = _vnm_of(spec, x2.shape[0])
    op = parse_spec(spec)
    y, r_c, ids = sqrelu_ffn_forward_gather(x2, w1, b1, w2, b2, v, n, m, op.f1_alg, op.dense_gemms)
    return y.reshape(*x.shape[:-1], w2.shape[0]), r_c, ids


@sqrelu_ffn_vnm.register_fake
def _(x, w1, b1, w2, b2, spec):
    v, _, m = parse_spec(spec).activations
    tokens = math.prod(x.shape[:-1])
    kc = w1.shape[0] * 4 // m
    return (
        x.new_empty((*x.shape[:-1], w2.shape[0])),
        x.new_empty((tokens, kc)),
        x.new_empty((tokens // v, kc), dtype=torch.int32),
    )


@torch.library.custom_op("sparse_compile::sqrelu_ffn_vnm_backward", mutates_args=())
def sqrelu_ffn_vnm_backward(
    dy: torch.Tensor,
    x: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    r_c: torch.Tensor,
    ids: torch.Tensor,
    spec: str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    from sparse_compile.kernels.ffn_gather import sqrelu_ffn_backward_gather

    x2 = x.reshape(-1, x.shape[-1])
    v, _, m = _vnm_of(spec, x2.shape[0])
    op = parse_spec(spec)
    dy2 = dy.reshape(-1, dy.shape[-1]).contiguous()  # the gather-N GEMM reads dY rows
    dx, dw1, db1, dw2, db2 = sqrelu_ffn_backward_gather(
        dy2, x2, w1, w2, r_c, ids, v, m, op.weight_grad, op.dense_frac, op.dense_gemms
    )
    return dx.reshape(x.shape), dw1, db1, dw2, db2


@sqrelu_ffn_vnm_backward.register_fake
def _(dy, x, w1, w2, r_c, ids, spec):
    return _grads_like(x, w1, w2)


sqrelu_ffn_vnm.register_autograd(
    _ffn_autograd(torch.ops.sparse_compile.sqrelu_ffn_vnm_backward), setup_context=_ffn_setup
)


# --- the FFN, 2:4 activations on cuSPARSELt -----------------------------------------------------


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
    from sparse_compile.kernels.ffn_act24 import sqrelu_ffn_forward_24  # Triton: imported when used

    _check_inputs(x, w1, w2)
    x2 = x.reshape(-1, x.shape[-1])
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
    from sparse_compile.kernels.ffn_act24 import sqrelu_ffn_backward_24

    x2 = x.reshape(-1, x.shape[-1])
    op = _act24_of(spec, x2.shape[0])
    dy2 = dy.reshape(-1, dy.shape[-1]).contiguous()
    dx, dw1, db1, dw2, db2 = sqrelu_ffn_backward_24(dy2, x2, w1, w2, r_buf, op.act24_alg, op.weight_grad, op.dense_frac)
    return dx.reshape(x.shape), dw1, db1, dw2, db2


@sqrelu_ffn_24_backward.register_fake
def _(dy, x, w1, w2, r_buf, spec):
    return _grads_like(x, w1, w2)


sqrelu_ffn_24.register_autograd(
    _ffn_autograd(torch.ops.sparse_compile.sqrelu_ffn_24_backward), setup_context=_ffn_setup
)


# --- a linear with a 2:4 weight on cuSPARSELt (2:4 weights alone) --------------------------------


@torch.library.custom_op("sparse_compile::linear_24", mutates_args=())
def linear_24(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, alg: int, bwd_alg: int) -> torch.Tensor:
    x2 = x.reshape(-1, x.shape[-1])
    if alg < 0:
        y = F.linear(x2, w, b)
    else:
        from sparse_compile.f1_choice import sparse_f1

        y = sparse_f1(x2.contiguous(), w, b, alg)
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
