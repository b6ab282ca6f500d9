"""What a tile of tokens must compute when every token keeps its own chunks (bench.cluster_probe
--tile-union).

A per-token chunk choice (1:4:M in chunks of c: each token keeps the 4 of every M chunks with the
most of its own |H|) keeps quality, but a tensor-core tile holds V tokens that must share their
columns. Run exactly, a tile computes the union of its tokens' chunks (each token masked to its
own): work = sum over tiles of V x |union| against T x (F / c) for the dense FFN. Which tokens share
a tile decides the union:
  sequence order   tiles of V consecutive tokens (what a block pattern would take);
  routed (G)       each token sent by its own choice to the nearest of G centroids (k-means on
                   the choice vectors, fitted on other batches), laid out as the routed op lays out
                   its tokens (kernels/routing.route_plan): stably sorted by route, each route cut
                   into tiles of V, its last tile padded to V rows. Padded rows count as work; the
                   empty trailing tiles of route_plan's fixed grid do not.
A token's route depends on that token alone, so the layout stays causal; the work is what the
F2 / backward GEMMs of such a layout would do relative to dense (F1 runs in full to choose).

extra_work: the same for token_extra (SparsityConfig.token_extra): on top of a block's choice, each
token's own r largest units outside it. A tile of V consecutive tokens computes the union of its
tokens' extra units as a second set of columns (each row masked to its own, so still causal).
"""

import torch

from sparse_compile.kernels.activation_mask import vnm_mask, with_token_extra
from sparse_compile.kernels.routing import route_plan


def chunk_choice(h: torch.Tensor, m: int, c: int) -> torch.Tensor:
    """bool [T, F/c]: each token's 4 of every M chunks of c units with the largest sum of its ``h``
    [T, F]: the per-token pattern 1:4:M in chunks of c (kernels/activation_mask.vnm_mask), a column
    per chunk."""
    if c < 2:
        raise ValueError(f"chunk_choice: c={c} units per chunk: expected an int >= 2")
    return vnm_mask(h, 1, 4, m, c)[:, ::c]


def fit_choice_centroids(choices: torch.Tensor, g: int, iters: int = 10, seed: int = 0) -> torch.Tensor:
    """Centroids [G, F/c] (float32) of k-means on the choice vectors ``choices`` [T, F/c] by overlap:
    a token goes to the centroid it shares the most chosen chunks with."""
    t = choices.shape[0]
    if not 1 <= g <= t:
        raise ValueError(f"fit_choice_centroids: G={g} routes for {t} tokens: expected 1 <= G <= T")
    x = choices.float()
    gen = torch.Generator().manual_seed(seed)
    centroids = x[torch.randperm(t, generator=gen)[:g].to(x.device)].clone()
    for _ in range(iters):
        route = (x @ centroids.t()).argmax(dim=1)
        sums = torch.zeros_like(centroids).index_add_(0, route, x)
        counts = torch.bincount(route, minlength=g).unsqueeze(1)
        centroids = torch.where(counts > 0, sums / counts.clamp(min=1), centroids)
    return centroids


def tile_work(choices: torch.Tensor, v: int, routes: torch.Tensor | None = None) -> float:
    """sum over tiles of V x |union of the tile's chosen chunks|, over T x (F / c): the fraction of
    the dense GEMMs' work a tiled exact layout does. ``routes`` [T] (a route id per token): tiles
    are cut within each route, in token order, the last one padded to V rows; None: tiles of V
    consecutive tokens (T a multiple of V)."""
    t, n = choices.shape
    if v < 1:
        raise ValueError(f"tile_work: V={v} tokens per tile: expected an int >= 1")
    if routes is None:
        if t % v:
            raise ValueError(f"tile_work: T={t} tokens is not a multiple of V={v}")
        routes = torch.zeros(t, dtype=torch.long, device=choices.device)
    tile = route_plan(routes, int(routes.max()) + 1, v)[0] // v  # the padded row of each token, by tile
    hits = torch.zeros(int(tile.max()) + 1, n, dtype=torch.float32, device=choices.device)
    hits.index_add_(0, tile, choices.float())  # tokens of the tile that chose each chunk
    return float((hits > 0).sum()) * v / (t * n)


def layout_work(
    held: list[torch.Tensor], fit: list[torch.Tensor], m: int, c: int, tiles: list[int], routes: list[int | None]
) -> dict[tuple[int, int | None], float]:
    """{(V, G): tile_work pooled over layers (their mean)} for every V in ``tiles`` and G in ``routes``:
    each layer's choices on ``held`` H [T, F], in tiles of V consecutive tokens (G None) or routed to
    G centroids fitted on that layer's ``fit`` H. Each layer's choices and each G's centroids are
    computed once."""
    works: dict[tuple[int, int | None], list[float]] = {(v, g): [] for v in tiles for g in routes}
    for h, f in zip(held, fit, strict=True):
        choices = chunk_choice(h, m, c)
        fit_choices = chunk_choice(f, m, c) if any(g is not None for g in routes) else None
        for g in routes:
            route = None
            if g is not None:
                route = (choices.float() @ fit_choice_centroids(fit_choices, g).t()).argmax(dim=1)
            for v in tiles:
                works[(v, g)].append(tile_work(choices, v, route))
    return {key: sum(w) / len(w) for key, w in works.items()}


def token_extras(h: torch.Tensor, keep: torch.Tensor, r: int) -> torch.Tensor:
    """bool [T, F]: each token's own ``r`` largest units of ``h`` [T, F] outside ``keep`` (the block's
    choice), the units token_extra adds (activation_mask.with_token_extra)."""
    return with_token_extra(h, keep, r) & ~keep


def extra_work(extras: torch.Tensor, v: int) -> float:
    """sum over tiles of V consecutive tokens of V x |union of the tile's tokens' ``extras``| (token_extras
    [T, F]), over T x F: the columns beyond the block's choice that an exact tiled layout computes, as a
    fraction of the dense work."""
    t, f = extras.shape
    if v < 1 or t % v:
        raise ValueError(f"extra_work: V={v} tokens per tile for T={t}: expected V >= 1 dividing T")
    return float(extras.view(t // v, v, f).any(dim=1).sum()) * v / (t * f)
