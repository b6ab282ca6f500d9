"""What every FFN op shares: the spec string each op receives, the op preamble (input checks, casts,
reshapes, the site's permutation), and the autograd glue.

The spec (contract.op_spec of the config, the site's kernel plan and units) is a string so that the
ops stay opaque to Dynamo and AOTAutograd: 'weights=2:4;activations=64:2:8;kernels=auto;...'.
"""

import functools
import math
import warnings
from dataclasses import dataclass

import torch

from sparse_compile.contract import DEFAULT_ROUTER, DEVICES, FLOAT_DTYPES, GATHER_GEMMS, ROUTERS
from sparse_compile.ops import unit_perms
from sparse_compile.schema import parse_activation_pattern, parse_weight_grad


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
    chunk: int = 1  # hidden units per kept column of the V:N:M pattern
    causal: bool = False  # columns chosen from earlier tokens (kernels/activation_mask.py)
    score_rows: int | None = None  # causal: rows of the previous block that choose a block's columns (None: V)
    units: str | None = None  # site module path whose hidden-unit permutation the op runs with (ops/unit_perms.py)
    routes: int | None = None  # routed tokens: G groups (kernels/routing.py; state in ops/routes.py)
    gather: bool = False  # routed: on the gather kernels (kernels/ffn_routed.py), else the reference
    router: str = DEFAULT_ROUTER  # routed: how a token's group is chosen (SparsityConfig.router)
    token_extra: int = 0  # each token's own largest units outside the block's choice, kept too (reference)
    score_units: int | None = None  # per-token chunks: ranked on each chunk's first r units
    mass_loss: float = 0.0  # lambda of the dropped-mass loss's gradient (kernels/ffn_reference.py, scored_mass_loss.py)
    mass_loss_rows: str = "all"  # "scoring": the term on each block's scoring rows alone


@functools.cache
def parse_spec(spec: str) -> OpSpec:
    """'weights=2:4;activations=64:2:8;kernels=auto;weight_grad=dense;dense_frac=0.02' -> OpSpec
    (written by contract.op_spec)."""
    fields = dict(item.split("=", 1) for item in spec.split(";"))
    dense_gemms = frozenset(fields["dense_gemms"].split("+")) if fields.get("dense_gemms") else frozenset()
    if not dense_gemms <= set(GATHER_GEMMS):
        raise ValueError(
            f"op spec {spec!r}: dense_gemms={fields['dense_gemms']!r}; allowed: {', '.join(GATHER_GEMMS)} joined by '+'"
        )
    rows = fields.get("mass_loss_rows", "all")
    if rows not in ("all", "scoring") or (rows == "scoring" and "score_rows" not in fields):
        raise ValueError(f"op spec {spec!r}: mass_loss_rows={rows!r}; allowed: 'all', or 'scoring' with score_rows")
    router = fields.get("router", DEFAULT_ROUTER)
    if router not in ROUTERS:
        raise ValueError(f"op spec {spec!r}: router={router!r}; allowed: {', '.join(ROUTERS)}")
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
        chunk=int(fields.get("chunk", 1)),
        causal=fields.get("causal") == "1",
        score_rows=int(fields["score_rows"]) if "score_rows" in fields else None,
        units=fields.get("units"),
        routes=int(fields["routes"]) if "routes" in fields else None,
        gather=fields.get("gather") == "1",
        router=router,
        token_extra=int(fields.get("token_extra", 0)),
        score_units=int(fields["score_units"]) if "score_units" in fields else None,
        mass_loss=float(fields.get("mass_loss", 0.0)),
        mass_loss_rows=rows,
    )


def check_inputs(
    x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, b1: torch.Tensor | None = None, b2: torch.Tensor | None = None
) -> None:
    params = {"w1": w1, "b1": b1, "w2": w2, "b2": b2}
    for name, t in (("x", x), *params.items()):
        if t is not None and t.dtype not in FLOAT_DTYPES:
            raise ValueError(f"sqrelu_ffn: {name}.dtype={t.dtype}; expected one of {FLOAT_DTYPES}")
    dtypes = {t.dtype for t in params.values() if t is not None}
    if len(dtypes) != 1 or w1.dtype not in (x.dtype, torch.float32):
        got = ", ".join(f"{name} {t.dtype}" for name, t in (("x", x), *params.items()) if t is not None)
        raise ValueError(
            f"sqrelu_ffn: dtypes {got}; the weights and biases share one dtype, x's or float32 (then the op "
            "casts them to x's, as autocast does)"
        )
    if w1.dim() != 2 or w2.dim() != 2 or x.shape[-1] != w1.shape[1] or w2.shape[1] != w1.shape[0]:
        raise ValueError(
            f"sqrelu_ffn: shapes do not chain: x {tuple(x.shape)}, w1 {tuple(w1.shape)}, w2 {tuple(w2.shape)}"
        )
    if x.device.type not in DEVICES:
        raise ValueError(f"sparse_compile: no kernels for device {x.device.type!r}; supported: {DEVICES}")


