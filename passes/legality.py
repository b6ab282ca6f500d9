"""Whether a matched FFN site can run sparse (the math), independent of how fast.

Returns the reason a site stays dense, or None. Dims are checked with guard_or_false, so
under dynamic shapes an unknown divisibility keeps the site dense instead of guessing.
A token count T that is statically not a multiple of V runs the activations dense at every call
(``dense_token_reason``); where nothing else of the site would be sparse it stays dense here. Any
other T is the op's to decide per call (see ``site_note``).
"""

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import torch
from torch.fx import Node
from torch.fx.experimental.symbolic_shapes import guard_or_false, is_concrete_int, statically_known_true

from sparse_compile.contract import DEVICES, FLOAT_DTYPES
from sparse_compile.passes.find_ffn import FFNMatch
from sparse_compile.schema import SparsityConfig


def example_value(node: Node | None) -> torch.Tensor | None:
    if node is None:
        return None
    value = node.meta.get("example_value")
    return value if isinstance(value, torch.Tensor) else None


def size_hint(n: int | torch.SymInt) -> int | None:
    """A dim's size: its value, or for a symbolic dim the size the graph is being compiled for
    (Dynamo's hint), None where there is none (unbacked)."""
    if isinstance(n, int):
        return n
    return n.node.hint if n.node.has_hint() else None


def has_symbolic_shapes(gm: torch.fx.GraphModule) -> bool:
    """Whether Dynamo traced ``gm`` with dynamic shapes: a placeholder that is a symbolic int or a
    tensor with a symbolic dim (the graph then serves more than one size)."""
    for node in gm.graph.nodes:
        if node.op != "placeholder":
            continue
        value = node.meta.get("example_value")
        dims = value.shape if isinstance(value, torch.Tensor) else [value] if isinstance(value, torch.SymInt) else []
        if any(not is_concrete_int(d) for d in dims):
            return True
    return False


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def compute_dtype(match: FFNMatch) -> torch.dtype:
    """The dtype the chain computes in: the linears' output dtype (bf16 under bf16 autocast)."""
    return example_value(match.first).dtype


def weights_cast_inside(match: FFNMatch, config: SparsityConfig) -> bool:
    """Whether the op gets the float32 weights and biases and casts them to the compute dtype itself
    (weight_copies="recompute" under autocast): its backward then keeps the float32 parameters, which
    are alive anyway, instead of compute-dtype copies (2 bytes per weight element per site)."""
    dtype = compute_dtype(match)
    params = [example_value(n) for n in (match.w1, match.b1, match.w2, match.b2) if n is not None]
    return (
        config.weight_copies == "recompute"
        and config.weights is None
        and dtype != torch.float32
        and all(v is not None and v.dtype == torch.float32 for v in params)
    )


MIN_HIDDEN_REASON = "hidden size {h} < min_hidden={min_hidden}"  # dense as the options ask: no warning


def illegal_reason(match: FFNMatch, config: SparsityConfig) -> str | None:
    """Why ``match`` must stay dense under ``config``, or None if it can run sparse."""
    names = ("x", "w1", "w2", "first", "relu", "square", "second")
    vals = {name: example_value(getattr(match, name)) for name in names}
    missing = [name for name, v in vals.items() if v is None]
    if missing:
        return f"no example value (meta['example_value']) on {', '.join(missing)}"
    for name in ("b1", "b2"):
        node = getattr(match, name)
        if node is not None and example_value(node) is None:
            return f"{name} is not a tensor"
    x, w1, w2 = vals["x"], vals["w1"], vals["w2"]
    dtype = compute_dtype(match)
    chain = [vals[k].dtype for k in ("first", "relu", "square", "second")]
    # CUDA autocast runs pow/square in float32 (a bf16 product is exact in fp32, and the second linear
    # rounds it back): the op's square in the compute dtype gives the same values.
    first, relu, square, second = chain
    if not (first == relu == second == dtype and square in (dtype, torch.float32)):
        path = " -> ".join(_dtype_name(d) for d in chain)
        return f"the chain changes dtype (linear -> relu -> square -> linear: {path}); the op computes in one dtype"
    if dtype not in FLOAT_DTYPES:
        return f"dtype {_dtype_name(dtype)} is not one of {', '.join(_dtype_name(d) for d in FLOAT_DTYPES)}"
    inputs = [v for v in (x, w1, w2, example_value(match.b1), example_value(match.b2)) if v is not None]
    if any(not v.dtype.is_floating_point for v in inputs):
        return f"non-float inputs ({', '.join(sorted({_dtype_name(v.dtype) for v in inputs}))})"
    if x.device.type not in DEVICES:
        return f"device {x.device.type} has no sparse kernels (supported: {', '.join(DEVICES)})"
    if w1.dim() != 2 or w2.dim() != 2:
        return f"weights are not 2-D: w1 {tuple(w1.shape)}, w2 {tuple(w2.shape)}"
    d_out, h = w2.shape
    _, d = w1.shape
    if config.min_hidden and not guard_or_false(h >= config.min_hidden):
        return MIN_HIDDEN_REASON.format(h=h, min_hidden=config.min_hidden)
    if config.weights is not None:
        bad = {k: v for k, v in (("d", d), ("hidden", h), ("d_out", d_out)) if not guard_or_false(v % 4 == 0)}
        if bad:
            return f"2:4 weights need d, hidden and d_out multiples of 4; got {bad}"
    pattern = config.activation_pattern
    if pattern is not None and not guard_or_false(h % pattern[2] == 0):
        return f"activations {config.activations} need hidden % M == 0; got hidden={h}, M={pattern[2]}"
    if config.causal and pattern is not None:
        seq = x.shape[-2] if x.dim() >= 3 else x.shape[0]
        if not guard_or_false(seq % pattern[0] == 0):
            return (
                f"causal activations {config.activations} need the sequence length (x's second-to-last dim) to be "
                f"a multiple of V={pattern[0]}; got x {tuple(x.shape)}"
            )
    if pattern is not None and config.chunk > 1 and not guard_or_false(h % (pattern[2] * config.chunk) == 0):
        return (
            f"activations {config.activations} in chunks of {config.chunk} need hidden % (M * chunk) == 0; "
            f"got hidden={h}, M * chunk={pattern[2] * config.chunk}"
        )
    tokens_reason = dense_token_reason(match, config)
    if tokens_reason and config.weights is None and config.weight_grad_pattern is None:
        return (
            f"{tokens_reason} (x {tuple(x.shape)}): activations {config.activations} would run dense at every "
            "call, and with weights=None and weight_grad='dense' nothing else is sparse"
        )
    return None


