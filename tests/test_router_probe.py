"""bench.router_probe on the CPU: every configuration x router measured; each router keeps at most its
groups' oracle, the oracle router exactly that; bad configurations name the value."""

import csv

import pytest

from bench.router_probe import main, parse_routes


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
