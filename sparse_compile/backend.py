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
from sparse_compile import cuda_graphs
from sparse_compile.dump import dump_compile
from sparse_compile.options import BackendOptions
from sparse_compile.report import Report

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


def sparse_backend(
    gm: torch.fx.GraphModule, example_inputs: list[Any], *, mode: str | None = None, options: dict | None = None
):
    """Dynamo backend: see the module docstring and README.md for the options."""
    opts = BackendOptions.parse(options, mode)
    patches = _inductor_patches(opts)
    graph_id = next(_graph_ids)
    sparse_patches = {**patches, "post_grad_custom_post_pass": SourceHashPass()}
    sparse_gm, report, sparse_fn, patches = cuda_graphs.compile_sparse(
        gm, example_inputs, opts, graph_id, patches, sparse_patches
    )
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
