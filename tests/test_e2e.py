"""bench.e2e and the step profile's grouping (bench/step_profile.py)."""

import csv
import gc
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bench.e2e import GRAPH_GROUP, GRAPH_UNGROUPED, GcTimer, backend_options, kernel_fn_timer, ungroup_graphs
from bench.e2e import main as e2e_main
from bench.multi_gpu import free_port
from bench.step_profile import GROUPS, breakdown, classify, collective_kernels, host, host_calls, split_collectives


def _op(name: str, ts: float, dur: float, tid: int = 1, dims=None) -> dict:
    args = {"Input Dims": dims} if dims is not None else {}
    return {"ph": "X", "cat": "cpu_op", "name": name, "ts": ts, "dur": dur, "tid": tid, "args": args}


def _launch(corr: int, ts: float, tid: int = 1, cat: str = "cuda_runtime") -> dict:
    return {
        "ph": "X",
        "cat": cat,
        "name": "cudaLaunchKernel",
        "ts": ts,
        "dur": 1,
        "tid": tid,
        "args": {"correlation": corr},
    }


def _kernel(corr: int, name: str, dur: float) -> dict:
    return {"ph": "X", "cat": "kernel", "name": name, "ts": 0, "dur": dur, "tid": 7, "args": {"correlation": corr}}


def test_kernels_are_grouped_by_their_launching_ops():
    h = 4096
    events = [
        # dense FFN GEMM: an aten::mm whose operands include h, inside a compiled graph's annotation
        _op("## Call CompiledFxGraph ##", 0, 1000),
        _op("aten::mm", 10, 20, dims=[[16384, 1024], [1024, h]]),
        _launch(1, 15),
        _kernel(1, "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT", 3000),
        # an attention projection: no h among its dims
        _op("aten::mm", 40, 20, dims=[[16384, 1024], [1024, 3072]]),
        _launch(2, 45),
        _kernel(2, "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT", 1000),
        # inside our op: a cuBLAS GEMM of any shape is the FFN's; the selection kernel is ours
        _op("sparse_compile::sqrelu_ffn_vnm", 100, 200),
        _op("aten::addmm", 110, 20, dims=[[], [16384, 1024], [1024, 1024]]),
        _launch(3, 115),
        _kernel(3, "sm90_xmma_gemm_bf16bf16", 2000),
        _launch(4, 150, cat="cuda_driver"),  # Triton launches through the driver API
        _kernel(4, "_vnm_select_onchip_kernel", 500),
        _launch(5, 160, cat="cuda_driver"),
        _kernel(5, "_gather_k_kernel", 700),
        # attention, optimizer, other
        _op("aten::_scaled_dot_product_cudnn_attention", 400, 10),
        _launch(6, 405),
        _kernel(6, "cudnn_generated_fort_native_sdpa_sm90_flash_fprop", 1500),
        _op("Optimizer.step#AdamW.step", 2000, 100, tid=2),
        _launch(7, 2050, tid=2),
        _kernel(7, "multi_tensor_apply_kernel", 400),
        _launch(8, 500),
        _kernel(8, "triton_per_fused_native_layer_norm_0", 300),
        # a collective (DDP's bucket all-reduce, FSDP2's all-gather): its transfer and its wait
        _launch(9, 600),
        _kernel(9, "ncclDevKernel_AllReduce_Sum_bf16_RING_LL", 800),
    ]
    groups, top = breakdown({"traceEvents": events}, hidden=h, steps=2)
    assert set(groups) == set(GROUPS)
    want = {
        "FFN GEMMs": (3000 + 2000 + 700) / 2e3,
        "other GEMMs": 1000 / 2e3,
        "sparse kernels": 500 / 2e3,
        "attention": 1500 / 2e3,
        "optimizer": 400 / 2e3,
        "collectives": 800 / 2e3,
        "other": 300 / 2e3,
    }
    for g, ms in want.items():
        assert math.isclose(groups[g], ms), (g, groups[g], ms)
    assert top[0][0] == "FFN GEMMs" and top[0][2] == max(ms for _, _, ms in top)
    # the host side: 9 launches in 2 steps, 3 of them inside the sparse op (100..300 us)
    assert host({"traceEvents": events}, steps=2) == {"launches": 4.5, "sparse launches": 1.5, "sparse op host ms": 0.1}
    assert classify("triton_poi_fused_mul_0", [], h) == "other"


