"""Hidden-unit permutations of the FFN sites (SparsityConfig.permute): which units form a group.

A site compiled with ``permute`` runs its V:N:M op on W1[p], b1[p], W2[:, p] for the site's
permutation p (identity until the first re-clustering): the pattern's groups and chunks are then
runs of p, not of adjacent units. The dense function is unchanged, and the model's parameters and
state dict are untouched: p lives here, keyed by the site's module path (the report's "module";
graphs that share a module share its permutation), and the op's backward puts the gradients
back in the units' own order. Where one compiled graph serves several modules (FSDP2 with each
block compiled in place: every block's site is "mlp"), those modules share one permutation,
fitted on all of their profiles together. Call recluster() between steps, never between a
forward and its backward (the backward looks the permutation up again). A site's permutation
is updated in place, so a captured CUDA graph (mode="reduce-overhead") reads the new one.

Re-clustering: inside ``with probe_units():`` every permuted site's forward also records the block
mass profiles of its H = relu(X W1^T + b1)^2 (in the units' own order; one extra F1 GEMM per site
and call); ``recluster()`` then fits each site's permutation on what was recorded
(sparse_compile.clustering.cluster_units) and clears the record. ``unit_permutations()`` and
``load_unit_permutations()`` carry the state through a checkpoint. Under torch.distributed (DDP,
FSDP2), every rank calls ``recluster()``: each site's profiles are summed over the ranks before
the fit and the first rank's permutation is sent to all, so every rank runs the same permutation,
fitted on the whole global batch.
"""

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from sparse_compile.clustering import block_mass, cluster_units


@dataclass
class _Site:
    pattern: tuple[int, int, int]
    chunk: int
    perm: torch.Tensor | None = None  # int64 [h]; None: identity
    profiles: list[torch.Tensor] = field(default_factory=list)  # [h, blocks] float32, on the site's device


_sites: dict[str, _Site] = {}
_probing = False


def _site(name: str, pattern: tuple[int, int, int], chunk: int) -> _Site:
    site = _sites.get(name)
    if site is None:
        site = _sites[name] = _Site(pattern, chunk)
    site.pattern, site.chunk = pattern, chunk  # a loaded permutation learns its site's pattern here
    return site


def site_perm(name: str, pattern: tuple[int, int, int], chunk: int, device: torch.device) -> torch.Tensor | None:
    """The permutation the op at site ``name`` runs with, on ``device`` (None: identity)."""
    site = _site(name, pattern, chunk)
    if site.perm is not None and site.perm.device != device:
        site.perm = site.perm.to(device)
    return site.perm


def permute(w1: torch.Tensor, b1: torch.Tensor | None, w2: torch.Tensor, perm: torch.Tensor | None):
    """(W1[p], b1[p], W2[:, p]); checks that p fits the hidden size."""
    if perm is None:
        return w1, b1, w2
    if perm.numel() != w1.shape[0]:
        raise ValueError(f"hidden-unit permutation of {perm.numel()} units for a site with hidden={w1.shape[0]}")
    return w1[perm], None if b1 is None else b1[perm], w2[:, perm]


def unpermute(dw1: torch.Tensor, db1: torch.Tensor, dw2: torch.Tensor, perm: torch.Tensor | None):
    """Gradients of W1[p], b1[p], W2[:, p] -> of W1, b1, W2 (row p[i] of dW1 is row i of dW1[p])."""
    if perm is None:
        return dw1, db1, dw2
    # gathers by the inverse permutation (index_select), the same values as scattering by perm
    inverse = torch.empty_like(perm).index_copy_(0, perm, torch.arange(perm.numel(), device=perm.device))
    return dw1.index_select(0, inverse), db1.index_select(0, inverse), dw2.index_select(1, inverse)


def record(name: str, pattern: tuple[int, int, int], chunk: int, x2, w1, b1) -> None:
    """While probing: add the block-mass profiles of this call's H (units in their own order)."""
    if not _probing:
        return
    with torch.no_grad():
        h = torch.relu(F.linear(x2, w1, b1)).square()
        _site(name, pattern, chunk).profiles.append(block_mass(h, pattern[0]))


def forward_weights(name: str, pattern: tuple[int, int, int], chunk: int, x2, w1, b1, w2):
    """A permuted site's forward: record this call's profiles (while probing), then return
    (W1[p], b1[p], W2[:, p]) for the site's permutation p."""
    record(name, pattern, chunk, x2, w1, b1)
    return permute(w1, b1, w2, site_perm(name, pattern, chunk, x2.device))


