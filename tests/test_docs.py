"""The README quotes bench/RESULTS.md: its tables must carry the same numbers."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
RESULTS = (ROOT / "bench" / "RESULTS.md").read_text()
CHUNK128 = '{"activations": "128:4:16", "causal": true, "chunk": 128}'  # the default's pattern, all rows scored
# the main job: the default with its schedule (dense for the first 10% and the last 65%), five seeds
MAIN_JOB = "h100_125m-d1024_2400steps_seeds_chunked-score16_lr-5e-4_lr-warmup-0.5_final-dense-0.65_cd99e00.csv"
# the same, scored on all 128 rows (the default until 9f0bc18)
MAIN_JOB_128 = "h100_125m-d1024_2400steps_seeds_chunked_lr-5e-4_lr-warmup-0.5_final-dense-0.65_e6b9fbc.csv"


def _table_after(text: str, header_start: str) -> list[str]:
    """The markdown table whose header line starts with ``header_start``, as its lines."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header_start))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    return lines[start:end]


def test_main_job_table_is_quoted_verbatim():
    header = "| seed | dense val | sparse val |"
    quoted = _table_after(README, header)
    assert len(quoted) == 8
    assert quoted == _table_after(RESULTS, header)


def test_main_job_table_is_the_measured_csv():
    import csv

    path = ROOT / "bench" / "results" / MAIN_JOB
    rows = list(csv.DictReader(open(path)))
    table = _table_after(RESULTS, "| seed | dense val | sparse val |")[2:]
    for line, row in zip(table[:5], rows[:5], strict=True):
        cells = _cells(line)
        assert cells[1:4] == [f"{float(row['dense']):.4f}", f"{float(row['sparse']):.4f}", f"{float(row['diff']):+.2%}"]
    mean = _cells(table[5])
    summary = rows[5]
    assert mean[3] == f"{float(summary['diff_mean']):+.2%} ± {float(summary['diff_se']):.2%}"
    assert f"dense seed-to-seed spread {float(summary['dense_spread']):.2%}" in RESULTS


def test_ffn_table_is_quoted_verbatim():
    header = "| (T, d, h) | 2:4 weights + 128:2:16 |"
    quoted = _table_after(README, header)
    assert len(quoted) == 5
    assert quoted == _table_after(RESULTS, header)


def _cells(line: str) -> list[str]:
    return [c.strip().replace("*", "") for c in line.strip("|").split("|")]


def test_e2e_speedups_are_the_measured_ones():
    readme = _table_after(README, "| model | venom (former default) |")
    configs = ["venom (former default)", "activation24", "weight24", "128:2:16"]
    measured = {}
    for line in _table_after(RESULTS, "| size | config | tokens/s | speedup |")[2:]:
        cells = _cells(line)
        measured[(cells[0], cells[1])] = cells[3]
    quoted = 0
    for line in readme[2:]:
        cells = _cells(line)
        size = re.sub(r", H100$", "", cells[0])
        for config, value in zip(configs, cells[1:], strict=True):
            assert measured[(size, config)] == value, (size, config)
            quoted += 1
    assert quoted == 12


def test_default_speedups_are_the_measured_csvs():
    """The README's default table: speedup and peak memory of the default options from the
    end-to-end CSVs, at 350M and 1.3B (H100) and 2.7B (H200)."""
    import csv

    res = ROOT / "bench" / "results"
    files = {
        "350M, H100": ("h100_e2e_350m_default_df746b1_e2e.csv", "350m", "default"),
        "1.3B, H100": ("h100_e2e_1.3b_default_bf7909d_e2e.csv", "1.3b", "default"),
        "2.7B, H200": ("h200_e2e_3b_default_df746b1_e2e.csv", "3b", "default"),
    }
    rows = {_cells(line)[0]: _cells(line) for line in _table_after(README, "| model | default (chunked) |")[2:]}
    for size, (name, model, label) in files.items():
        row = next(r for r in csv.DictReader(open(res / name)) if (r["size"], r["config"]) == (model, label))
        assert rows[size][1].split(" (")[0] == f"{float(row['speedup']):.3f}x", size
        assert rows[size][2] == f"{float(row['mem_vs_dense']):.2f}", size


