"""One Dynamo graph's plan: its sparse copy, its report, and whether it runs as CUDA graphs.

The CUDA-graphs decision is made here and only here. A compile runs CUDA graphs where its mode
(``reduce-overhead``, ``max-autotune``) or Inductor's ``triton.cudagraphs`` option asks for them.
``small_ffn="graphs"`` (the default) also turns them on by itself, for both variants of a graph (so
that the two phases share one memory pool), where a sparse site pays only with them
(passes/size_rule.graphs_pay). It does not where the user turned CUDA graphs off, with permuted units
or routes (their state lives on the host, which a replayed graph does not see), in a run of several
processes, or in a graph traced with dynamic shapes (cudagraph trees record one graph per size):
``auto_graphs_blocker`` says which, and the size rule then takes its bounds without graphs. Nor where
Inductor declines to run the sparse variant's forward under CUDA graphs (mutated inputs, CPU
tensors): ``compile_sparse`` compiles that variant under graphs, reads Inductor's cudagraph_skips
counter, and plans the graph again without them. The decision depends only on the shapes, the
pattern, the options, the process count and what Inductor makes of the graph, so the same compile
always decides the same way.
"""

import logging
from typing import Any

import torch
from torch._inductor.compile_fx import compile_fx

from sparse_compile.options import BackendOptions
from sparse_compile.passes import SiteRecord, copy_graph, has_symbolic_shapes, sparsify_ffns
from sparse_compile.passes.size_rule import graphs_pay
from sparse_compile.report import Report

# torch.compile modes that run the compiled graphs as CUDA graphs (no per-kernel host work)
CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")


def uses_cuda_graphs(mode: str | None, inductor: dict | None = None) -> bool:
    """Whether torch.compile's ``mode`` (or Inductor's ``triton.cudagraphs`` option) runs CUDA graphs."""
    flag = (inductor or {}).get("triton.cudagraphs")
    return bool(flag) if flag is not None else mode in CUDA_GRAPH_MODES


def auto_graphs_blocker(
    mode: str | None, inductor: dict | None, permute: bool, processes: int, dynamic: bool = False
) -> str | None:
    """Why small_ffn='graphs' may not turn CUDA graphs on for a compile, or None where it may
    (``dynamic``: the graph has symbolic shapes)."""
    flag = (inductor or {}).get("triton.cudagraphs")
    if flag is not None and not flag:
        return f"the inductor option triton.cudagraphs={flag!r}"
    if mode == "max-autotune-no-cudagraphs":
        return f"mode={mode!r}"
    if permute:
        return "permute=True or routes (a replayed graph does not see the host's unit state and probes)"
    if processes > 1:
        return f"a run of {processes} processes (DDP and FSDP2 under CUDA graphs are not measured)"
    if dynamic:
        return "dynamic shapes (cudagraph trees record one graph per size; not measured)"
    return None


def bounds_with_graphs(
    config_small_ffn: str, mode: str | None, inductor: dict | None, permute: bool, processes: int, dynamic: bool = False
) -> tuple[bool, str | None]:
    """(whether the size rule takes its bounds with CUDA graphs, why small_ffn='graphs' may not turn
    them on or None): with them where the compile runs CUDA graphs, or small_ffn='graphs' may turn
    them on (compile_sparse then does, for both variants, where a sparse site needs them)."""
    if uses_cuda_graphs(mode, inductor):
        return True, None
    if config_small_ffn != "graphs":
        return False, None
    blocker = auto_graphs_blocker(mode, inductor, permute, processes, dynamic)
    return blocker is None, blocker


def processes() -> int:
    """Processes of the run: torch.distributed's world size where it is initialized, else 1."""
    dist = torch.distributed
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def graph_sites(records: list[SiteRecord], chunk: int) -> int:
    """How many sparse sites pay only with CUDA graphs (passes/size_rule.graphs_pay): the sites a
    decline of CUDA graphs would leave running host-bound. ``chunk``: the config's."""
    return sum(r.sparse and graphs_pay(r.work, r.device, (r.chunk or chunk) > 1) for r in records)


