"""Refitting the backend's per-site state between steps: unit permutations and routed tokens."""

import torch

from sparse_compile.ops import routes as route_state_ops
from sparse_compile.ops import unit_perms


def recluster(group: "torch.distributed.ProcessGroup | None" = None, routes: str = "router") -> list[str]:
    """Refit, from what ``probe_units()`` recorded, every permuted site's unit permutation
    (ops/unit_perms.py) and every routed site (ops/routes.py); clear the records. A routed site's first
    fit chooses its permutation, groups and router. After it, ``routes="router"`` (the default) keeps
    the permutation and groups, so the units each group keeps stay put under the model, and refits the
    router alone; ``routes="all"`` refits all three again. Returns the refitted sites. Call between
    steps, on every rank under torch.distributed."""
    routed = route_state_ops.refit(group, routes)  # first: it refuses a bad ``routes`` before any refit
    return unit_perms.recluster(group) + list(routed)


def reset_units() -> None:
    """Forget every site's permutation, routing state and record (identity, initial groups)."""
    unit_perms.reset_units()
    route_state_ops.reset_routes()
