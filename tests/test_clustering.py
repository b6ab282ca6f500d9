"""sparse_compile.clustering: the permutation is valid, finds planted structure, raises kept mass,
and leaves a dense FFN's function unchanged; bench.cluster_probe runs on the CPU."""

import csv

import pytest
import torch

from sparse_compile.clustering import block_mass, chunk_units, cluster_units, group_chunks, kept_mass, static_share
from sparse_compile.kernels.activation_mask import vnm_mask


def _planted(t=2048, f=256, c=8, v=64, seed=0):
    """H whose units come in f/c hidden clusters; a cluster fires only in its own random 25% of
    the v-token blocks. Units are shuffled, so the identity layout mixes clusters."""
    g = torch.Generator().manual_seed(seed)
    k = f // c
    active = torch.rand(k, t // v, generator=g) < 0.25
    cluster_of = torch.randperm(f, generator=g) % k
    on = active[cluster_of].repeat_interleave(v, dim=1).t()
    h = (torch.rand(t, f, generator=g) * on * (torch.rand(t, f, generator=g) < 0.3)) ** 2
    return h, cluster_of


def _kept(h, perm, v, n, m, c):
    hp = h[:, perm]
    return ((hp * vnm_mask(hp, v, n, m, c)).sum() / hp.sum()).item()


def test_block_mass_sums_each_block():
    h = torch.rand(256, 24, dtype=torch.float64)
    p = block_mass(h, 64)
    assert p.shape == (24, 4) and p.dtype == torch.float32
    torch.testing.assert_close(p[5, 2], h[128:192, 5].sum().float())
    with pytest.raises(ValueError, match="T=250 is not a multiple of V=64"):
        block_mass(h[:250], 64)


def test_chunks_recover_planted_clusters_and_raise_kept_mass():
    h, cluster_of = _planted()
    perm = cluster_units(block_mass(h, 64), m=16, c=8)
    assert torch.equal(torch.sort(perm).values, torch.arange(256))
    chunks = cluster_of[perm].reshape(-1, 8)
    assert (chunks == chunks[:, :1]).all()  # every chunk is one planted cluster
    ident = torch.arange(256)
    assert _kept(h, perm, 64, 2, 16, 8) > _kept(h, ident, 64, 2, 16, 8) + 0.15


def test_grouping_raises_kept_mass_of_plain_pattern():
    h, _ = _planted(c=1, f=256)
    perm = cluster_units(block_mass(h, 64), m=16)
    assert torch.equal(torch.sort(perm).values, torch.arange(256))
    assert _kept(h, perm, 64, 2, 16, 1) > _kept(h, torch.arange(256), 64, 2, 16, 1) + 0.02


def test_kept_mass_pools_permuted_layers():
    h, _ = _planted()
    perm = cluster_units(block_mass(h, 64), m=16, c=8)
    assert kept_mass([h], (64, 2, 16), 8, [perm]) == pytest.approx(_kept(h, perm, 64, 2, 16, 8), rel=1e-6)
    g = h[:, torch.randperm(256, generator=torch.Generator().manual_seed(5))]
    pooled = kept_mass([h, g], (64, 2, 16), 8, [perm, None])
    want = (h[:, perm] * vnm_mask(h[:, perm], 64, 2, 16, 8)).sum() + (g * vnm_mask(g, 64, 2, 16, 8)).sum()
    assert pooled == pytest.approx((want / (h.sum() + g.sum())).item(), rel=1e-6)


def test_balanced_assignment_and_groups_have_exact_sizes():
    g = torch.Generator().manual_seed(1)
    profiles = torch.rand(96, 40, generator=g) ** 4
    chunks = chunk_units(profiles, 6)
    assert chunks.shape == (16, 6) and torch.equal(torch.sort(chunks.reshape(-1)).values, torch.arange(96))
    groups = group_chunks(torch.rand(16, 40, generator=g), 4)
    assert groups.shape == (4, 4) and torch.equal(torch.sort(groups.reshape(-1)).values, torch.arange(16))


def _deferred_acceptance(sim: torch.Tensor, capacity: int) -> list[int]:
    """Plain-Python rounds: every unassigned row proposes to its most similar cluster with room; a
    cluster accepts its most similar proposers up to its room (sim without ties)."""
    u, k = sim.shape
    assign, room = [-1] * u, [capacity] * k
    while -1 in assign:
        proposals: dict[int, list[int]] = {}
        for i in (i for i in range(u) if assign[i] < 0):
            best = max((j for j in range(k) if room[j] > 0), key=lambda j: float(sim[i, j]))
            proposals.setdefault(best, []).append(i)
        for j, rows in proposals.items():
            for i in sorted(rows, key=lambda i: -float(sim[i, j]))[: room[j]]:
                assign[i] = j
                room[j] -= 1
    return assign


def test_balanced_assignment_is_deferred_acceptance():
    from sparse_compile.clustering import _balanced_assign

    for seed in range(3):
        sim = torch.randn(96, 12, generator=torch.Generator().manual_seed(seed))
        assert _balanced_assign(sim, 8).tolist() == _deferred_acceptance(sim, 8)


def test_permuted_ffn_is_the_same_function():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(64, 32, generator=g, dtype=torch.float64)
    w1, b1 = torch.randn(128, 32, generator=g, dtype=torch.float64), torch.randn(128, generator=g, dtype=torch.float64)
    w2 = torch.randn(32, 128, generator=g, dtype=torch.float64)
    h = torch.relu(x @ w1.t() + b1).square()
    perm = cluster_units(block_mass(h, 16), m=4, c=2)
    hp = torch.relu(x @ w1[perm].t() + b1[perm]).square()
    torch.testing.assert_close(hp @ w2[:, perm].t(), h @ w2.t())


@pytest.mark.parametrize(
    "f, m, c, message",
    [(100, 16, 1, "not a multiple of M\\*c"), (128, 4, 3, "not a multiple of M\\*c"), (128, 0, 1, "M\\*c")],
)
def test_bad_sizes_name_the_values(f, m, c, message):
    with pytest.raises(ValueError, match=message):
        cluster_units(torch.rand(f, 8), m, c)


def test_cluster_probe_runs_on_cpu(tmp_path, capsys):
    from bench.cluster_probe import main, parse_pattern

    assert parse_pattern("128:2:16c64") == (128, 2, 16, 64) and parse_pattern("64:2:8") == (64, 2, 8, 1)
    with pytest.raises(ValueError, match="V:N:McC"):
        parse_pattern("64:2")
    csv_path = tmp_path / "probe.csv"
    argv = ["--fit-at", "2,4", "--patterns", "64:2:8,32:2:8c4", "--corpus", "stdlib", "--fit-batches", "1",
            "--eval-batches", "1", "--data-dir", str(tmp_path / "data"), "--csv", str(csv_path)]  # fmt: skip
    assert main(argv) == 0
    text = csv_path.read_text()
    assert "stale (previous fit)" in text and "chunks only" in text and "clustered" in text
    # --score-rows: the causal pattern on all rows and on the last S, its agreement 1 with itself
    argv = ["--fit-at", "2", "--patterns", "32:4:8c4", "--corpus", "stdlib", "--eval-batches", "1", "--no-cluster",
            "--score-rows", "32,4", "--data-dir", str(tmp_path / "data"), "--csv", str(csv_path)]  # fmt: skip
    assert main(argv) == 0
    rows = {r["variant"]: r for r in csv.DictReader(csv_path.open())}
    assert set(rows) == {"identity", "causal", "causal, last 32 rows", "causal, last 4 rows"}
    assert 0.0 < float(rows["identity"]["kept"]) < 1.0
    assert float(rows["causal"]["agree"]) == 1.0 and rows["causal"]["kept"] == rows["causal, last 32 rows"]["kept"]
    assert 0.0 < float(rows["causal, last 4 rows"]["agree"]) < 1.0


def test_static_share_tells_a_fixed_choice_from_a_varying_one():
    """1 when every block keeps the same chunks (a strong per-unit offset), 0 on random H, and the
    mean pooled over layers by kept pairs; causal selection counts the same way."""
    g = torch.Generator().manual_seed(0)
    h = torch.rand(1024, 512, generator=g)
    fixed = h * 0.01 + torch.rand(1, 512, generator=g) * 10
    assert static_share([h], (64, 2, 16), 8) == 0.0
    assert static_share([fixed], (64, 2, 16), 8) == 1.0
    assert static_share([fixed, h], (64, 2, 16), 8) == 0.5
    assert static_share([fixed], (64, 2, 16), 8, seq=512) == 1.0
    # half the blocks favour chunks 0-3 of each group, half chunks 4-7: no chunk reaches 90% of the blocks
    chunk = (torch.arange(512) % 128) // 8  # chunk id inside its group of M = 16 chunks of 8 units
    halves = h * 0.01 + torch.cat(
        [(chunk < 4).float().expand(512, -1), ((chunk >= 4) & (chunk < 8)).float().expand(512, -1)]
    )
    assert static_share([halves], (64, 2, 16), 8) == 0.0
    assert static_share([halves], (64, 2, 16), 8, most=0.5) == 1.0


def test_heaviest_first_orders_each_chunk_by_mass_and_keeps_the_chunks():
    h, _ = _planted()
    profiles = block_mass(h, 64)
    plain = cluster_units(profiles, m=16, c=8).reshape(-1, 8)
    heavy = cluster_units(profiles, m=16, c=8, heaviest_first=True).reshape(-1, 8)
    assert torch.equal(plain.sort(dim=1).values, heavy.sort(dim=1).values)  # the same chunks, in the same places
    assert torch.equal(plain, plain.sort(dim=1).values)  # by default each chunk's units by id
    mass = profiles.sum(dim=1)
    for row in heavy.tolist():  # each chunk's units by mass, largest first, ties to the lower id
        assert row == sorted(row, key=lambda u: (-mass[u].item(), u))
    ties = torch.ones(256, 4)  # every unit the same mass: ids ascending
    tied = cluster_units(ties, m=16, c=8, heaviest_first=True).reshape(-1, 8)
    assert torch.equal(tied, tied.sort(dim=1).values)
