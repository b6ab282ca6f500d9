"""bench.tile_union: per-token chunk choices, their routes and the work of a tiled exact layout,
against loops; bench.cluster_probe --tile-union on the CPU."""

import csv

import pytest
import torch

from bench.tile_union import chunk_choice, fit_choice_centroids, tile_work


def _loop_work(choices: torch.Tensor, v: int, routes: list[int]) -> float:
    """Tiles cut per route in token order (the last padded to v rows), the union of each by a loop."""
    t, n = choices.shape
    work = 0
    for r in sorted(set(routes)):
        tokens = [i for i in range(t) if routes[i] == r]
        for a in range(0, len(tokens), v):
            union = set()
            for i in tokens[a : a + v]:
                union |= set(torch.nonzero(choices[i]).flatten().tolist())
            work += v * len(union)
    return work / (t * n)


def test_chunk_choice_keeps_each_tokens_four_heaviest_chunks_of_every_m():
    """Against a loop: per token and group of M chunks, the 4 chunks with the largest sum of h."""
    h = torch.rand(16, 256, generator=torch.Generator().manual_seed(0)) ** 3
    for m, c in ((16, 4), (8, 8)):
        choice = chunk_choice(h, m, c)
        want = torch.zeros(16, 256 // c, dtype=torch.bool)
        for t in range(16):
            for g in range(256 // (m * c)):
                sums = [h[t, (g * m + j) * c : (g * m + j + 1) * c].sum().item() for j in range(m)]
                for j in sorted(range(m), key=lambda j: -sums[j])[:4]:
                    want[t, g * m + j] = True
        assert torch.equal(choice, want), (m, c)


@pytest.mark.parametrize("v", [1, 4, 16])
def test_tile_work_is_the_union_of_each_tile_padded(v):
    g = torch.Generator().manual_seed(v)
    choices = torch.rand(96, 40, generator=g) < 0.2
    routes = torch.randint(0, 5, (96,), generator=g)
    assert tile_work(choices, v, routes) == pytest.approx(_loop_work(choices, v, routes.tolist()))
    assert tile_work(choices, v) == pytest.approx(_loop_work(choices, v, [0] * 96))
    assert tile_work(choices, 1) == pytest.approx(choices.float().mean().item())


def test_routes_separate_planted_groups_of_choices():
    """Two kinds of tokens choosing disjoint halves, interleaved: in sequence order every tile needs
    both halves; routed to 2 centroids, each tile only its own."""
    a = torch.zeros(64, 32, dtype=torch.bool)
    a[0::2, :16] = True
    a[1::2, 16:] = True
    assert tile_work(a, 8) == 1.0
    routes = (a.float() @ fit_choice_centroids(a, 2).t()).argmax(dim=1)
    assert torch.equal(routes[0::2], routes[0::2][:1].expand(32)) and routes[0] != routes[1]
    assert tile_work(a, 8, routes) == 0.5


def test_bad_values_are_named():
    with pytest.raises(ValueError, match="F=100 is not a multiple of M\\*c = 16\\*4"):
        chunk_choice(torch.rand(8, 100), 16, 4)
    with pytest.raises(ValueError, match="c=1 units per chunk"):
        chunk_choice(torch.rand(8, 64), 16, 1)
    with pytest.raises(ValueError, match="G=9 routes for 8 tokens"):
        fit_choice_centroids(torch.ones(8, 4, dtype=torch.bool), 9)
    with pytest.raises(ValueError, match="T=10 tokens is not a multiple of V=4"):
        tile_work(torch.ones(10, 4, dtype=torch.bool), 4)
    with pytest.raises(ValueError, match="V=0 tokens per tile"):
        tile_work(torch.ones(8, 4, dtype=torch.bool), 0)


def test_cluster_probe_tile_union_on_cpu(tmp_path):
    from bench.cluster_probe import main

    out = tmp_path / "probe.csv"
    argv = ["--fit-at", "2", "--patterns", "1:4:16c4", "--corpus", "stdlib", "--fit-batches", "1", "--eval-batches",
            "1", "--data-dir", str(tmp_path / "data"), "--tile-union", "16", "--routes", "4"]  # fmt: skip
    argv += ["--csv", str(out)]
    assert main(argv) == 0
    rows = {r["variant"]: r for r in csv.DictReader(out.open())}
    for units in ("identity", "clustered"):  # at least each token's own quarter; at most all (in order)
        assert 0.25 <= float(rows[f"{units}, tiles of 16, sequence order"]["work"]) <= 1.0
        assert 0.25 <= float(rows[f"{units}, tiles of 16, 4 routes"]["work"])
    with pytest.raises(SystemExit):
        main(["--patterns", "128:4:16c4", "--tile-union", "16"])
    with pytest.raises(SystemExit):
        main(["--patterns", "1:4:16c4", "--routes", "4"])
    with pytest.raises(SystemExit):
        main(["--patterns", "1:4:16c4", "--tile-union", "0"])


def test_extra_work_is_the_union_of_each_tiles_extra_units():
    """extra_work against a loop over tiles: each token's own r largest units outside keep (the
    row-by-row oracle), their union per tile of V consecutive tokens, V x |union| over T x F."""
    from bench.tile_union import extra_work, token_extras
    from sparse_compile.kernels import vnm_mask

    from .oracle import token_extra_loop

    g = torch.Generator().manual_seed(3)
    h = torch.relu(torch.randn(64, 96, generator=g)) ** 2
    keep = vnm_mask(h, 16, 4, 16, 1, 32)
    for r, v in ((2, 8), (5, 16), (5, 64)):
        extra = token_extra_loop(h, keep, r) & ~keep
        union = sum(len(set(extra[i : i + v].nonzero()[:, 1].tolist())) for i in range(0, 64, v))
        assert torch.equal(token_extras(h, keep, r), extra)
        assert extra_work(token_extras(h, keep, r), v) == pytest.approx(union * v / (64 * 96))
    assert extra_work(token_extras(h, keep, 0), 8) == 0.0
    with pytest.raises(ValueError, match="V=5 tokens per tile for T=64"):
        extra_work(token_extras(h, keep, 2), 5)


def test_cluster_probe_extras_on_cpu(tmp_path):
    from bench.cluster_probe import main

    out = tmp_path / "probe.csv"
    argv = ["--fit-at", "2", "--patterns", "16:4:16c4", "--corpus", "stdlib", "--fit-batches", "1", "--eval-batches",
            "1", "--data-dir", str(tmp_path / "data"), "--score-rows", "4", "--extras", "2,8"]  # fmt: skip
    argv += ["--no-cluster"]
    assert main([*argv, "--csv", str(out)]) == 0
    rows = {r["variant"]: r for r in csv.DictReader(out.open())}
    base = float(rows["causal, last 4 rows"]["kept"])
    two, eight = (rows[f"causal, last 4 rows, +{r} per token, tiles of 16"] for r in (2, 8))
    assert base < float(two["kept"]) < float(eight["kept"]) <= 1.0  # more of each token's own units kept
    assert 0.0 < float(two["work"]) < float(eight["work"]) <= 1.0
    with pytest.raises(SystemExit):
        main(["--patterns", "16:4:16c4", "--extras", "2"])  # no --score-rows
    with pytest.raises(SystemExit):
        main(["--patterns", "1:4:16c4", "--score-rows", "4", "--extras", "2"])  # per-token pattern