def plan(
    gm: torch.fx.GraphModule, opts: BackendOptions, graph_id: int = 0, graphs_declined: str | None = None
) -> tuple[torch.fx.GraphModule, Report]:
    """A copy of ``gm`` with every legal FFN site rewritten, and its report, with the size rule's
    bounds taken with CUDA graphs where the compile runs them or small_ffn='graphs' may turn them on.
    ``graphs_declined``: why Inductor would not run this graph under CUDA graphs; the rule then takes
    its bounds without them, as where the options rule them out."""
    config = opts.config
    explicit = uses_cuda_graphs(opts.mode, opts.inductor)
    dynamic = has_symbolic_shapes(gm)
    routed_or_permuted = config.permute or config.routes is not None
    with_graphs, blocker = bounds_with_graphs(
        config.small_ffn, opts.mode, opts.inductor, routed_or_permuted, processes(), dynamic
    )
    if graphs_declined is not None:
        with_graphs, blocker = False, f"Inductor declined them: {graphs_declined}"
    sparse_gm = copy_graph(gm)
    records = sparsify_ffns(sparse_gm, config, with_graphs)
    auto = graph_sites(records, config.chunk) if with_graphs and not explicit else 0
    cuda_graphs = (explicit and graphs_declined is None) or auto > 0
    return sparse_gm, Report.from_records(config, graph_id, records, cuda_graphs, auto, blocker)


def compile_sparse(
    gm: torch.fx.GraphModule,
    example_inputs: list[Any],
    opts: BackendOptions,
    graph_id: int,
    patches: dict[str, Any],
    sparse_patches: dict[str, Any],
) -> tuple[torch.fx.GraphModule, Report, Any, dict[str, Any]]:
    """(the sparse copy of ``gm``, its report, its compiled function or None where it is still to be
    compiled with ``sparse_patches``, the Inductor patches of the dense variant). Where sites pay only
    with CUDA graphs that the compile or small_ffn turned on (not where small_ffn='sparse' asks for
    those sites regardless), the sparse variant is compiled under them here: if Inductor runs it so
    and small_ffn turned them on, the dense variant gets them too; if Inductor declines, the graph is
    planned again without them, and those sites stay dense by the size rule, the report saying why."""
    sparse_gm, report = plan(gm, opts, graph_id)
    sites = [s.record for s in report.sites]
    if not (report.cuda_graphs and opts.config.small_ffn != "sparse" and graph_sites(sites, opts.config.chunk)):
        return sparse_gm, report, None, patches
    sparse_fn, declined = _compile_under_graphs(sparse_gm, example_inputs, sparse_patches)
    if declined is not None:
        sparse_gm, report = plan(gm, opts, graph_id, graphs_declined=declined)
        return sparse_gm, report, None, patches
    if report.auto_graphs:
        patches = {**patches, "triton.cudagraphs": True}
    return sparse_gm, report, sparse_fn, patches


def _compile_under_graphs(
    gm: torch.fx.GraphModule, example_inputs: list[Any], patches: dict[str, Any]
) -> tuple[Any, str | None]:
    """compile_fx(gm) with triton.cudagraphs on, and why Inductor declined to run its forward under
    CUDA graphs (its cudagraph_skips counter rose: mutated inputs, CPU tensors, an op graphs cannot
    hold), or None. The reason is Inductor's own warning ("skipping cudagraphs due to ..."), caught
    here for the report."""
    from torch._dynamo.utils import counters
    from torch._inductor.cudagraph_utils import cudagraphs_log

    caught = _Caught()
    before = counters["inductor"]["cudagraph_skips"]
    cudagraphs_log.addHandler(caught)
    try:
        fn = compile_fx(gm, example_inputs, config_patches={**patches, "triton.cudagraphs": True})
    finally:
        cudagraphs_log.removeHandler(caught)
    if counters["inductor"]["cudagraph_skips"] == before:
        return fn, None
    if not caught.messages:  # Inductor warns of no reason for a graph without CUDA tensors, or by a policy
        return fn, "it gave no reason"
    return fn, caught.messages[-1].splitlines()[0]  # "skipping cudagraphs due to ...", without its stack


class _Caught(logging.Handler):
    """Keeps the messages of the warnings it is handed."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())
