"""Rewrite a matched FFN site into sparse_compile::sqrelu_ffn or ::sqrelu_ffn_vnm (the compact V:N:M
kernels, when dispatch.py says so), plus sparsify_weight for 2:4 weights.

Graph surgery only: new nodes go right before the second linear, carry ``example_value``
(computed with the graph's fake mode), ``stack_trace`` and ``nn_module_stack`` of the
nodes they replace; the four replaced nodes are erased.
"""

import operator

import torch
from torch.fx import Node

import sparse_compile.op  # noqa: F401  (registers torch.ops.sparse_compile)
from sparse_compile.config import SparsityConfig
from sparse_compile.passes.find_ffn import FFNMatch
from sparse_compile.passes.legality import compute_dtype, example_value

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
    match: FFNMatch, config: SparsityConfig, sparse_weights: dict[Node, Node], op_name: str, spec_suffix: str = ""
) -> Node:
    """Replace ``match`` in its graph; ``sparse_weights`` maps weight nodes to their 2:4 node (shared by sites).

    ``op_name``: the sparse_compile op to call (dispatch.KernelPlan.op); ``spec_suffix``: the per-site
    kernel choices appended to the op's spec (dispatch.KernelPlan.spec_suffix).
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

    with graph.inserting_before(match.second):
        weights = []
        for w in (match.w1, match.w2):
            if config.weights is not None:
                if w not in sparse_weights:  # the mask comes from the master weight, before any cast
                    op = torch.ops.sparse_compile.sparsify_weight.default
                    sparse_weights[w] = _add(
                        graph, op, (w, config.weights, float(config.masked_decay)), match.first, fake_mode
                    )
                w = sparse_weights[w]
            weights.append(cast(w))
        args = (cast(match.x), weights[0], cast(match.b1), weights[1], cast(match.b2), config.op_spec() + spec_suffix)
        op = getattr(torch.ops.sparse_compile, op_name).default
        ffn = _add(graph, op, args, match.second, fake_mode)
        out = _add(graph, operator.getitem, (ffn, 0), match.second, fake_mode)
    match.second.replace_all_uses_with(out)
    for node in (match.second, match.square, match.relu, match.first):
        graph.erase_node(node)
    return out