def test_collectives_split_into_transfer_and_each_ranks_wait():
    """Per collective (the k-th NCCL kernel of a name on every rank), transfer is its shortest kernel
    over the ranks and a rank's wait the rest of its own: the ranks' kernels end together."""

    def nccl(name: str, start: float, end: float) -> dict:
        return {"ph": "X", "cat": "kernel", "name": name, "ts": start, "dur": end - start, "tid": 7, "args": {}}

    ag, rs = "ncclDevKernel_AllGather_RING_LL", "ncclDevKernel_ReduceScatter_Sum_f32_RING_LL"
    rank0 = [nccl(ag, 500, 540), nccl(ag, 0, 100), nccl(rs, 200, 250), _kernel(1, "sm90_xmma_gemm", 999)]
    rank1 = [nccl(ag, 70, 100), nccl(rs, 160, 250), nccl(ag, 500, 540)]  # late to the first all-gather
    per_rank = [collective_kernels({"traceEvents": r}) for r in (rank0, rank1)]
    assert per_rank[0] == {f"{ag}#0": 100, f"{ag}#1": 40, f"{rs}#0": 50}
    split = split_collectives(per_rank, steps=2)  # transfer 30 + 50 + 40; rank 0 waits 70 of its 190
    assert math.isclose(split["collectives transfer ms"], 120 / 2e3)
    assert math.isclose(split["collectives wait ms"], 70 / 2e3)
    assert math.isclose(split_collectives(per_rank, steps=2, rank=1)["collectives wait ms"], 40 / 2e3)
    with pytest.raises(ValueError, match="different collectives"):
        split_collectives([per_rank[0], collective_kernels({"traceEvents": rank1[:2]})], steps=2)


def test_host_time_counts_nested_and_overlapping_sparse_ops_once():
    events = [
        _op("sparse_compile::sqrelu_ffn_vnm", 0, 100),
        _op("sparse_compile::sqrelu_ffn_vnm_backward", 50, 100),  # overlaps the first by 50 us
        _op("sparse_compile::sqrelu_ffn_vnm", 60, 10),  # nested
        _op("sparse_compile::sqrelu_ffn_vnm", 0, 30, tid=2),  # another thread counts on its own
        _op("aten::mm", 500, 100),
    ]
    assert host({"traceEvents": events}, steps=1)["sparse op host ms"] == (150 + 30) / 1e3


def test_host_calls_split_self_time_inside_and_outside_sparse_ops():
    def call(name: str, ts: float, dur: float, cat: str, tid: int = 1) -> dict:
        return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "tid": tid, "args": {}}

    events = []
    for step in range(2):  # two steps of the same calls, 1000 us apart
        t = step * 1000
        events += [
            call("sparse_compile::sqrelu_ffn_vnm", t, 300, "cpu_op"),  # 300 - 100 - 40 - 20 = 140 own
            call("aten::empty", t + 10, 100, "cpu_op"),  # 100 - 30 own
            call("cudaMalloc", t + 20, 30, "cuda_runtime"),  # inside aten::empty
            call("cuLaunchKernelEx", t + 150, 40, "cuda_driver"),
            call("cuLaunchKernelEx", t + 200, 20, "cuda_driver"),
            call("aten::mm", t + 400, 50, "cpu_op"),  # elsewhere: 50 - 10
            call("cudaLaunchKernel", t + 410, 10, "cuda_runtime"),
            call("cudaLaunchKernel", t + 500, 5, "cuda_runtime", tid=2),  # another thread, not inside
            {"ph": "X", "cat": "kernel", "name": "gemm", "ts": t, "dur": 999, "tid": 7, "args": {}},  # GPU side
        ]
    rows = host_calls({"traceEvents": events}, steps=2)
    got = {(r["where"], r["name"]): (r["calls per step"], r["self ms per step"]) for r in rows}
    assert got == {
        ("sparse op", "sparse_compile::sqrelu_ffn_vnm"): (1, 0.14),
        ("sparse op", "aten::empty"): (1, 0.07),
        ("sparse op", "cuLaunchKernelEx"): (2, 0.06),
        ("sparse op", "cudaMalloc"): (1, 0.03),
        ("elsewhere", "aten::mm"): (1, 0.04),
        ("elsewhere", "cudaLaunchKernel"): (2, 0.015),
    }
    assert [r["name"] for r in rows][:2] == ["sparse_compile::sqrelu_ffn_vnm", "aten::empty"]  # heaviest first
    assert len(host_calls({"traceEvents": events}, steps=2, top=1)) == 2  # the top one of each side


