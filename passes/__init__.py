"""FX passes of sparse_compile: find squared-ReLU FFN chains, check legality, rewrite.

``sparsify_ffns(gm, config)`` is the runner: it rewrites ``gm`` in place and returns a
SiteRecord for every site and near-miss (the rows of the report). See README.md here for
the invariants every pass keeps.
"""

import dataclasses
import math
import re
from dataclasses import dataclass

import torch
from torch._dynamo.utils import counters
from torch.fx import Node

from sparse_compile.contract import op_spec
from sparse_compile.passes.find_ffn import FFNMatch, NearMiss, find_ffn_sites, linear_args
from sparse_compile.passes.legality import (
    MIN_HIDDEN_REASON,
    compute_dtype,
    dense_token_reason,
    example_value,
    fit_chunk,
    has_symbolic_shapes,
    illegal_reason,
    site_note,
    size_hint,
)
from sparse_compile.passes.rewrite_ffn import rewrite_site
from sparse_compile.passes.size_rule import small_site_reason
from sparse_compile.planning.plan import plan_kernels
from sparse_compile.schema import SparsityConfig

__all__ = ["FFNMatch", "NearMiss", "SiteRecord", "copy_graph", "find_ffn_sites", "has_symbolic_shapes", "sparsify_ffns"]


@dataclass
class SiteRecord:
    """One row of the report: an FFN site (sparse or dense) or a near-miss."""

    module: str
    source: str
    input_shape: str
    hidden: str
    dtype: str
    device: str
    sparse: bool
    reason: str
    kernel: str = "dense (Inductor)"
    work: float = math.inf  # T x d x h (a symbolic dim at its hint; inf where a dim is unknown)
    chunk: int = 0  # the neuron chunk a sparse site runs with (legality.fit_chunk), 0: the config's
    # a found FFN that stays dense for a reason the options did not ask for (not min_hidden, not the
    # small-FFN size rule; near-misses never): the backend warns (Report.site_warnings)
    warn: bool = False
    # why a sparse site runs its activations dense at every call (legality.dense_token_reason), "" if not
    dense_activations: str = ""


def _clean_path(path: str) -> str:
    path = re.sub(r"^L\['[^']*'\]", "", path)
    path = re.sub(r"\._modules\['([^']*)'\]", r".\1", path)
    path = re.sub(r"\[(\d+)\]", r".\1", path)
    path = re.sub(r"\['([^']*)'\]", r".\1", path)
    return path.strip(".")


def _module_path(node: Node) -> list[str]:
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return []
    path, _ = list(stack.values())[-1]
    cleaned = _clean_path(str(path))
    return cleaned.split(".") if cleaned else []


def module_of(first: Node, second: Node | None) -> str:
    """The innermost module holding both linears, e.g. 'blocks.0.mlp' ('<root>' for the model itself)."""
    a = _module_path(first)
    if second is not None:
        b = _module_path(second)
        n = 0
        while n < min(len(a), len(b)) and a[n] == b[n]:
            n += 1
        a = a[:n]
    return ".".join(a) or "<root>"


def source_of(node: Node) -> str:
    """'file.py:LINE' of the user code that made ``node`` (last frame of its stack trace)."""
    frames = re.findall(r'File "([^"]+)", line (\d+)', node.meta.get("stack_trace") or "")
    if not frames:
        return "?"
    file, line = frames[-1]
    return f"{file.rsplit('/', 1)[-1]}:{line}"


def _describe(first: Node, second: Node | None, sparse: bool, reason: str) -> SiteRecord:
    x_node, w1_node, _ = linear_args(first)
    x, w1 = example_value(x_node), example_value(w1_node)
    dims = [] if x is None or w1 is None or w1.dim() != 2 else [*x.shape, w1.shape[0]]
    hints = [size_hint(n) for n in dims]  # a symbolic dim: the size the graph is compiled for
    return SiteRecord(
        module=module_of(first, second),
        source=source_of(second if second is not None else first),
        input_shape="?" if x is None else str(tuple(x.shape)),
        hidden="?" if w1 is None or w1.dim() != 2 else str(w1.shape[0]),
        dtype="?" if x is None else str(x.dtype).removeprefix("torch."),
        device="?" if x is None else x.device.type,
        sparse=sparse,
        reason=reason,
        work=math.prod(hints) if hints and None not in hints else math.inf,
    )


