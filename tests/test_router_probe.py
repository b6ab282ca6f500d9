"""bench.router_probe on the CPU: every configuration x router measured; each router keeps at most its
groups' oracle, the oracle router exactly that; its kept mass is the health probe's (ops/routes.kept_and_total)
for a site holding the same fit; bad configurations name the value."""

import csv

import pytest
import torch

from bench.router_probe import main, measure, parse_routes
from sparse_compile.contract import ROUTERS
from sparse_compile.kernels.routing import group_columns
from sparse_compile.ops import routes
from sparse_compile.route_fit import fit_routes


def test_router_probe_runs_on_cpu(tmp_path):
    out = tmp_path / "routers.csv"
    argv = ["--fit-at", "6", "--routes", "4@16:4:16c4", "--sample-rows", "256", "--batch-size", "2"]
    assert main([*argv, "--eval-batches", "1", "--csv", str(out)]) == 0
    rows = list(csv.DictReader(out.open()))
    assert [r["router"] for r in rows] == ["representatives", "weighted", "linear", "oracle"]
    for r in rows:
        kept, oracle, agree = float(r["kept"]), float(r["oracle"]), float(r["agree"])
        assert 0.0 < kept <= oracle + 1e-6 and oracle <= 1.0 + 1e-6 and 0.0 <= agree <= 1.0, r
    oracle_row = rows[-1]
    assert float(oracle_row["kept"]) == pytest.approx(float(oracle_row["oracle"])) and float(oracle_row["agree"]) == 1.0


@pytest.mark.parametrize("text", ["4@16:2:16c4", "1@16:4:16c4", "4@16:4:16", "x@16:4:16c4", "16:4:16c4"])
def test_router_probe_configurations_name_the_value(text):
    with pytest.raises(ValueError, match=text):
        parse_routes(text)


@pytest.mark.parametrize("router", ROUTERS)
def test_measure_keeps_what_the_health_probe_counts_for_a_site_with_that_fit(router):
    g = torch.Generator().manual_seed(13)
    t, d, h, m, c, n_groups = 512, 24, 256, 16, 4, 4
    w1 = torch.randn(h, d, generator=g)
    x = torch.randn(t, d, generator=g)
    act = torch.relu(x @ w1.t()).square()
    fit = fit_routes(x[:256], act[:256], n_groups, m, c, router=router)
    kept, oracle, total, at_best = measure(fit, router, x[256:], act[256:], (16, 4, m), c)
    site = routes.RouteSite(n_groups, (16, 4, m), c, perm=fit.perm, groups=fit.groups, rep=fit.rep,
                            cols=group_columns(fit.groups, m, c), lin=fit.lin, router=router)  # fmt: skip
    routes._sites["probe"] = site
    try:
        want_kept, want_total = routes.kept_and_total("probe", x[256:], act[256:])
    finally:
        del routes._sites["probe"]
    assert kept == pytest.approx(want_kept, rel=1e-6) and total == pytest.approx(want_total, rel=1e-6)
    assert kept <= oracle * (1 + 1e-6) and 0 <= at_best <= 256
