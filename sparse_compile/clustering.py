"""Hidden-unit clustering: a permutation of an FFN's hidden units so that a V:N:M pattern keeps more
of H = relu(Z)^2 (neuron clustering, Madhyastha et al.).

The pattern cuts H [T, F] into blocks of V tokens x M chunks of c units and keeps 4 chunks per
block. Mass is lost where a block's mass spreads over more than 4 chunks of a group, or where a
chunk's units fire in different blocks. From each unit's *block-mass profile* p_u[b] = sum over
the V tokens of block b of H[t, u] (over a sample of batches), the permutation is built in two
levels:
1. chunks (c > 1): balanced k-means of the L2-normalized profiles into F/c clusters of exactly c
   units (cosine similarity; capacity-constrained assignment), so that a chunk's units fire in
   the same blocks;
2. groups: the F/c chunks are dealt into groups of M, heaviest chunk first, each into the group
   whose profile overlaps its own least (dot product of normalized profiles), so that in each
   block few chunks of a group carry the mass.

``perm[i]`` is the unit placed at position i: the permuted H is ``h[:, perm]``. Applied to an FFN
as W1[perm], b1[perm], W2[:, perm] it leaves the dense function unchanged.
"""

import numpy as np
import torch

from sparse_compile.kernels.activation_mask import vnm_mask, vnm_select, with_token_extra