def probing() -> bool:
    """Whether a probe_units() block is open."""
    return _probing


@contextlib.contextmanager
def probe_units() -> Iterator[None]:
    """Record activation profiles at every permuted site's forward inside the block, and samples at every
    routed site's (ops/routes.py), for recluster."""
    global _probing
    previous, _probing = _probing, True
    try:
        yield
    finally:
        _probing = previous


def store(old: torch.Tensor | None, value: torch.Tensor) -> torch.Tensor:
    """The tensor a site keeps for ``value``: ``old`` updated in place where it has value's shape,
    dtype and device (its address stays the same, so a captured CUDA graph reads the new values),
    else a copy of ``value``. Serves the permutations here and the routed sites' state (routes.py)."""
    if old is not None and old.shape == value.shape and old.dtype == value.dtype and old.device == value.device:
        return old.copy_(value)
    return value.clone()


def _distributed() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def broadcast_from_first(tensors: list[torch.Tensor], group: "torch.distributed.ProcessGroup | None") -> None:
    """Under torch.distributed, overwrite ``tensors`` on every rank of ``group`` (default: all ranks)
    with the first rank's, so every rank runs the same fit; else nothing."""
    if not _distributed():
        return
    first = 0 if group is None else torch.distributed.get_global_rank(group, 0)
    for t in tensors:
        torch.distributed.broadcast(t, src=first, group=group)


def _recorded(group: "torch.distributed.ProcessGroup | None") -> list[tuple[str, torch.Tensor]]:
    """(site, its profiles [h, blocks] concatenated) for every site with a record; under
    torch.distributed, summed over the ranks of ``group``, after checking that every rank recorded
    the same sites with the same shapes (else a ValueError on every rank, instead of a hang)."""
    recorded = [(name, torch.cat(site.profiles, dim=1)) for name, site in _sites.items() if site.profiles]
    if not _distributed():
        return recorded
    mine = [(name, tuple(p.shape)) for name, p in recorded]
    every = [None] * torch.distributed.get_world_size(group)
    torch.distributed.all_gather_object(every, mine, group=group)
    if any(other != mine for other in every):
        raise ValueError(f"recluster: the ranks recorded different sites or profile shapes: {every}")
    for _, profiles in recorded:
        torch.distributed.all_reduce(profiles, group=group)
    return recorded


def recluster(group: "torch.distributed.ProcessGroup | None" = None) -> list[str]:
    """Fit the permutation of every site with recorded profiles, on the device they were recorded on
    (a CUDA site's on its GPU: on the CPU, three training processes sharing 16 cores took about a
    minute per re-clustering); clear the records. Returns the sites. Under torch.distributed, call
    it on every rank of ``group`` (default: all ranks): the fit reads the profiles summed over the
    ranks, and every rank gets the first rank's permutation. A per-token chunk site (V = 1) gets each
    chunk's units heaviest first (cluster_units heaviest_first: the units SparsityConfig.score_units
    reads), which leaves its whole-chunk mask as it is."""
    done = []
    for name, profiles in _recorded(group):
        site = _sites[name]
        v, _, m = site.pattern
        perm = cluster_units(profiles, m, site.chunk, heaviest_first=v == 1)  # per-token chunks: heaviest first
        broadcast_from_first([perm], group)  # the same fit on the same sums; sent anyway, so ranks never differ
        site.perm = store(site.perm, perm)
        site.profiles.clear()
        done.append(name)
    return done


def unit_permutations() -> dict[str, torch.Tensor]:
    """Site module path -> its permutation (CPU int64), for the sites that have left the identity."""
    return {name: s.perm.detach().cpu().clone() for name, s in _sites.items() if s.perm is not None}


def load_unit_permutations(perms: dict[str, torch.Tensor]) -> None:
    """Set permutations by site module path (from unit_permutations(); sites not yet compiled too)."""
    for name, perm in perms.items():
        perm = torch.as_tensor(perm, dtype=torch.long)
        if perm.dim() != 1 or not torch.equal(torch.sort(perm).values, torch.arange(perm.numel())):
            raise ValueError(f"load_unit_permutations: {name!r} is not a permutation of 0..n-1: {perm}")
        site = _sites.get(name)
        if site is None:
            site = _sites[name] = _Site((0, 0, 0), 1)  # pattern filled in by the op's first call
        site.perm = store(site.perm, perm)


def reset_units() -> None:
    """Forget every site's permutation and record (back to the identity)."""
    _sites.clear()
