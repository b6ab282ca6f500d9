"""``explain(model, *inputs)``: the report of every FFN site, without compiling with Inductor."""

import itertools
from collections.abc import Mapping
from typing import Any

import torch

from sparse_compile.cuda_graphs import plan
from sparse_compile.options import BackendOptions
from sparse_compile.report import Report
from sparse_compile.schema import SparsityConfig


def _as_options(config: SparsityConfig | Mapping[str, Any] | str | None) -> BackendOptions:
    if isinstance(config, SparsityConfig):
        return BackendOptions(config)
    if isinstance(config, str):
        return BackendOptions(SparsityConfig.preset(config))
    if config is None or isinstance(config, Mapping):
        return BackendOptions.parse(config)
    raise TypeError(f"explain: config={config!r}: expected a SparsityConfig, an options dict, a preset name or None")


def explain(
    model: torch.nn.Module,
    *example_inputs: Any,
    config: SparsityConfig | Mapping[str, Any] | str | None = None,
    dynamic: bool | None = None,
    **example_kwargs: Any,
) -> Report:
    """Trace ``model(*example_inputs, **example_kwargs)`` with Dynamo and report every FFN site.

    ``config``: a SparsityConfig, the options dict given to torch.compile, a preset name, or None
    (the default preset, DEFAULT_PRESET). The model runs once, eagerly, under torch.no_grad(); nothing is compiled
    with Inductor. Each row says what runs sparse (pattern per GEMM, kernel) or why a site stays dense.
    Where small_ffn='graphs' would turn CUDA graphs on, only a real compile learns whether Inductor
    runs the graph under them (else those sites stay dense): compile_reports() has that report.
    """
    opts = _as_options(config)
    report = Report(opts.config)
    graph_ids = itertools.count()

    def capture(gm: torch.fx.GraphModule, _inputs: list[Any]):
        report.extend(plan(gm, opts, next(graph_ids))[1])
        return gm.forward

    compiled = torch.compile(model, backend=capture, dynamic=dynamic)
    with torch.no_grad():
        compiled(*example_inputs, **example_kwargs)
    return report