def test_speed_quality_table_is_the_measured_csvs():
    """The README's speed-against-quality table: 1.3B speedups from the end-to-end CSVs, 125M
    paired differences and kept mass from the seeds CSVs."""
    import csv

    res = ROOT / "bench" / "results"
    causal = '{"activations": "128:4:16", "causal": true}'
    default = '{"activations": "128:4:8", "causal": true, "chunk": 64}'
    default128 = '{"activations": "128:4:8", "causal": true, "chunk": 128}'
    chunk64 = '{"activations": "128:4:16", "causal": true, "chunk": 64}'
    sources = {  # README's (options, schedule) cells -> (e2e CSV and its config, or None; seeds CSV)
        ("`chunked-half`, the former default", "10% / 25%"): (
            ("h100_e2e_1.3b_h-from-b1_2f6f009_e2e.csv", "default"),
            "h100_125m_2400steps_seeds_128-4-8-causal-chunk64_6pairs_5e0c722-4aa3935.csv",
        ),
        (f"`{default128}`", "10% / 25%"): (
            ("h100_e2e_1.3b_h-from-b1_2f6f009_e2e.csv", default128),
            "h100_125m_2400steps_seeds_128-4-8-causal-chunk128_2f6f009.csv",
        ),
        ("venom (former default)", "10% / 25%"): (
            ("h100_e2e_1.3b_b4e25c8.csv", "default"),
            "h100_125m_2400steps_seeds_venom_3b6d6d8.csv",
        ),
        ('`{"activations": "128:2:16"}`', "10% / 25%"): (
            ("h100_e2e_1.3b_patterns_bc7247a.csv", '{"activations": "128:2:16"}'),
            "h100_125m_2400steps_seeds_128-2-16_3b6d6d8.csv",
        ),
        (f"`{causal}`", "10% / 25%"): (
            ("h100_e2e_1.3b_patterns_bc7247a.csv", causal),
            "h100_125m_2400steps_seeds_128-4-16-causal_bc7247a.csv",
        ),
        (f"`{causal}`", "10% / 40%"): (
            ("h100_e2e_1.3b_patterns_bc7247a.csv", causal),
            "h100_125m_2400steps_seeds_128-4-16-causal_final-dense-0.4_b64ab84.csv",
        ),
        (f"`{chunk64}`", "10% / 40%"): (
            ("h100_e2e_1.3b_default_df578b3_e2e.csv", chunk64),
            "h100_125m_2400steps_seeds_128-4-16-causal-chunk64_fd40_bc520ee.csv",
        ),
        ('`{"activations": "128:4:16", "causal": true, "permute": true}`', "10% / 25%, re-clustered every 100 steps"): (
            None,
            "h100_125m_2400steps_seeds_128-4-16-causal-permute_recluster-100_b64ab84.csv",
        ),
        (
            '`{"activations": "128:4:16", "causal": true, "chunk": 64, "permute": true}`',
            "10% / 40%, re-clustered every 100 steps",
        ): (
            None,
            "h100_125m_2400steps_seeds_128-4-16-causal-chunk64-permute_recluster-100_fd40_e8b4234.csv",
        ),
    }
    sources[(f"`{chunk64}`", "10% / 25%, one step in 4 dense")] = (
        None,
        "h100_125m_2400steps_seeds_128-4-16-causal-chunk64_dense-every-4_86e0e93.csv",
    )
    sources[(f"`{causal}`", "10% / 50%")] = (
        ("h100_e2e_1.3b_patterns_bc7247a.csv", causal),
        "h100_125m_2400steps_seeds_128-4-16-causal_final-dense-0.5_86e0e93.csv",
    )
    sources[(f"`{chunk64}`", "10% / 50%")] = (
        ("h100_e2e_1.3b_default_df578b3_e2e.csv", chunk64),
        "h100_125m_2400steps_seeds_128-4-16-causal-chunk64_final-dense-0.5_f3d3b5c.csv",
    )
    d1024 = "model 125m-d1024"  # the 126M model with h = 4096 (h % 2048 == 0 for chunks of 128)
    sources[(f"`{default}`", f"10% / 25%, {d1024}")] = (
        ("h100_e2e_1.3b_h-from-b1_2f6f009_e2e.csv", "default"),
        "h100_125m-d1024_2400steps_seeds_128-4-8-causal-chunk64_1eb8bb5.csv",
    )
    sources[(f"`{CHUNK128}`", f"10% / 25%, {d1024}")] = (
        ("h100_e2e_1.3b_h-from-b1_2f6f009_e2e.csv", CHUNK128),
        "h100_125m-d1024_2400steps_seeds_128-4-16-causal-chunk128_4aa3935.csv",
    )
    sources[(f"`{CHUNK128}`", f"10% / 50%, {d1024}")] = (
        ("h100_e2e_1.3b_h-from-b1_2f6f009_e2e.csv", CHUNK128),
        "h100_125m-d1024_2400steps_seeds_128-4-16-causal-chunk128_final-dense-0.5_5pairs_4aa3935-1eb8bb5.csv",
    )
    res_new = "h100_125m-d1024_2400steps_seeds_{}_lr-warmup-0.5_final-dense-{}.csv"  # the main job at peak lr 1e-3
    e2e_new = ("h100_e2e_1.3b_default_00e6ee6_e2e.csv", "default")
    e2e_half = ("h100_e2e_1.3b_chunked-128-4-16-c128_3fb3d2b_e2e.csv", "chunked-half")  # before the TMA slabs
    lr5 = "h100_125m-d1024_2400steps_seeds_{}_lr-5e-4_lr-warmup-0.5_final-dense-{}.csv"  # the main job, peak 5e-4
    e2e_16 = ("h100_e2e_1.3b_default_bf7909d_e2e.csv", "default")
    score16 = CHUNK128.replace("}", ', "score_rows": 16}')
    sources[(f"default (`{score16}`)", "10% / 65%")] = (e2e_16, MAIN_JOB)
    rows128 = '128 rows (`{"score_rows": null}`, the default until 9f0bc18)'
    sources[(rows128, "10% / 65%")] = (e2e_new, MAIN_JOB_128)
    permuted = lr5.format("default-permute-recluster100", "0.65_df746b1")
    sources[('default, `{"permute": true}`', "10% / 65%, re-clustered every 100 steps")] = (None, permuted)
    grid_a, grid_b = "h100_e2e_1.3b_grid-causal_0d605d1_e2e.csv", "h100_e2e_1.3b_grid-causal-b_0d605d1_e2e.csv"

    def grid_seeds(pattern: str, arm: str, device: str, rev: str) -> str:
        """The main job's seeds CSV of a causal V:N:M ``pattern`` (``arm``: '' or a suffix such as
        '-permute-recluster100'), made on ``device`` at ``rev``."""
        name = lr5.format(pattern.replace(":", "-") + "-causal" + arm, f"0.65_{rev}")
        return name.replace("h100_", f"{device}_", 1)

    for pattern, e2e, device, rev in (
        ("64:2:8", grid_b, "h100", "0d605d1"),
        ("128:2:8", grid_a, "h200", "766dc59"),
        ("128:2:16", grid_b, "h100", "0d605d1"),
        ("64:2:16", grid_a, "h200", "766dc59"),
        ("32:2:16", grid_a, "h200", "766dc59"),
    ):  # issue 16's grid, causal, on the main job
        opts = f'{{"activations": "{pattern}", "causal": true}}'
        sources[(f"`{opts}`", "10% / 65%")] = ((e2e, opts), grid_seeds(pattern, "", device, rev))
    e2e_k = "h200_e2e_1.3b_unchunked-causal-permuted_f650813_e2e.csv"  # one H200, beside dense and the default
    reclustered = "10% / 65%, re-clustered every 100 steps"
    timed = ("128:2:8", "128:4:16")  # the permuted patterns whose 1.3B step was measured
    for pattern in ("64:2:8", "128:2:8", "128:2:16", "64:2:16", "32:2:16", "128:4:16"):  # trained permuted
        opts = f'{{"activations": "{pattern}", "causal": true, "permute": true}}'
        seeds = grid_seeds(pattern, "-permute-recluster100", "h200", "f650813")
        sources[(f"`{opts}`", reclustered)] = ((e2e_k, opts) if pattern in timed else None, seeds)
    for pattern in ("128:4:16", "128:4:8"):  # unchunked, causal, the default's schedule
        opts = f'{{"activations": "{pattern}", "causal": true}}'
        sources[(f"`{opts}`", "10% / 65%")] = ((e2e_k, opts), grid_seeds(pattern, "", "h200", "f650813"))
    sources[("128 rows", "10% / 50%")] = (e2e_new, lr5.format("chunked", "0.5_5seeds_1e138ac-e6b9fbc"))
    sources[(f"`chunked-half` (`{default}`)", "10% / 50%")] = (e2e_half, lr5.format("chunked-half", "0.5_e6b9fbc"))
    lr1 = "128 rows, peak lr 1e-3"
    sources[(lr1, "10% / 50%")] = (e2e_new, res_new.format("chunked", "0.5_e66da62"))
    sources[(lr1, "10% / 60%")] = (e2e_new, res_new.format("chunked", "0.6_3fb3d2b"))
    window = "h100_125m-d1024_2400steps_seeds_chunked_lr-warmup-0.5_warmup-{}_final-dense-{}_1e138ac.csv"
    for warm, tail in ((0.05, 0.55), (0.0, 0.6), (0.3, 0.3), (0.4, 0.2)):  # the 40% sparse window moved
        sources[(lr1, f"{warm:.0%} / {tail:.0%}")] = (e2e_new, window.format(warm, tail))
    sources[("`chunked-half`, peak lr 1e-3", "10% / 50%")] = (e2e_half, res_new.format("chunked-half", "0.5_3fb3d2b"))
    header = "| options | dense warm-up / recovery | 1.3B sparse step | 125M val vs dense | kept mass | seeds |"
    table = _table_after(README, header)[2:]
    assert len(table) == len(sources)
    for line in table:
        cells = _cells(line)
        e2e, seeds = sources[(cells[0], cells[1])]
        speedup = "-"
        if e2e is not None:
            x = next(float(r["speedup"]) for r in csv.DictReader(open(res / e2e[0])) if r["config"] == e2e[1])
            speedup = f"{x:.3f}x"
        rows = list(csv.DictReader(open(res / seeds)))
        s = next(r for r in rows if r["seed"] == "summary")
        diff = f"{float(s['diff_mean']):+.2%} ± {float(s['diff_se']):.2%}"
        want = [speedup, diff, f"{float(s['kept_mean']):.3f}", str(len(rows) - 1)]
        assert cells[2:] == want, cells[0]