def copy_graph(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A GraphModule with a copy of ``gm``'s graph (its node metadata shared; attributes, the bodies
    of higher-order ops included, are the same objects)."""
    graph = torch.fx.Graph()
    out = graph.graph_copy(gm.graph, {})
    graph.output(out)
    return torch.fx.GraphModule(gm, graph)


def _region_bodies(gm: torch.fx.GraphModule) -> list[tuple[str, str]]:
    """(attribute name, higher-order op) of the body subgraphs ``gm``'s higher-order-op calls run, in
    graph order, once each. Dynamo traces torch.utils.checkpoint (use_reentrant=False) into a
    tag_activation_checkpoint call on its body, which AOTAutograd inlines and recomputes in backward,
    a rewritten FFN op included; torch.compiler.nested_compile_region into invoke_subgraph."""
    bodies: list[tuple[str, str]] = []
    for node in gm.graph.nodes:
        if node.op != "call_function" or not isinstance(node.target, torch._ops.HigherOrderOperator):
            continue
        for arg in node.args:
            is_body = isinstance(arg, Node) and arg.op == "get_attr"
            if is_body and isinstance(getattr(gm, arg.target, None), torch.fx.GraphModule):
                if arg.target not in [name for name, _ in bodies]:
                    bodies.append((arg.target, node.target.name()))
    return bodies


# the regions whose FFNs are rewritten; others' are reported dense (invoke_subgraph: its body is compiled
# once and shared by an identifier, which the sparse and the dense variant would both carry)
REWRITTEN_REGIONS = ("tag_activation_checkpoint",)


def sparsify_ffns(gm: torch.fx.GraphModule, config: SparsityConfig, cuda_graphs: bool = False) -> list[SiteRecord]:
    """Rewrite every legal squared-ReLU FFN of ``gm`` (in place) and of its activation-checkpoint
    regions (each rewritten in a copy of its body that replaces it on ``gm``, so a graph that shares
    the body keeps it); a record per site and near-miss, ``gm``'s own first; the FFNs of other
    higher-order-op regions are recorded dense with the reason.
    ``cuda_graphs``: the size rule (passes/size_rule.py) takes its bounds with CUDA graphs."""
    matches, misses = find_ffn_sites(gm.graph)
    records: list[SiteRecord] = []
    sparse_weights: dict[Node, Node] = {}
    replaced: dict[Node, Node] = {}  # second linear of a rewritten site -> its new output node
    for match in matches:
        # A site's input may be an earlier site's output, which that rewrite replaced.
        match = dataclasses.replace(
            match, **{k: replaced.get(getattr(match, k), getattr(match, k)) for k in ("x", "w1", "b1", "w2", "b2")}
        )
        described = _describe(match.first, match.second, False, "")
        site, chunk_note = fit_chunk(match, config)
        reason = illegal = illegal_reason(match, site)
        if reason is None and site.small_ffn != "sparse":
            reason = small_site_reason(described.work, described.device, cuda_graphs, site.chunk > 1)
        if reason is not None:
            warn = illegal is not None and not illegal.startswith(MIN_HIDDEN_REASON.split("{")[0])
            records.append(dataclasses.replace(described, reason=reason, warn=warn))
            continue
        x = example_value(match.x)
        h, d = example_value(match.w1).shape
        d_out = example_value(match.w2).shape[0]
        plan = plan_kernels(x.device, compute_dtype(match), math.prod(x.shape[:-1]), site, d=d, h=h, d_out=d_out)
        approx = ""
        if site.weight_grad_pattern is not None:
            approx = f"dW1, dW2: token-dim approximation {site.weight_grad} (slower than exact)"
        notes = (chunk_note, site_note(match, site), plan.why, plan.f1_why, plan.gemm_why, approx)
        note = "; ".join(n for n in notes if n)
        acts = dense_token_reason(match, site)  # with 2:4 weights or token-dim weight gradients still sparse
        records.append(
            dataclasses.replace(
                described, sparse=True, reason=note, kernel=plan.kernel, chunk=site.chunk, dense_activations=acts
            )
        )
        units = None
        routed = plan.op == "sqrelu_ffn_routed"
        if routed or (site.permute and plan.op in ("sqrelu_ffn", "sqrelu_ffn_vnm", "sqrelu_ffn_grouped")):  # the state
            units = module_of(match.first, match.second)
            state = "tokens routed, groups and router" if routed else "hidden units permuted"
            note = "; ".join(n for n in (note, f"{state} fitted by sparse_compile.recluster") if n)
            records[-1] = dataclasses.replace(records[-1], reason=note)
        spec = op_spec(site, plan, units)
        replaced[match.second] = rewrite_site(match, site, sparse_weights, plan.op, spec, plan.linear_algs)
    records.extend(_describe(m.first, m.second, False, m.reason) for m in misses)
    n_sparse = sum(r.sparse for r in records)
    if n_sparse:
        gm.graph.lint()
        gm.recompile()
    counters["sparse_compile"]["sites_sparse"] += n_sparse
    counters["sparse_compile"]["sites_dense"] += len(records) - n_sparse
    for name, region in _region_bodies(gm):
        if region not in REWRITTEN_REGIONS:
            why = f"inside a region of the higher-order op {region}, whose FFNs are not rewritten (rewritten: "
            why += f"{', '.join(REWRITTEN_REGIONS)}, torch.utils.checkpoint's)"
            matches, _ = find_ffn_sites(getattr(gm, name).graph)
            records.extend(dataclasses.replace(_describe(m.first, m.second, False, why), warn=True) for m in matches)
            continue
        body = copy_graph(getattr(gm, name))
        inner = sparsify_ffns(body, config, cuda_graphs)
        if any(r.sparse for r in inner):
            setattr(gm, name, body)
        records.extend(inner)
    return records
