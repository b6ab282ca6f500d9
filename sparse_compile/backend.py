"""The ``backend="sparse"`` compiler: rewrite FFN sites, compile sparse and dense variants, dispatch on phase.

Registered through the ``torch_dynamo_backends`` entry point (pyproject.toml), so
``torch.compile(model, backend="sparse")`` works without importing this package first.
"""

import itertools
import logging
import threading
from pathlib import Path
from typing import Any

import torch
from torch._inductor.compile_fx import compile_fx
from torch._inductor.custom_graph_pass import CustomGraphPass, get_hash_for_files

import sparse_compile.phase as _phase
from sparse_compile.dump import dump_compile
from sparse_compile.options import BackendOptions
from sparse_compile.passes import SiteRecord, copy_graph, has_symbolic_shapes, sparsify_ffns
from sparse_compile.passes.size_rule import bounds_with_graphs, graphs_pay, uses_cuda_graphs
from sparse_compile.report import Report
from sparse_compile.schema import SparsityConfig

_graph_ids = itertools.count()
_reports: list[Report] = []
_lock = threading.Lock()
# each compiled graph's report at INFO; the found FFNs that run dense unasked (Report.site_warnings) and
# the notes that change how the model behaves (Report.warnings, e.g. CUDA graphs turned on) at WARNING,
# which Python prints to stderr where logging is not configured
_log = logging.getLogger("sparse_compile")


def _source_files() -> tuple[str, ...]:
    import sparse_compile.kernels
    import sparse_compile.passes

    roots = [Path(p) for mod in (sparse_compile.passes, sparse_compile.kernels) for p in mod.__path__]
    roots.append(Path(__file__).parent)
    return tuple(sorted(str(f) for root in roots for f in root.rglob("*.py")))


class SourceHashPass(CustomGraphPass):
    """Post-grad pass that counts our ops reaching Inductor; its uuid hashes this package's sources.

    The uuid is what matters: it enters Inductor's and AOTAutograd's cache keys, so a cached
    graph never outlives a change to the op, its autograd formula or the passes.
    """

    def __call__(self, graph: torch.fx.Graph) -> None:
        from torch._dynamo.utils import counters

        for node in graph.nodes:
            name = getattr(node.target, "name", None)
            if node.op == "call_function" and callable(name) and name().startswith("sparse_compile::"):
                counters["sparse_compile"][f"inductor_{name().split('::')[1].split('.')[0]}"] += 1

    def uuid(self) -> bytes:
        return get_hash_for_files(_source_files())


class PhaseDispatcher:
    """Calls the sparse or the dense compiled graph according to sparse_compile.phase()."""

    def __init__(self, sparse_fn, dense_fn) -> None:
        self.sparse_fn = sparse_fn
        self.dense_fn = dense_fn
        boxed = getattr(sparse_fn, "_boxed_call", False)
        if boxed != getattr(dense_fn, "_boxed_call", False):
            raise RuntimeError("sparse backend: sparse and dense variants use different calling conventions")
        self._boxed_call = boxed

    def __call__(self, *args: Any) -> Any:
        fn = self.sparse_fn if _phase._current == "sparse" else self.dense_fn
        return fn(*args)


def _inductor_patches(opts: BackendOptions) -> dict[str, Any]:
    patches: dict[str, Any] = {}
    if opts.mode and opts.mode != "default":
        from torch._inductor import list_mode_options

        patches.update(list_mode_options(opts.mode))
    patches.update(opts.inductor)
    return patches


def rewrite(
    gm: torch.fx.GraphModule, config: SparsityConfig, cuda_graphs: bool = False
) -> tuple[torch.fx.GraphModule, list[SiteRecord]]:
    """A copy of ``gm`` with every legal FFN site rewritten, and the records of all sites."""
    sparse_gm = copy_graph(gm)
    return sparse_gm, sparsify_ffns(sparse_gm, config, cuda_graphs)


