"""Rewrite a matched FFN site into sparse_compile::sqrelu_ffn, ::sqrelu_ffn_vnm (the compact V:N:M
kernels) or ::sqrelu_ffn_24 (2:4 activations on cuSPARSELt), or, for 2:4 weights alone, its two
linears into ::linear_24 (relu and square stay), as planning/plan.py says; plus sparsify_weight for 2:4 weights.

Graph surgery only: new nodes go right before the second linear, carry ``example_value``
(computed with the graph's fake mode), ``stack_trace`` and ``nn_module_stack`` of the
nodes they replace; the replaced nodes are erased.
"""

import operator

import torch
from torch.fx import Node

import sparse_compile.ops  # noqa: F401  (registers torch.ops.sparse_compile)
from sparse_compile.passes.find_ffn import FFNMatch
from sparse_compile.passes.legality import compute_dtype, example_value, weights_cast_inside
from sparse_compile.schema import SparsityConfig

_COPIED_META = ("stack_trace", "nn_module_stack")


def _add(graph: torch.fx.Graph, target, args: tuple, like: Node, fake_mode) -> Node:
    node = graph.call_function(target, args)
    for key in _COPIED_META:
        if key in like.meta:
            node.meta[key] = like.meta[key]
    fake_args = [a.meta.get("example_value") if isinstance(a, Node) else a for a in args]
    with fake_mode:
        node.meta["example_value"] = target(*fake_args)
    return node


def rewrite_site(
    match: FFNMatch,
    config: SparsityConfig,
    sparse_weights: dict[Node, Node],
    op_name: str,
    spec: str,
    algs: tuple[int, int] = (-1, -1),
) -> Node:
    """Replace ``match`` in its graph; ``sparse_weights`` maps weight nodes to their 2:4 node (shared by sites).

    ``op_name``: the sparse_compile op to call (planning.plan.KernelPlan.op); ``spec``: the op's spec
    string (contract.op_spec of the config, the plan and the site). For "linear_24" the
    two linears become linear_24 calls and relu, square stay: ``algs`` = the cuSPARSELt algorithms
    of the [T, d] -> [T, h] and [T, h] -> [T, d] GEMMs (-1: cuBLAS).
    """
    graph = match.second.graph
    # The example values' own fake mode: at backend time TracingContext holds another one.
    fake_mode = example_value(match.x).fake_mode
    dtype = compute_dtype(match)

    def cast(node: Node | None) -> Node | None:
        # Under autocast the linears cast x, W and b to the compute dtype; the op gets the same casts.
        if node is None or example_value(node).dtype == dtype:
            return node
        return _add(graph, torch.Tensor.to, (node, dtype), match.first, fake_mode)

    # weight_copies="recompute": float32 weights and biases go in as they are and the op casts them, so
    # its backward keeps the parameters themselves, not compute-dtype copies (legality.weights_cast_inside)
    param = (lambda node: node) if weights_cast_inside(match, config) else cast

    def weight(w: Node) -> Node:
        if config.weights is not None:
            if w not in sparse_weights:  # the mask comes from the master weight, before any cast
                op = torch.ops.sparse_compile.sparsify_weight.default
                sparse_weights[w] = _add(
                    graph, op, (w, config.weights, float(config.masked_decay)), match.first, fake_mode
                )
            w = sparse_weights[w]
        return param(w)

    if op_name == "linear_24":
        return _rewrite_linears(match, weight, cast, algs, fake_mode)
    with graph.inserting_before(match.second):
        w1, w2 = weight(match.w1), weight(match.w2)
        args = (cast(match.x), w1, param(match.b1), w2, param(match.b2), spec)
        op = getattr(torch.ops.sparse_compile, op_name).default
        ffn = _add(graph, op, args, match.second, fake_mode)
        out = _add(graph, operator.getitem, (ffn, 0), match.second, fake_mode)
    match.second.replace_all_uses_with(out)
    for node in (match.second, match.square, match.relu, match.first):
        graph.erase_node(node)
    return out


def _rewrite_linears(match: FFNMatch, weight, cast, algs: tuple[int, int], fake_mode) -> Node:
    """first(x, w1, b1) -> linear_24(x, w~1, b1, a_dh, a_hd); second(h, w2, b2) -> linear_24(h, w~2, b2,
    a_hd, a_dh): a linear's backward dX GEMM has the other linear's shape."""
    graph = match.second.graph
    op = torch.ops.sparse_compile.linear_24.default
    a_dh, a_hd = algs
    new = []
    for lin, x, w, b, fwd_bwd in (
        (match.first, match.x, match.w1, match.b1, (a_dh, a_hd)),
        (match.second, match.square, match.w2, match.b2, (a_hd, a_dh)),
    ):
        with graph.inserting_before(lin):
            out = _add(graph, op, (cast(x), weight(w), cast(b), *fwd_bwd), lin, fake_mode)
        lin.replace_all_uses_with(out)
        graph.erase_node(lin)
        new.append(out)
    return new[1]
