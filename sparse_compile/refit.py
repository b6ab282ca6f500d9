"""Refitting the backend's per-site state between steps: unit permutations and routed tokens."""

import torch

from sparse_compile.ops import routes, unit_perms


def recluster(group: "torch.distributed.ProcessGroup | None" = None) -> list[str]:
    """Refit, from what ``probe_units()`` recorded, every permuted site's unit permutation
    (ops/unit_perms.py) and every routed site's permutation, groups and router (ops/routes.py); clear the
    records. Returns the refitted sites. Call between steps, on every rank under torch.distributed."""
    return unit_perms.recluster(group) + list(routes.refit(group))


def reset_units() -> None:
    """Forget every site's permutation, routing state and record (identity, initial groups)."""
    unit_perms.reset_units()
    routes.reset_routes()
