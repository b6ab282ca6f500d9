import itertools

import pytest
import torch

from sparse_compile.kernels import TRANSPOSABLE_24_PATTERNS, transposable_24_mask, vnm_mask, vnm_select


def _brute_force_best(tile: torch.Tensor) -> float:
    """Largest kept |w| over every 0/1 4x4 pattern with two per row and two per column."""
    best = -1.0
    choices = list(itertools.combinations(range(4), 2))
    for rows in itertools.product(choices, repeat=4):
        counts = [0] * 4
        for r in rows:
            for c in r:
                counts[c] += 1
        if counts == [2] * 4:
            best = max(best, sum(abs(tile[i, c].item()) for i, r in enumerate(rows) for c in r))
    return best


def test_pattern_table():
    p = TRANSPOSABLE_24_PATTERNS.reshape(90, 4, 4)
    assert (p.sum(1) == 2).all() and (p.sum(2) == 2).all()
    assert len({tuple(x.flatten().tolist()) for x in p}) == 90


@pytest.mark.parametrize("shape", [(4, 4), (8, 12), (16, 8), (12, 36)])
def test_transposable_mask_is_optimal(shape):
    torch.manual_seed(sum(shape))
    w = torch.randn(shape, dtype=torch.float64)
    mask = transposable_24_mask(w)
    tiles = mask.reshape(shape[0] // 4, 4, shape[1] // 4, 4).permute(0, 2, 1, 3)
    assert (tiles.sum(-1) == 2).all() and (tiles.sum(-2) == 2).all()
    wt = w.reshape(shape[0] // 4, 4, shape[1] // 4, 4).permute(0, 2, 1, 3)
    kept = (w.abs() * mask).reshape(shape[0] // 4, 4, shape[1] // 4, 4).permute(0, 2, 1, 3).sum((-1, -2))
    for i in range(wt.shape[0]):
        for j in range(wt.shape[1]):
            assert kept[i, j].item() == pytest.approx(_brute_force_best(wt[i, j]), rel=1e-12)


def test_transposable_mask_ties_and_dtypes():
    mask = transposable_24_mask(torch.ones(4, 4))
    assert mask.int().tolist() == [[0, 0, 1, 1], [0, 0, 1, 1], [1, 1, 0, 0], [1, 1, 0, 0]]
    w = torch.randn(8, 16)
    assert torch.equal(transposable_24_mask(w.half()), transposable_24_mask(w.half().float()))


@pytest.mark.parametrize("shape", [(6, 8), (8, 6), (4,)])
def test_transposable_mask_rejects_bad_shapes(shape):
    with pytest.raises(ValueError, match="transposable_24_mask"):
        transposable_24_mask(torch.randn(shape))


def _random_h(t, f, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.relu(torch.randn(t, f, generator=g)) ** 2


@pytest.mark.parametrize("v, n, m", [(1, 2, 4), (4, 2, 8), (8, 1, 8), (16, 4, 16), (2, 2, 12)])
def test_vnm_mask_invariants_and_optimality(v, n, m):
    t, f = 4 * v, 3 * m
    h = _random_h(t, f, v * 100 + n * 10 + m)
    mask = vnm_mask(h, v, n, m)
    blocks = mask.reshape(t // v, v, f // m, m)
    cols_used = blocks.any(1)  # [T/V, F/M, M]
    assert (cols_used.sum(-1) <= 4).all()
    assert (blocks.sum(-1) == n).all()  # every row keeps exactly N (random data: no zero ties needed)
    cols, keep = vnm_select(h, v, n, m)
    assert (cols.diff(dim=-1) > 0).all()
    norms = h.reshape(t // v, v, f // m, m).sum(1)
    chosen = torch.zeros_like(norms, dtype=torch.bool).scatter_(-1, cols, True)
    min_kept = norms.masked_fill(~chosen, float("inf")).amin(-1)
    max_dropped = norms.masked_fill(chosen, -1.0).amax(-1)
    assert (min_kept >= max_dropped).all()
    vals = torch.gather(h.reshape(t // v, v, f // m, m), 3, cols.unsqueeze(1).expand(-1, v, -1, -1))
    vals = vals.reshape(t, f // m, 4)
    assert (vals.masked_fill(~keep, float("inf")).amin(-1) >= vals.masked_fill(keep, -1.0).amax(-1)).all()


def test_24_activation_is_top2_of_4():
    h = torch.rand(8, 16, generator=torch.Generator().manual_seed(0)) + 0.1  # no zero ties
    mask = vnm_mask(h, 1, 2, 4)
    top2 = h.reshape(8, 4, 4).topk(2, dim=-1).indices
    expected = torch.zeros(8, 4, 4, dtype=torch.bool).scatter_(-1, top2, True).reshape(8, 16)
    assert torch.equal(mask, expected)


def test_vnm_ties_go_to_lower_columns():
    mask = vnm_mask(torch.ones(4, 8), 2, 2, 8)
    assert mask.int().tolist() == [[1, 1, 0, 0, 0, 0, 0, 0]] * 4


@pytest.mark.parametrize(
    "shape, v, n, m, match",
    [((6, 8), 4, 2, 8, "T=6"), ((8, 12), 4, 2, 8, "F=12"), ((8,), 1, 2, 4, "2-D"), ((8, 8), 1, 3, 8, "N in")],
)
def test_vnm_rejects_bad_input(shape, v, n, m, match):
    with pytest.raises(ValueError, match=match):
        vnm_mask(torch.rand(shape), v, n, m)


def _sort_based_mask(h: torch.Tensor, v: int, n: int, m: int) -> torch.Tensor:
    """The selection spelled with stable sorts: an independent statement of the same tie rule."""
    t, f = h.shape
    blocks = h.reshape(t // v, v, f // m, m)
    top = torch.sort(blocks.sum(1, dtype=torch.float32), dim=-1, descending=True, stable=True).indices[..., :4]
    idx = top.sort(dim=-1).values.unsqueeze(1).expand(t // v, v, f // m, 4)
    vals = torch.gather(blocks, 3, idx)
    rank = torch.sort(vals, dim=-1, descending=True, stable=True).indices[..., :n]
    keep = torch.zeros_like(vals, dtype=torch.bool).scatter_(-1, rank, True)
    return torch.zeros_like(blocks, dtype=torch.bool).scatter_(3, idx, keep).reshape(t, f)


@pytest.mark.parametrize("v, n, m", [(1, 2, 4), (4, 2, 8), (8, 1, 8), (16, 4, 16), (2, 2, 12), (4, 1, 16)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_vnm_mask_equals_sort_based_selection_with_ties(v, n, m, dtype):
    g = torch.Generator().manual_seed(v + n + m)
    # few distinct values: many exact ties, in norms and inside rows
    h = torch.randint(0, 3, (8 * v, 4 * m), generator=g).to(dtype)
    assert torch.equal(vnm_mask(h, v, n, m), _sort_based_mask(h, v, n, m))
    h = _random_h(8 * v, 4 * m, v * m).to(dtype)
    assert torch.equal(vnm_mask(h, v, n, m), _sort_based_mask(h, v, n, m))
    cols, keep = vnm_select(h, v, n, m)
    rebuilt = torch.zeros(8, v, 4, m, dtype=torch.bool).scatter_(
        3, cols.unsqueeze(1).expand(-1, v, -1, -1), keep.reshape(8, v, 4, 4)
    )
    assert torch.equal(rebuilt.reshape(8 * v, 4 * m), vnm_mask(h, v, n, m))