def _processes() -> int:
    """Processes of the run: torch.distributed's world size where it is initialized, else 1."""
    dist = torch.distributed
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def plan(
    gm: torch.fx.GraphModule, opts: BackendOptions, graph_id: int = 0, graphs_declined: str | None = None
) -> tuple[torch.fx.GraphModule, Report]:
    """The sparse copy of ``gm`` and its report, CUDA graphs decided (passes/size_rule.py): the size
    rule takes its bounds with CUDA graphs where the compile runs them or small_ffn='graphs' may turn
    them on; it does, for both variants of the graph, where a sparse site pays only with them.
    ``graphs_declined``: why Inductor would not run this graph under CUDA graphs; the rule then takes
    its bounds without them, as where the options rule them out."""
    config = opts.config
    explicit = uses_cuda_graphs(opts.mode, opts.inductor)
    dynamic = has_symbolic_shapes(gm)
    with_graphs, blocker = bounds_with_graphs(
        config.small_ffn, opts.mode, opts.inductor, config.permute or config.routes is not None, _processes(), dynamic
    )
    if graphs_declined is not None:
        with_graphs, blocker = False, f"Inductor declined them: {graphs_declined}"
    sparse_gm, records = rewrite(gm, config, with_graphs)
    auto = _graph_sites(records, config.chunk) if with_graphs and not explicit else 0
    cuda_graphs = (explicit and graphs_declined is None) or auto > 0
    return sparse_gm, Report.from_records(config, graph_id, records, cuda_graphs, auto, blocker)


def _graph_sites(records: list[SiteRecord], chunk: int) -> int:
    """How many sparse sites pay only with CUDA graphs (passes/size_rule.graphs_pay): the sites a
    decline of CUDA graphs would leave running host-bound. ``chunk``: the config's."""
    return sum(r.sparse and graphs_pay(r.work, r.device, (r.chunk or chunk) > 1) for r in records)


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


def sparse_backend(
    gm: torch.fx.GraphModule, example_inputs: list[Any], *, mode: str | None = None, options: dict | None = None
):
    """Dynamo backend: see the module docstring and README.md for the options."""
    opts = BackendOptions.parse(options, mode)
    patches = _inductor_patches(opts)
    graph_id = next(_graph_ids)
    sparse_gm, report = plan(gm, opts, graph_id)
    sparse_patches = {**patches, "post_grad_custom_post_pass": SourceHashPass()}
    sparse_fn = None
    sites = [s.record for s in report.sites]
    # sites that pay only under CUDA graphs (turned on by small_ffn or the mode; not where small_ffn='sparse'
    # asks for them regardless) run sparse only if Inductor runs the graph under them
    if report.cuda_graphs and opts.config.small_ffn != "sparse" and _graph_sites(sites, opts.config.chunk):
        sparse_fn, declined = _compile_under_graphs(sparse_gm, example_inputs, sparse_patches)
        if declined is None and report.auto_graphs:  # both variants: the two phases share one memory pool
            patches["triton.cudagraphs"] = True
        elif declined is not None:  # without graphs those sites stay dense (the size rule); the report says why
            sparse_gm, report = plan(gm, opts, graph_id, graphs_declined=declined)
            sparse_fn = None
    with _lock:
        _reports.append(report)
    _log.info("%s", report)
    for note in [*report.site_warnings, *report.warnings]:
        _log.warning("sparse_compile, graph %d: %s", graph_id, note)
    dump_compile(graph_id, gm, sparse_gm, str(report), opts.dump_dir)
    dense_fn = compile_fx(gm, example_inputs, config_patches=patches)
    if not report.sparse_sites:
        return dense_fn
    if sparse_fn is None:
        sparse_fn = compile_fx(sparse_gm, example_inputs, config_patches=sparse_patches)
    return PhaseDispatcher(sparse_fn, dense_fn)


def compile_reports() -> list[Report]:
    """Reports of every graph compiled with backend='sparse' in this process, oldest first."""
    with _lock:
        return list(_reports)