def block_mass(h: torch.Tensor, v: int) -> torch.Tensor:
    """Profiles [F, T/V] (float32): the sum of h [T, F] over each block of v tokens."""
    t, f = h.shape
    if t % v:
        raise ValueError(f"block_mass: token count T={t} is not a multiple of V={v}")
    return h.reshape(t // v, v, f).sum(dim=1, dtype=torch.float32).t()


def _in_op_order(hs: list[torch.Tensor], perms: list[torch.Tensor | None] | None):
    """Each layer's H as float32, its units as the op runs them: ``h[:, perms[i]]`` where a
    permutation is given."""
    for i, h in enumerate(hs):
        f = h.float()
        p = None if perms is None else perms[i]
        yield f if p is None else f[:, p.to(f.device)]


def kept_mass(
    hs: list[torch.Tensor],
    pattern: tuple[int, int, int],
    c: int = 1,
    perms: list[torch.Tensor | None] | None = None,
    seq: int | None = None,
    score: int | None = None,
    extra: int = 0,
    units: int | None = None,
) -> float:
    """The fraction of sum H that the V:N:M ``pattern`` (chunks of ``c``, causal over sequences of
    ``seq`` tokens when given, scored on the previous block's last ``score`` rows and each chunk's first
    ``units`` units when given, each token's own ``extra`` largest units outside it added) keeps, pooled
    over the layers' H [T, F] in ``hs``; each taken as ``h[:, perms[i]]`` where a permutation is given
    (the units in the order the op runs them)."""
    kept = total = 0.0
    for f in _in_op_order(hs, perms):
        kept += (f * with_token_extra(f, vnm_mask(f, *pattern, c, seq, score, units), extra)).sum().item()
        total += f.sum().item()
    return kept / total


def static_share(
    hs: list[torch.Tensor],
    pattern: tuple[int, int, int],
    c: int = 1,
    perms: list[torch.Tensor | None] | None = None,
    seq: int | None = None,
    most: float = 0.9,
    score: int | None = None,
    units: int | None = None,
) -> float:
    """How static the V:N:M ``pattern``'s choice of chunks is on the layers' H [T, F] in ``hs``
    (arguments as kept_mass): the fraction of the kept (block, chunk) pairs whose chunk at least
    ``most`` of the layer's blocks keep, pooled over the layers. Near 0 when the blocks choose
    different chunks; 1 when every block keeps the same ones, so that while the pattern runs the
    other chunks' units get no gradient at all."""
    v, n, m = pattern
    static = total = 0
    for f in _in_op_order(hs, perms):
        cols = vnm_select(f, v, n, m, c, seq, score, units)[0]  # [T/V, groups, 4]: kept chunk ids in each group
        blocks, groups = cols.shape[:2]
        ids = cols.permute(1, 0, 2).reshape(groups, -1)  # [groups, T/V * 4]
        ones = torch.ones_like(ids, dtype=torch.float32)
        counts = torch.zeros(groups, m, device=ids.device).scatter_add_(1, ids, ones)  # blocks keeping each chunk
        static += (counts >= most * blocks).gather(1, ids).sum().item()
        total += ids.numel()
    return static / total


def _normalized(x: torch.Tensor) -> torch.Tensor:
    return x / x.norm(dim=1, keepdim=True).clamp_min(1e-30)


def _balanced_assign(sim: torch.Tensor, capacity: int) -> torch.Tensor:
    """Cluster of each row of sim [U, K] with exactly ``capacity`` rows per cluster (U = K * capacity):
    every unassigned row proposes to its most similar cluster with room; a cluster accepts its most
    similar proposers up to its room (deferred acceptance, vectorized per round)."""
    u, k = sim.shape
    assign = torch.full((u,), -1, dtype=torch.long, device=sim.device)
    room = torch.full((k,), capacity, dtype=torch.long, device=sim.device)
    sim = sim.clone()
    while True:  # one host synchronization per round (the free rows' count); no boolean indexing
        free = (assign < 0).nonzero().squeeze(1)
        if free.numel() == 0:
            return assign
        sim.masked_fill_((room == 0).unsqueeze(0), float("-inf"))
        best_sim, best = sim[free].max(dim=1)
        # rank the proposers of each cluster by similarity: sort by (cluster, -similarity)
        order = torch.argsort(best_sim, descending=True, stable=True)
        order = order[torch.argsort(best[order], stable=True)]
        cl = best[order]
        first = torch.searchsorted(cl, cl, right=False)  # index of the cluster's first proposer
        rank = torch.arange(cl.numel(), device=sim.device) - first
        take = rank < room[cl]
        rows = free[order]  # distinct rows: the proposers not taken keep -1
        assign[rows] = torch.where(take, cl, assign[rows])
        room -= torch.zeros_like(room).scatter_add_(0, cl, take.long())


def chunk_units(profiles: torch.Tensor, c: int, iters: int = 10) -> torch.Tensor:
    """Chunks of c units with similar profiles: [F/c, c] unit ids (balanced spherical k-means).

    Seeds: farthest-point traversal from the heaviest unit (deterministic); then ``iters`` rounds
    of balanced assignment and centroid update."""
    f = profiles.shape[0]
    if c < 1 or f % c:
        raise ValueError(f"chunk_units: F={f} units cannot form chunks of c={c}")
    x = _normalized(profiles.float())
    k = f // c
    # the seeds stay on the device as 1-element index tensors (index_select: indexing with a 0-d
    # tensor would read it on the host): no host synchronization per seed
    seeds = [profiles.float().sum(1).argmax().view(1)]
    closest = x @ x.index_select(0, seeds[0])[0]
    for _ in range(k - 1):
        seeds.append(closest.argmin().view(1))
        closest = torch.maximum(closest, x @ x.index_select(0, seeds[-1])[0])
    cent = x.index_select(0, torch.cat(seeds))
    assign = None
    for _ in range(iters):
        new = _balanced_assign(x @ cent.t(), c)
        if assign is not None and torch.equal(new, assign):
            break
        assign = new
        # exactly c units per cluster: the sum over a cluster is a sum over c consecutive rows of x
        # in cluster order (no atomics: the same result on every device and run)
        order = torch.argsort(assign, stable=True)
        cent = _normalized(x[order].reshape(k, c, -1).sum(dim=1))
    return order.reshape(k, c)


def group_chunks(profiles: torch.Tensor, m: int) -> torch.Tensor:
    """Groups of m chunks whose profiles overlap least: [K/m, m] chunk ids, from chunk profiles
    [K, B]. Heaviest chunk first, each into the group with room whose summed normalized profile
    has the smallest dot product with its own (ties: the lower group)."""
    kk = profiles.shape[0]
    if m < 1 or kk % m:
        raise ValueError(f"group_chunks: K={kk} chunks cannot form groups of M={m}")
    g = kk // m
    # A sequential greedy pass of K steps on small vectors: in NumPy, without torch's per-op
    # overhead on every step.
    y = _normalized(profiles.float()).cpu().numpy()
    total = np.zeros((g, y.shape[1]), dtype=y.dtype)
    members: list[list[int]] = [[] for _ in range(g)]
    full = np.zeros(g, dtype=bool)
    for chunk in torch.argsort(profiles.float().sum(1), descending=True, stable=True).tolist():
        cost = np.where(full, np.inf, total @ y[chunk])
        best = int(cost.argmin())  # the first minimum: ties go to the lower group
        members[best].append(chunk)
        total[best] += y[chunk]
        full[best] = len(members[best]) == m
    return torch.tensor(members, dtype=torch.long, device=profiles.device)


def cluster_units(
    profiles: torch.Tensor, m: int, c: int = 1, group: bool = True, iters: int = 10, heaviest_first: bool = False
) -> torch.Tensor:
    """The permutation [F] of hidden units (perm[i] = the unit at position i) from block-mass
    profiles [F, B]: chunks of c co-firing units (c > 1), then groups of M chunks with the least
    overlap (``group``; else the chunks stay in the order of their first unit). Inside a chunk the
    units stay in the order of their ids, or with ``heaviest_first`` in the order of their total
    mass, largest first (ties to the lower id): for per-token chunks, where a chunk is kept whole and
    SparsityConfig.score_units ranks it on its first units, those are then its heaviest."""
    if profiles.dim() != 2:
        raise ValueError(f"cluster_units: expected profiles [F, B], got shape {tuple(profiles.shape)}")
    f = profiles.shape[0]
    if m < 1 or c < 1 or f % (m * c):
        raise ValueError(f"cluster_units: F={f} units is not a multiple of M*c = {m}*{c}")
    if c > 1:
        chunks = chunk_units(profiles, c, iters)
        chunks = chunks[torch.argsort(chunks.min(dim=1).values)]
    else:
        chunks = torch.arange(f, device=profiles.device).reshape(f, 1)
    if group:
        chunk_profiles = profiles.float()[chunks].sum(dim=1)
        chunks = chunks[group_chunks(chunk_profiles, m).reshape(-1)]
    if heaviest_first and c > 1:  # after the grouping, which then reads the same sums as without it
        mass = profiles.float().sum(dim=1)[chunks]  # chunks' ids ascending: the stable sort ties to the lower id
        chunks = chunks.gather(1, torch.sort(mass, dim=1, descending=True, stable=True).indices)
    return chunks.reshape(-1)
