"""Find Linear -> ReLU -> square -> Linear chains in a Dynamo FX graph.

Anchors on the first linear, walks its users, requires a single consumer on every step,
and never raises on a model: a chain that almost matches becomes a NearMiss with the
reason it stays dense. Spellings: docs/design.md, "Passes".
"""

import operator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.fx import Node

LINEAR_FNS = {torch._C._nn.linear, F.linear}
RELU_FNS = {torch.relu, torch.relu_, F.relu, F.relu_}
RELU_METHODS = {"relu", "relu_"}
INPLACE_RELU = {torch.relu_, F.relu_}
SQUARE_FNS = {torch.square}
POW_FNS = {operator.pow, torch.pow}
MUL_FNS = {operator.mul, torch.mul}


@dataclass
class FFNMatch:
    """One squared-ReLU FFN: second(square(relu(first(x, w1, b1))), w2, b2)."""

    first: Node
    relu: Node
    square: Node
    second: Node
    x: Node
    w1: Node
    b1: Node | None
    w2: Node
    b2: Node | None


@dataclass
class NearMiss:
    """A linear -> activation -> linear chain that stays dense, and why."""

    first: Node
    second: Node | None
    reason: str


def linear_args(node: Node) -> tuple[Node, Node, Node | None] | None:
    """(input, weight, bias) of a linear call, or None if ``node`` is not one."""
    if node.op != "call_function" or node.target not in LINEAR_FNS:
        return None
    names = ("input", "weight", "bias")
    vals = dict(zip(names, node.args, strict=False))
    vals.update({k: v for k, v in node.kwargs.items() if k in names})
    if "input" not in vals or "weight" not in vals:
        return None
    return vals["input"], vals["weight"], vals.get("bias")


def _relu_input(node: Node) -> tuple[Node, bool] | None:
    """(input, inplace) if ``node`` is a relu call."""
    if node.op == "call_function" and node.target in RELU_FNS and node.args:
        inplace = node.target in INPLACE_RELU or bool(node.kwargs.get("inplace", node.args[1:2] == (True,)))
        return node.args[0], inplace
    if node.op == "call_method" and node.target in RELU_METHODS and node.args:
        return node.args[0], node.target == "relu_"
    return None


