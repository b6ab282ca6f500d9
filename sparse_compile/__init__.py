"""sparse_compile: ``torch.compile(model, backend="sparse")`` trains squared-ReLU FFNs sparse.

The backend itself is registered through the ``torch_dynamo_backends`` entry point;
importing this package is only needed for the phase guard, configs and reports.
"""

from sparse_compile.backend import compile_reports, sparse_backend
from sparse_compile.explain import explain
from sparse_compile.ops.routes import load_route_state, route_state
from sparse_compile.ops.unit_perms import load_unit_permutations, probe_units, unit_permutations
from sparse_compile.phase import PhaseSchedule, dense_phase, phase, set_phase
from sparse_compile.presets import DEFAULT_PRESET, PRESETS
from sparse_compile.refit import recluster, reset_units
from sparse_compile.report import Report
from sparse_compile.schema import SparsityConfig

__all__ = [
    "DEFAULT_PRESET",
    "PRESETS",
    "PhaseSchedule",
    "Report",
    "SparsityConfig",
    "compile_reports",
    "dense_phase",
    "explain",
    "load_route_state",
    "load_unit_permutations",
    "phase",
    "probe_units",
    "recluster",
    "reset_units",
    "route_state",
    "set_phase",
    "sparse_backend",
    "unit_permutations",
]