def test_distributed_table_is_the_measured_csvs():
    """The README's distributed table and RESULTS section 5's current table: per-GPU throughput
    against one GPU and the default's speedup, from the 2 x H200 CSVs of one run."""
    import csv

    res = ROOT / "bench" / "results"
    runs = {"one GPU": "one", "DDP": "ddp", "FSDP2": "fsdp-unit4"}
    rows = {
        (mode, r["config"]): r
        for mode, name in runs.items()
        for r in csv.DictReader(open(res / f"h200x2_e2e_1.3b_{name}_73c52fc_e2e.csv"))
    }
    readme = {_cells(line)[0].split(" (")[0]: _cells(line) for line in _table_after(README, "| | dense, per GPU")[2:]}
    assert set(readme) == set(runs)
    for mode, cells in readme.items():
        assert cells[1] == ("1" if mode == "one GPU" else rows[(mode, "dense")]["vs_one_gpu"]), mode
        assert cells[2] == f"{float(rows[(mode, 'default')]['speedup']):.3f}x", mode
    table = _table_after(RESULTS, "| mode | config | tokens/s, all GPUs | per GPU | vs one GPU |")[2:]
    assert len(table) == 6
    for line in table:
        cells = _cells(line)
        row = rows[(cells[0], cells[1])]
        assert cells[2] == f"{int(row['tokens_per_s']):,}" and cells[3] == f"{int(row['tokens_per_s_per_gpu']):,}"
        assert cells[4] == (row["vs_one_gpu"] or "1") and cells[8] == f"{float(row['speedup']):.3f}x"