def _is_two(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == 2


def _squared(node: Node) -> Node | None:
    """The tensor ``node`` squares, or None: square, pow(r, 2), r ** 2, mul(r, r), r * r."""
    if node.op == "call_function":
        if node.target in SQUARE_FNS and len(node.args) == 1:
            return node.args[0]
        if node.target in POW_FNS and len(node.args) == 2 and _is_two(node.args[1]):
            return node.args[0]
        if node.target in MUL_FNS and len(node.args) == 2 and node.args[0] is node.args[1]:
            return node.args[0]
    if node.op == "call_method":
        if node.target == "square" and len(node.args) == 1:
            return node.args[0]
        if node.target == "pow" and len(node.args) == 2 and _is_two(node.args[1]):
            return node.args[0]
        if node.target == "mul" and len(node.args) == 2 and node.args[0] is node.args[1]:
            return node.args[0]
    return None


def op_name(node: Node) -> str:
    """Short readable name of a node's operation (for reasons in the report)."""
    if node.op == "call_method":
        return str(node.target)
    return getattr(node.target, "__name__", str(node.target))


def _users_except(node: Node, skip: Node) -> list[Node]:
    return [u for u in node.users if u is not skip]


def _match_one(first: Node) -> FFNMatch | NearMiss | None:
    x, w1, b1 = linear_args(first)
    relus = [u for u in first.users if (ri := _relu_input(u)) is not None and ri[0] is first]
    if len(relus) != 1:
        return _near_miss(first)
    relu = relus[0]
    inplace = _relu_input(relu)[1]
    # An in-place relu mutates the linear's output: later code may read either name.
    value_users = list(relu.users) + (_users_except(first, relu) if inplace else [])
    squares = [u for u in value_users if _squared(u) in (relu, first if inplace else relu)]
    if not squares:
        return _near_miss(first)
    square = squares[0]
    if not inplace and len(first.users) != 1:
        others = ", ".join(op_name(u) for u in _users_except(first, relu))
        return NearMiss(first, None, f"the first linear's output is also used by {others}")
    if len(value_users) != 1:
        return NearMiss(first, None, f"relu output has {len(value_users)} users (needs exactly the square)")
    seconds = list(square.users)
    if any(u.op == "output" for u in seconds):
        return NearMiss(first, None, _LEAVES_GRAPH.format(what="relu²"))
    if len(seconds) != 1 or linear_args(seconds[0]) is None or linear_args(seconds[0])[0] is not square:
        names = ", ".join(op_name(u) for u in seconds) or "nothing"
        return NearMiss(first, None, f"relu² output feeds {names} (needs exactly one linear)")
    second = seconds[0]
    _, w2, b2 = linear_args(second)
    if square in (w2, b2):
        return NearMiss(first, second, "relu² is used as a weight or bias of the second linear")
    return FFNMatch(first, relu, square, second, x, w1, b1, w2, b2)


_LEAVES_GRAPH = (
    "{what} is an output of this graph, so the chain continues in another graph: a graph break, or DDP's "
    "per-bucket graph split (set torch._dynamo.config.optimize_ddp = False to keep FFN chains whole)"
)
_MAX_ACTIVATION_STEPS = 4
# Elementwise ops that can stand between the two linears of an FFN that is not relu².
_ACTIVATION_OPS = {
    "relu",
    "relu_",
    "gelu",
    "silu",
    "silu_",
    "square",
    "pow",
    "mul",
    "mul_",
    "tanh",
    "sigmoid",
    "leaky_relu",
    "elu",
    "selu",
    "celu",
    "mish",
    "softplus",
    "hardswish",
    "relu6",
    "hardtanh",
    "dropout",
    "abs",
}


def _near_miss(first: Node) -> NearMiss | None:
    """linear -> (elementwise chain) -> linear that is not relu²: name what is there instead."""
    chain: list[Node] = []
    node = first
    for _ in range(_MAX_ACTIVATION_STEPS):
        if len(node.users) != 1:
            return None
        (user,) = node.users
        if user.op == "output" and any(_relu_input(n) is not None for n in chain):
            return NearMiss(first, None, _LEAVES_GRAPH.format(what=op_name(chain[-1])))
        args = linear_args(user)
        if args is not None:
            if args[0] is not node or not chain:
                return None
            return NearMiss(first, user, _activation_reason(first, chain))
        if user.op not in ("call_function", "call_method") or op_name(user) not in _ACTIVATION_OPS:
            return None
        chain.append(user)
        node = user
    return None


def _from_linear(node: Node) -> bool:
    """``node`` is a linear, or one activation of a linear (the other branch of a GLU)."""
    if linear_args(node) is not None:
        return True
    return op_name(node) in _ACTIVATION_OPS and any(
        isinstance(a, Node) and linear_args(a) is not None for a in node.args
    )


def _activation_reason(first: Node, chain: list[Node]) -> str:
    names = " -> ".join(op_name(n) for n in chain)
    for n in chain:
        others = [a for a in n.args if isinstance(a, Node) and a is not first and a not in chain]
        if op_name(n) in ("mul", "mul_") and any(_from_linear(a) for a in others):
            return f"gated FFN (GLU): {names} multiplies by another linear; only relu² FFNs are sparsified"
    return f"activation {names} is not relu² (ReLU then square); only relu² FFNs are sparsified"


def find_ffn_sites(graph: torch.fx.Graph) -> tuple[list[FFNMatch], list[NearMiss]]:
    """All squared-ReLU FFN sites of ``graph`` in graph order, and the near-misses."""
    matches: list[FFNMatch] = []
    misses: list[NearMiss] = []
    for node in graph.nodes:
        if linear_args(node) is None:
            continue
        found = _match_one(node)
        if isinstance(found, FFNMatch):
            matches.append(found)
        elif isinstance(found, NearMiss):
            # Both branches of a GLU reach the same second linear: one row per FFN.
            if found.second is None or all(m.second is not found.second for m in misses):
                misses.append(found)
    return matches, misses