def test_cuda_graph_rows_leave_launch_grouped_columns_empty():
    row = {f"{g} ms": 1.0 for g in GROUPS} | {"GPU ms": 6.0}
    kernels = [("FFN GEMMs", "nvjet", 2.0), ("attention", "flash", 1.0), ("other", "triton_poi", 0.5)]
    got = ungroup_graphs(row, kernels)
    assert [g for g, _, _ in got] == [GRAPH_GROUP, "attention", GRAPH_GROUP]
    assert all(row[f"{g} ms"] == "" for g in GRAPH_UNGROUPED) and row["attention ms"] == 1.0 and row["GPU ms"] == 6.0


def test_default_configuration_is_the_users_default_and_the_others_run_every_site_sparse():
    from sparse_compile.config import BackendOptions

    default = BackendOptions.parse(backend_options("default")).config
    assert default == BackendOptions.parse(None).config
    assert default.small_ffn == "graphs"  # the size rule applies, as for a user with no options
    half = BackendOptions.parse(backend_options("chunked-half")).config
    assert (half.activations, half.chunk, half.small_ffn) == ("128:4:8", 64, "sparse")
    own = BackendOptions.parse(backend_options('{"activations": "128:2:16", "small_ffn": "dense"}')).config
    assert (own.activations, own.small_ffn) == ("128:2:16", "dense")


def test_e2e_runs_dense_and_sparse_on_cpu(tmp_path):
    out = tmp_path / "e2e"
    rc = e2e_main(
        ["--device", "cpu", "--configs", "dense", "default", "--steps", "1", "--warmup", "1", "--out", str(out)]
    )
    assert rc == 0
    rows = list(csv.DictReader(open(out / "e2e.csv")))
    assert [r["config"] for r in rows] == ["dense", "default"]
    assert rows[0]["speedup"] == "1.0" and float(rows[1]["speedup"]) > 0
    assert rows[1]["sites"] == "4/4 sparse: reference"  # the tiny GPT's four FFNs, CPU kernels
    assert all(float(r["tokens_per_s"]) > 0 and math.isfinite(float(r["last_loss"])) for r in rows)
    for r in rows:  # on the CPU the host runs every op itself: the step is all host time
        assert 0 < float(r["host_ms"]) <= float(r["step_ms"]) and float(r["cpu_ms"]) > 0
        assert float(r["gc_ms"]) >= 0 and float(r["probe_ms"]) > 0
    assert "sparse_compile report" in (out / "summary.txt").read_text()
    assert {r["compile_mode"] for r in rows} == {"default"}
    assert not (out / "host_profile.txt").exists()


def test_e2e_fits_routed_sites_before_timing_them(tmp_path):
    """A routed configuration is timed on fitted routes (bench.train's first fit), the default on none."""
    from sparse_compile.ops import routes

    routed = '{"activations": "16:4:16", "chunk": 4, "routes": 4}'
    argv = ["--device", "cpu", "--configs", "default", routed, "--steps", "1", "--warmup", "1", "--out", str(tmp_path)]
    assert e2e_main(argv) == 0
    rows = list(csv.DictReader(open(tmp_path / "e2e.csv")))
    assert rows[0]["sites"] == "4/4 sparse: reference"  # nothing to fit
    assert rows[1]["sites"].endswith("; 4 fitted"), rows[1]["sites"]
    assert rows[0]["refit_ms"] == "" and float(rows[1]["refit_ms"]) > 0  # one later refit, timed
    assert "refit ms" in (tmp_path / "summary.txt").read_text()
    assert len(routes._sites) == 4 and all(s.perm is not None and s.fitted for s in routes._sites.values())


def test_gc_timer_times_collections_only_while_active():
    with GcTimer() as t:
        gc.collect()
    assert t.seconds > 0 and t._cb not in gc.callbacks
    spent = t.seconds
    gc.collect()
    assert t.seconds == spent