def in_dtype(like: torch.Tensor, *params: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
    """``params`` in like's dtype: float32 weights under autocast, cast once per op call (no copy
    where the dtype already matches). The backward ops cast again from the float32 parameters that
    ffn_setup keeps (2 + 4 bytes read and written per element), instead of keeping the copies alive
    from forward to backward (2 bytes per element: 1.6 GB at 1.3B, 24 sites)."""
    return tuple(None if p is None else p.to(like.dtype) for p in params)


def forward_operands(x: torch.Tensor, w1, b1, w2, b2, spec: str) -> tuple:
    """The preamble of every FFN op's forward: the inputs checked (check_inputs), the parameters in x's
    dtype (in_dtype), x as [T, d], the spec parsed. -> (op, x2, w1, b1, w2, b2)"""
    check_inputs(x, w1, w2, b1, b2)
    w1, b1, w2, b2 = in_dtype(x, w1, b1, w2, b2)
    return parse_spec(spec), x.reshape(-1, x.shape[-1]), w1, b1, w2, b2


def permuted_weights(op: OpSpec, pattern: tuple[int, int, int] | None, x2: torch.Tensor, w1, b1, w2) -> tuple:
    """(W1[p], b1[p], W2[:, p]) for the permutation p of the op's site (ops/unit_perms.py; recording
    this call's profiles while probing); the weights as they are without units or a pattern."""
    if op.units is None or pattern is None:
        return w1, b1, w2
    return unit_perms.forward_weights(op.units, pattern, op.chunk, x2, w1, b1, w2)


def site_perm(op: OpSpec, pattern: tuple[int, int, int] | None, device: torch.device) -> torch.Tensor | None:
    """The permutation of the op's site on ``device``; None (identity) without units or a pattern."""
    return None if op.units is None or pattern is None else unit_perms.site_perm(op.units, pattern, op.chunk, device)


def backward_operands(dy: torch.Tensor, x: torch.Tensor, w1, w2, perm: torch.Tensor | None = None) -> tuple:
    """The preamble of every FFN op's backward: dY (contiguous: the GEMMs read its rows) and x as
    [T, *], the weights in dY's dtype and permuted by ``perm`` (None: the units' own order).
    -> (dy2, x2, w1, w2)"""
    w1, _, w2 = unit_perms.permute(*in_dtype(dy, w1, None, w2), perm)
    return dy.reshape(-1, dy.shape[-1]).contiguous(), x.reshape(-1, x.shape[-1]), w1, w2


@functools.cache
def warn_dense_fallback(tokens: int, v: int) -> None:
    warnings.warn(
        f"sparse_compile: a call with T={tokens} tokens (not a multiple of V={v}) ran its FFN activations dense "
        f"(2:4 weights, if configured, stay sparse). Use a batch*sequence that is a multiple of {v} to keep "
        "activations sparse.",
        stacklevel=3,
    )


def activation_pattern_for(spec: OpSpec, tokens: int) -> tuple[int, int, int] | None:
    pattern = spec.activations
    if pattern is not None and tokens % pattern[0]:
        warn_dense_fallback(tokens, pattern[0])
        return None
    return pattern


def causal_seq(spec: OpSpec, x: torch.Tensor) -> int | None:
    """Tokens per sequence of a causal pattern (x's second-to-last dim; all tokens for a 2-D x),
    None when the pattern is not causal."""
    if not spec.causal:
        return None
    seq = x.shape[-2] if x.dim() >= 3 else math.prod(x.shape[:-1])
    v = spec.activations[0]
    if seq % v:
        raise ValueError(
            f"sparse_compile: causal V:N:M with V={v} needs the sequence length (x's second-to-last dim) to be "
            f"a multiple of V; got x {tuple(x.shape)}"
        )
    return seq


def grads_like(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Fake (dx, dw1, db1, dw2, db2) of either backward op: all in x's (the compute) dtype; ffn_autograd
    casts the parameters' gradients to their dtype."""
    return (
        torch.empty_like(x),
        torch.empty_like(w1, dtype=x.dtype),
        x.new_empty(w1.shape[0]),
        torch.empty_like(w2, dtype=x.dtype),
        x.new_empty(w2.shape[0]),
    )


def ffn_setup(ctx, inputs, output) -> None:
    """Both FFN ops: keep x, w1, w2 and the op's extra outputs (what its backward op reads)."""
    x, w1, b1, w2, b2, spec = inputs
    saved = output[1:]
    ctx.mark_non_differentiable(*saved)
    ctx.save_for_backward(x, w1, w2, *saved)
    ctx.has_bias = (b1 is not None, b2 is not None)
    ctx.param_dtype = w1.dtype  # check_inputs: w1, b1, w2, b2 share it
    ctx.spec = spec


def ffn_autograd(backward_op):
    """The autograd backward of an FFN op whose backward op is (dy, x, w1, w2, *saved, spec) -> grads in
    the compute dtype. The parameters' gradients are cast to their dtype here, in the traced graph
    (float32 under autocast: rounded to the compute dtype first, as autocast's cast backward does),
    where the compiler generates the conversion kernels as for dense."""

    def backward(ctx, dy, *_):
        dx, dw1, db1, dw2, db2 = backward_op(dy.contiguous(), *ctx.saved_tensors, ctx.spec)
        has_b1, has_b2 = ctx.has_bias
        dw1, db1, dw2, db2 = (g.to(ctx.param_dtype) for g in (dw1, db1, dw2, db2))
        return dx, dw1, db1 if has_b1 else None, dw2, db2 if has_b2 else None, None

    return backward
