"""bench/fsdp_projection.py: the FSDP2 projection's formula on hand-computed cases, its invariants, its
measured inputs against their raw files, and docs/fsdp_projection.md against its output."""

import csv
import re
from pathlib import Path

import pytest

from bench import fsdp_projection as fp

ROOT = Path(__file__).resolve().parent.parent
RES = ROOT / "bench" / "results"


H200X2 = "h200x2_e2e_1.3b_one-ddp-fsdp_73c52fc.csv"  # one GPU, DDP and FSDP2 (column engine)


def _e2e(name: str, config: str, engine: str | None = None) -> dict[str, str]:
    with open(RES / name, newline="") as f:
        return next(r for r in csv.DictReader(f) if r["config"] == config and r.get("engine") in (engine, None))


def test_comm_time_by_hand():
    # 1B parameters, 8 GPUs on NVLink at 0.75 of 450 GB/s: a bf16 all-gather moves 7/8 of 2 GB per GPU
    assert fp.comm_ms(2e9, 8, 450.0, 0.75) == pytest.approx(1.75e9 / 337.5e9 * 1e3)  # 5.185 ms
    # the step's bf16 all-gather + fp32 reduce-scatter: 6 bytes per parameter
    assert fp.comm_ms(6e9, 8, 450.0, 0.75) == pytest.approx(5.25e9 / 337.5e9 * 1e3)  # 15.56 ms
    assert fp.comm_ms(6e9, 64, 400.0, 1.0) == pytest.approx(6e9 * 63 / 64 / 400e9 * 1e3)
    assert fp.comm_ms(6e9, 1, 450.0) == 0.0


def test_bytes_and_params():
    m = fp.M1P3B
    assert m.params == 1_209_126_912  # bench.e2e's params_M
    assert f"{m.params / 1e6:.1f}" == _e2e(H200X2, "dense", "fsdp")["params_M"]
    assert m.units == 6 and fp.M7B.units == 8
    assert round(fp.M7B.params / 1e9, 2) == 6.45
    root = m.root_params * 8
    assert fp.comm_bytes(m) == m.block_params * 6 + root
    assert fp.comm_bytes(m, reshard=True) == m.block_params * 8 + root


def test_fabrics():
    assert fp.one_host(8).bus_gbps == 450.0
    assert fp.rail_hosts(8).bus_gbps == 400.0 and fp.rail_hosts(8).gpus == 64
    assert fp.flat_nic(8).bus_gbps == 50.0


def test_step_overlaps_comm_up_to_compute():
    assert fp.step_ms(100.0, 60.0, 5.0, 2.0) == 107.0  # compute-bound: comm hidden
    assert fp.step_ms(100.0, 150.0, 5.0, 2.0) == 155.0  # comm-bound


def test_compute_scales_by_flops():
    dense, sparse = fp.compute_ms(fp.M7B)
    ratio = fp.M7B.params / fp.M1P3B.params
    assert dense == pytest.approx(256.61 * ratio) and sparse == pytest.approx(174.02 * ratio)


def _rows() -> list[fp.Row]:
    rows = []
    for model in (fp.M1P3B, fp.M7B):
        for gpus in (2, 4, 8, 16, 64, 512):
            for bus in (5.0, 20.0, 36.0, 50.0, 53.0, 100.0, 400.0, 450.0, 1000.0):
                for reshard in (False, True):
                    rows.append(fp.project(model, fp.Fabric("x", gpus, bus), reshard=reshard))
    return rows


def test_sparse_speedup_never_exceeds_compute_only():
    for r in _rows():
        assert r.speedup <= r.compute_speedup + 1e-12, (r.model.name, r.fabric, r.speedup)
        assert r.speedup >= 1.0 - 1e-12


def test_speedup_falls_with_n_when_comm_bound():
    for model in (fp.M1P3B, fp.M7B):
        for bus in (20.0, 40.0, 50.0):
            rows = [fp.project(model, fp.Fabric("x", n, bus)) for n in (2, 4, 8, 16, 64, 512)]
            speedups = [r.speedup for r in rows]
            assert all(a >= b - 1e-12 for a, b in zip(speedups, speedups[1:], strict=False)), (bus, speedups)
            for a, b in zip(rows, rows[1:], strict=False):
                sparse_bound = b.comm > b.compute[1] + b.fixed and b.comm < b.compute[0] + b.fixed
                if sparse_bound:
                    assert b.speedup < a.speedup, (bus, a.fabric.gpus, b.fabric.gpus)


def test_crossover_is_where_comm_meets_compute():
    model = fp.M1P3B
    compute = fp.compute_ms(model)[1]
    b = fp.crossover_gbps(model, 64, compute)
    assert fp.comm_ms(fp.comm_bytes(model), 64, b) == pytest.approx(compute)
    t = fp.crossover_tokens(model, fp.rail_hosts(8))
    assert compute * t / fp.TOKENS_PER_GPU == pytest.approx(fp.comm_ms(fp.comm_bytes(model), 64, 400.0))


def test_no_comm_limit_at_8_and_64_gpus_with_16k_tokens():
    for model in (fp.M1P3B, fp.M7B):
        for fabric in (fp.one_host(8), fp.rail_hosts(8)):
            r = fp.project(model, fabric)
            assert r.comm < r.compute[1]
            assert r.speedup > 0.97 * r.compute_speedup
        worst = fp.project(model, fp.flat_nic(8))
        assert worst.comm > worst.compute[1] and worst.speedup < 0.92 * worst.compute_speedup


def test_measured_inputs_are_the_raw_files():
    h100 = "h100_e2e_1.3b_default_bf7909d_e2e.csv"
    for name, engine, want in ((h100, None, fp.H100_1P3B), (H200X2, "one", fp.H200_1P3B),
                               (H200X2, "fsdp", fp.H200X2_FSDP_1P3B)):  # fmt: skip
        assert tuple(float(_e2e(name, c, engine)["step_ms"]) for c in ("dense", "default")) == want, name
    assert tuple(float(_e2e(h100, c)["host_ms"]) for c in ("dense", "default")) == fp.H100_1P3B_HOST
    assert float(_e2e(H200X2, "default", "fsdp")["speedup"]) == fp.H200X2_FSDP_SPEEDUP


def test_two_gpu_check():
    r = fp.project(fp.M1P3B, fp.Fabric("2", 2, fp.NVLINK_GBPS), measured=fp.H200_1P3B)
    # the fitted fixed cost reproduces the mean step growth from one GPU to FSDP2 on two
    growth = [s - c for s, c in zip(r.steps, r.compute, strict=True)]
    measured = [f - o for f, o in zip(fp.H200X2_FSDP_1P3B, fp.H200_1P3B, strict=True)]
    assert sum(growth) == pytest.approx(sum(measured))
    assert abs(r.speedup / fp.H200X2_FSDP_SPEEDUP - 1) < 0.015


def test_projection_doc_is_the_output():
    doc = (ROOT / "docs" / "fsdp_projection.md").read_text()
    for line in fp.table().splitlines() + fp.calibration().splitlines():
        assert line in doc, line
    # RESULTS 5b's headline figures are the table's
    results = (ROOT / "bench" / "RESULTS.md").read_text()
    section = re.search(r"^## 5b\..*?(?=^## )", results, re.S | re.M)
    assert section, "bench/RESULTS.md has no section 5b"
    assert "1.449x-1.453x" in section.group(0) and "docs/fsdp_projection.md" in section.group(0)
    assert "**1.449x**" in doc and "**1.453x**" in doc