def dense_token_reason(match: FFNMatch, config: SparsityConfig) -> str:
    """Why every call of the site runs its activations dense: "T=.. is not a multiple of V=..", where its
    token count T (the product of x's leading dims) is statically not a multiple of V; "" where it is
    or may be one (a symbolic T: the op decides per call), or for a pattern of V = 1."""
    pattern, x = config.activation_pattern, example_value(match.x)
    if pattern is None or pattern[0] == 1 or x is None or config.routes is not None:
        return ""  # routed sites pad their groups to V
    tokens = math.prod(x.shape[:-1])
    if statically_known_true(tokens % pattern[0] != 0):
        return f"T={tokens} is not a multiple of V={pattern[0]}"
    return ""


MIN_FALLBACK_CHUNK = 16  # the smallest chunk of the gather path (kernels/ffn_gather.chunk_path_supports)


def fitted_chunk(h: Any, m: int, chunk: int, known: Callable[[Any], bool] = bool) -> int:
    """The neuron chunk a site of hidden size ``h`` runs with under a pattern of M = ``m``: ``chunk``
    where M * chunk divides h (or where ``chunk`` has nothing to fall back to: below 32 or not a power
    of two), else the largest chunk / 2**k >= 16 that divides (h = 3072 with M = 16: chunk 128 needs
    2048 | h, chunk 64 needs 1024 | h), else ``chunk`` (no chunk fits: illegal_reason keeps the site
    dense). ``known`` reads a (possibly symbolic) condition as a plain bool."""
    if chunk < 2 * MIN_FALLBACK_CHUNK or chunk & (chunk - 1) or known(h % (m * chunk) == 0):
        return chunk
    fit = chunk // 2
    while fit >= MIN_FALLBACK_CHUNK and not known(h % (m * fit) == 0):
        fit //= 2
    return fit if fit >= MIN_FALLBACK_CHUNK else chunk


def fitted_units(units: int | None, chunk: int, fit: int) -> int | None:
    """SparsityConfig.score_units for a site whose chunk ``chunk`` became ``fit`` (fitted_chunk): the same
    share of each chunk's units, rounded down, at least 1 (None stays None: every unit scores)."""
    return units if units is None or fit == chunk else max(1, units * fit // chunk)


def fit_chunk(match: FFNMatch, config: SparsityConfig) -> tuple[SparsityConfig, str]:
    """The config a site runs with, and a note: ``config`` itself, or where its hidden size h is not a
    multiple of M * chunk, the same config with the smaller chunk of ``fitted_chunk`` (and score_units
    scaled with it: fitted_units)."""
    pattern, w1 = config.activation_pattern, example_value(match.w1)
    if pattern is None or w1 is None or w1.dim() != 2:
        return config, ""
    h, m, c = w1.shape[0], pattern[2], config.chunk
    fit = fitted_chunk(h, m, c, guard_or_false)
    if fit == c:
        return config, ""
    note = f"chunks of {fit}, not {c}: hidden {h} is not divisible by M * {c} = {m * c}"
    units = fitted_units(config.score_units, c, fit)
    if units != config.score_units:
        note += f"; each chunk ranked on its first {units} unit(s), not {config.score_units}"
    return dataclasses.replace(config, chunk=fit, score_units=units), note


def site_note(match: FFNMatch, config: SparsityConfig) -> str:
    """Autocast casts, and what happens to calls whose token count T is not a multiple of V ("" if none)."""
    pattern = config.activation_pattern
    x = example_value(match.x)
    dtype = compute_dtype(match)
    inputs = [example_value(n) for n in (match.x, match.w1, match.b1, match.w2, match.b2)]
    cast = ""
    if any(v is not None and v.dtype != dtype for v in inputs):
        cast = f"inputs cast to {_dtype_name(dtype)} as autocast does"
        if weights_cast_inside(match, config):
            cast += f" (the weights inside the op: backward keeps the float32 ones, no {_dtype_name(dtype)} copies)"
    if pattern is None or pattern[0] == 1 or x is None or config.routes is not None:  # routed: groups padded to V
        return cast
    tokens = math.prod(x.shape[:-1])
    v = pattern[0]
    if statically_known_true(tokens % v == 0):
        note = ""
    elif statically_known_true(tokens % v != 0):
        note = f"T={tokens} is not a multiple of V={v}: activations run dense at this shape (weights stay sparse)"
    else:
        note = f"dynamic T={tokens}: calls with T % {v} != 0 run activations dense and warn"
    return "; ".join(n for n in (cast, note) if n)
