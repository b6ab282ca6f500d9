"""sparse_compile: ``torch.compile(model, backend="sparse")`` trains squared-ReLU FFNs sparse.

The backend itself is registered through the ``torch_dynamo_backends`` entry point;
importing this package is only needed for the phase guard, configs and reports.
"""

from sparse_compile.backend import compile_reports, sparse_backend
from sparse_compile.config import PRESETS, SparsityConfig
from sparse_compile.explain import explain
from sparse_compile.phase import PhaseSchedule, dense_phase, phase, set_phase
from sparse_compile.report import Report

__all__ = [
    "PRESETS",
    "PhaseSchedule",
    "Report",
    "SparsityConfig",
    "compile_reports",
    "dense_phase",
    "explain",
    "phase",
    "set_phase",
    "sparse_backend",
]