def test_kernel_fn_timer_times_the_gather_functions_and_restores_them():
    from sparse_compile.kernels import ffn_gather

    original = ffn_gather.sqrelu_ffn_forward_gather
    with kernel_fn_timer(gpu=True) as spent:
        assert ffn_gather.sqrelu_ffn_forward_gather is not original
        x = torch.randn(32, 8)
        with pytest.raises(ValueError, match="chunk=3"):  # raised inside: the time still counts
            ffn_gather.sqrelu_ffn_forward_gather(x, x, None, x, None, 16, 2, 8, chunk=3)
    assert spent[0] > 0 and ffn_gather.sqrelu_ffn_forward_gather is original
    with kernel_fn_timer(gpu=False) as spent:  # CPU runs take the reference kernels: nothing wrapped
        assert ffn_gather.sqrelu_ffn_forward_gather is original
    assert spent == [0.0]


def test_e2e_host_profile_names_the_op_among_the_functions(tmp_path):
    argv = ["--device", "cpu", "--configs", '{"activations": "64:2:8"}', "--steps", "1", "--warmup", "1"]
    assert e2e_main([*argv, "--host-profile", "--profile-steps", "2", "--out", str(tmp_path)]) == 0
    text = (tmp_path / "host_profile.txt").read_text()
    assert "2 steps" in text and "ms per step under cProfile" in text and "synchronizing calls: 0" in text
    assert "ffn_reference" in text  # the CPU op's own code is among the 25 functions with most own time


def test_e2e_compile_mode_reaches_both_compiles(tmp_path, monkeypatch):
    """--compile-mode: the dense compile gets mode=..., the sparse one options["mode"]."""
    import bench.e2e

    seen = []

    def fake_compile(model, d, fsdp=None, **kwargs):  # records the call, returns the eager model
        seen.append(kwargs.get("mode") or kwargs.get("options", {}).get("mode"))
        return model

    monkeypatch.setattr(bench.e2e.distributed, "compile_model", fake_compile)
    argv = ["--device", "cpu", "--configs", "dense", '{"activations": "64:2:8"}', "--steps", "1", "--warmup", "1"]
    assert e2e_main([*argv, "--compile-mode", "max-autotune-no-cudagraphs", "--out", str(tmp_path)]) == 0
    assert seen == ["max-autotune-no-cudagraphs"] * 2
    assert {r["compile_mode"] for r in csv.DictReader(open(tmp_path / "e2e.csv"))} == {"max-autotune-no-cudagraphs"}


@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_e2e_under_torchrun_against_one_process(tmp_path, mode):
    """torchrun --nproc-per-node 2 -m bench.e2e --distributed MODE --baseline ONE/e2e.csv: rank 0 writes
    one row per configuration with 2 GPUs, per-GPU tokens/s and their ratio to the one-process run;
    every FFN stays sparse (FSDP2: the one block graph every block reuses). With --host-profile every
    rank runs the profiled steps (rank 0 alone would wait on the others in their collectives)."""
    one = tmp_path / "one"
    common = ["--device", "cpu", "--configs", "dense", "default", "--steps", "1", "--warmup", "1", "--batch-size", "2"]
    assert e2e_main([*common, "--out", str(one)]) == 0
    out = tmp_path / mode
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", free_port()]
    cmd = [*torchrun, "-m", "bench.e2e", "--distributed", mode, *common, "--baseline", str(one / "e2e.csv")]
    cmd += ["--out", str(out), "--host-profile", "--profile-steps", "1"]
    log = tmp_path / f"{mode}.log"
    with open(log, "w") as f:
        done = subprocess.run(cmd, cwd=Path(__file__).resolve().parent.parent, stdout=f, stderr=subprocess.STDOUT,
                              timeout=300)  # fmt: skip
    assert done.returncode == 0, log.read_text()[-3000:]
    rows = list(csv.DictReader(open(out / "e2e.csv")))
    assert [(r["config"], r["gpus"], r["distributed"]) for r in rows] == [("dense", "2", mode), ("default", "2", mode)]
    for r in rows:
        assert int(r["tokens_per_s"]) == pytest.approx(2 * int(r["tokens_per_s_per_gpu"]), abs=2)
        assert float(r["vs_one_gpu"]) > 0
    assert rows[1]["sites"] == ("1/1 sparse: reference" if mode == "fsdp" else "4/4 sparse: reference")
    assert "per GPU x 2 GPUs" in (out / "summary.txt").read_text()
    assert (out / "host_profile.txt").read_text().count("steps, ") == 2  # each configuration, from rank 0


def test_dense_phase_steps_run_in_the_dense_phase_and_time_all_but_two(tmp_path):
    import sparse_compile
    from bench.e2e import dense_phase_steps

    seen = []
    row = dense_phase_steps(lambda i: seen.append((i, sparse_compile.phase())), 4, lambda: None, torch.device("cpu"))
    assert seen == [(i, "dense") for i in range(4)] and sparse_compile.phase() == "sparse"
    assert row["dense_phase_ms"] >= 0 and row["dense_phase_peak_GiB"] == row["dense_phase_reserved_GiB"] == ""
    out = tmp_path / "e2e"
    argv = ["--device", "cpu", "--configs", "dense", "default", "--steps", "1", "--warmup", "1", "--out", str(out)]
    assert e2e_main([*argv, "--dense-steps", "3"]) == 0
    rows = list(csv.DictReader(open(out / "e2e.csv")))
    assert all(float(r["dense_phase_ms"]) > 0 for r in rows)
    assert "dense phase" in (out / "summary.txt").read_text()
    with pytest.raises(SystemExit):
        e2e_main([*argv, "--dense-steps", "2"])


def test_multi_gpu_runs_one_ddp_and_fsdp_into_one_table(tmp_path):
    """python -m bench.multi_gpu (CPU, gloo, 2 processes): the one-process run, then DDP and FSDP2 under
    torchrun against it, merged into one row per engine and configuration: per-GPU tokens/s against
    one GPU, each engine's speedup over its own dense row and against the one-GPU speedup."""
    from bench import multi_gpu

    out = tmp_path / "mg"
    argv = ["--gpus", "2", "--out", str(out), "--timeout", "600", "--"]
    argv += ["--device", "cpu", "--steps", "1", "--warmup", "1", "--batch-size", "2"]
    assert multi_gpu.main(argv) == 0, [(out / e / "run.log").read_text()[-2000:] for e in multi_gpu.ENGINES]
    rows = list(csv.DictReader(open(out / "multi_gpu.csv")))
    assert [(r["engine"], r["config"], r["gpus"]) for r in rows] == [
        ("one", "dense", "1"), ("one", "default", "1"), ("ddp", "dense", "2"), ("ddp", "default", "2"),
        ("fsdp", "dense", "2"), ("fsdp", "default", "2"),
    ]  # fmt: skip
    for r in rows:
        assert float(r["tokens_per_s_per_gpu"]) > 0 and float(r["vs_one_gpu"]) > 0
        assert float(r["speedup_vs_one_gpu_speedup"]) > 0
    one = {r["config"]: r for r in rows if r["engine"] == "one"}
    assert float(one["default"]["speedup_vs_one_gpu_speedup"]) == 1.0 and one["dense"]["vs_one_gpu"] == "1.0"
    summary = (out / "summary.txt").read_text()
    assert "one GPU's" in summary and "collectives" in summary and "wait" in summary and "fsdp" in summary
    # --resume keeps the finished engines' CSVs (no run) and merges them again into the same table
    stamps = {e: (out / e / "e2e.csv").stat().st_mtime_ns for e in multi_gpu.ENGINES}
    (out / "summary.txt").unlink()
    cut = argv.index("--")
    assert multi_gpu.main([*argv[:cut], "--resume", *argv[cut:]]) == 0
    assert {e: (out / e / "e2e.csv").stat().st_mtime_ns for e in multi_gpu.ENGINES} == stamps
    assert (out / "summary.txt").read_text() == summary
    with pytest.raises(SystemExit):  # a kept CSV of other configurations is not this call's
        multi_gpu.main([*argv[:cut], "--resume", "--configs", "dense", "venom", *argv[cut:]])
    with pytest.raises(SystemExit):
        multi_gpu.main(["--gpus", "1"])
    with pytest.raises(SystemExit):
        multi_gpu.main(["--configs", "default"])
