"""bench/RESULTS.md's figures are the raw files' it names, and the README's are RESULTS's.

RESULTS names each figure's file: a table's `file` column (`same file`: the row above's), or a
`File:` line right after the table. These tests read the names from RESULTS and compare values, so
a figure measured again changes RESULTS (and the README where it quotes it), not this file.
"""

import csv
import re
from pathlib import Path

from bench.whole_run import projected_speedup
from sparse_compile.phase import FINAL_DENSE_FRAC, WARMUP_FRAC

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
RESULTS = (ROOT / "bench" / "RESULTS.md").read_text()
RES = ROOT / "bench" / "results"


def _table_after(text: str, header_start: str) -> list[str]:
    """The markdown table whose header line starts with ``header_start``, as its lines."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header_start))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    return lines[start:end]


def _cells(line: str) -> list[str]:
    return [c.strip().replace("*", "") for c in line.strip().strip("|").split("|")]


def _rows(text: str, header_start: str) -> list[dict[str, str]]:
    """The table's body rows as {header cell: cell}, with ``file`` resolved through `same file`."""
    table = _table_after(text, header_start)
    header = _cells(table[0])
    rows, last = [], None
    for line in table[2:]:
        row = dict(zip(header, _cells(line), strict=True))
        if "file" in row:
            last = row["file"] = last if row["file"] == "same file" else row["file"]
        rows.append(row)
    return rows


def _path(cell: str) -> Path:
    """The raw file a RESULTS cell or line names: `results/NAME`."""
    return RES / re.search(r"`results/([^`]+)`", cell).group(1)


def _file_after(text: str, header_start: str) -> Path:
    """The file named by the `File:` line that follows the table."""
    lines = text.splitlines()
    end = lines.index(_table_after(text, header_start)[-1])
    line = next(line for line in lines[end + 1 :] if line.strip())
    assert line.startswith("File: "), line
    return _path(line)


def _csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _e2e(path: Path, config: str) -> dict[str, str]:
    return next(r for r in _csv(path) if r["config"] == config)


def _paired(path: Path) -> tuple[str, str, str]:
    """A seeds CSV's summary as RESULTS writes it: (mean ± s.e., kept mass, number of seeds)."""
    rows = _csv(path)
    s = next(r for r in rows if r["seed"] == "summary")
    diff = f"{float(s['diff_mean']):+.2%} ± {float(s['diff_se']):.2%}"
    return diff, f"{float(s['kept_mean']):.3f}", str(len(rows) - 1)


def test_results_cites_every_raw_file_and_no_other():
    cited = set(re.findall(r"`results/([^`]+)`", RESULTS))
    assert cited == {p.name for p in RES.iterdir()}
    assert len(cited) <= 40


def test_results_stays_short():
    assert len(RESULTS.splitlines()) < 400


MAIN_JOB = "| seed | dense val | sparse val |"


def test_main_job_table_is_its_csv():
    rows = _csv(_file_after(RESULTS, MAIN_JOB))
    table = [_cells(line) for line in _table_after(RESULTS, MAIN_JOB)[2:]]
    assert len(table) == len(rows) == 6
    for cells, row in zip(table[:5], rows[:5], strict=True):
        want = [f"{float(row['dense']):.4f}", f"{float(row['sparse']):.4f}", f"{float(row['diff']):+.2%}"]
        assert cells[1:5] == want + [f"{float(row['kept']):.3f}"], cells[0]
    summary = rows[5]
    mean = table[5]
    assert mean[1:3] == [f"{float(summary['dense_mean']):.4f}", f"{float(summary['sparse_mean']):.4f}"]
    assert mean[3] == _paired(_file_after(RESULTS, MAIN_JOB))[0]
    assert mean[4] == f"{float(summary['kept_mean']):.3f}"
    assert f"dense seed-to-seed spread {float(summary['dense_spread']):.2%}" in RESULTS


DEFAULT_STEP = "| size | device | revision | dense step ms | default step ms | speedup |"


DEFAULT_SPARSE = 1 - WARMUP_FRAC - FINAL_DENSE_FRAC  # the default schedule's sparse fraction
WHOLE_RUN_COLUMN = f"whole run, {DEFAULT_SPARSE:.0%} of steps sparse"


def _whole_run(speedup: float, sparse_frac: float = DEFAULT_SPARSE) -> str:
    """A run's speedup with ``sparse_frac`` of its steps sparse at ``speedup`` (the rest dense)."""
    return f"{1 / (1 - sparse_frac + sparse_frac / speedup):.2f}x"


def test_default_step_table_is_its_csvs():
    rows = _rows(RESULTS, DEFAULT_STEP)
    assert [r["size"] for r in rows] == ["350M", "1.3B", "2.7B"]
    for row in rows:
        dense, default = (_e2e(_path(row["file"]), c) for c in ("dense", "default"))
        assert row["dense step ms"] == f"{float(dense['step_ms']):.2f}", row["size"]
        assert row["default step ms"] == f"{float(default['step_ms']):.2f}", row["size"]
        assert row["speedup"] == f"{float(default['speedup']):.3f}x", row["size"]
        assert row["peak memory vs dense"] == f"{float(default['mem_vs_dense']):.3f}", row["size"]
        assert row[WHOLE_RUN_COLUMN] == _whole_run(float(default["speedup"])), row["size"]
        assert row["device"] in default["device"], row["size"]


def test_option_table_is_its_csvs():
    for row in _rows(RESULTS, "| option | value | `bench.e2e` config |"):
        config = re.search(r"`([^`]+)`", row["`bench.e2e` config"]).group(1)
        measured = _e2e(_path(row["file"]), config)
        assert row["speedup"] == f"{float(measured['speedup']):.3f}x", row
        assert row["peak memory vs dense"] == f"{float(measured['mem_vs_dense']):.3f}", row


def test_ffn_table_is_its_csv():
    header = "| (T, d, h) | dense compiled fwd / bwd / full ms |"
    rows = _csv(_file_after(RESULTS, header))
    for line in _table_after(RESULTS, header)[2:]:
        cells = _cells(line)
        shape = "x".join(re.findall(r"\d+", cells[0]))
        measured = {(r["provider"], r["mode"]): r for r in rows if r["shape"] == shape}
        modes = ("fwd", "bwd", "full")
        for cell, provider in ((cells[1], "dense-compiled"), (cells[2], "sparse chunked")):
            assert cell == " / ".join(f"{float(measured[(provider, m)]['ms']):.3f}" for m in modes), shape
        ratios = [float(measured[("sparse chunked", m)]["speedup_vs_best_dense"]) for m in modes]
        assert cells[3] == f"{ratios[0]:.2f}x / {ratios[1]:.2f}x / {ratios[2]:.3f}x", shape


def test_distributed_table_is_its_csv():
    """Section 5's one-call table (bench.multi_gpu's engines, the e2e rows of each) quotes its file."""
    path = _path(re.search(r"`results/h100x2_multi_gpu_1\.3b_[^`]+`", RESULTS).group(0))
    measured = _csv(path)
    call = next(r["revision"] for r in measured if r["config"] == "default")  # the table's call (dense, default)
    rows = _rows(RESULTS, "| engine | config | tokens/s per GPU | vs one GPU | speedup (vs one GPU's) |")
    assert len(rows) == 6
    engines = {"one GPU": "one", "DDP": "ddp", "FSDP2": "fsdp"}
    for row in rows:
        want = (call, engines[row["engine"]], row["config"])
        m = next(r for r in measured if (r["revision"], r["engine"], r["config"]) == want)
        assert row["tokens/s per GPU"] == f"{int(m['tokens_per_s_per_gpu']):,}", row
        assert float(row["vs one GPU"].strip("*")) == float(m["vs_one_gpu"] or 1), row
        speedup, _, ratio = row["speedup (vs one GPU's)"].partition(" (")
        assert speedup.strip("*") == f"{float(m['speedup']):.3f}x", row
        one = next(r for r in measured if (r["revision"], r["engine"], r["config"]) == (call, "one", row["config"]))
        assert ratio in ("", f"{float(m['speedup']) / float(one['speedup']):.3f})"), row
        assert (row["step ms"], row["host ms"]) == (f"{float(m['step_ms']):.2f}", f"{float(m['host_ms']):.2f}"), row
        transfer, wait = (float(m[f"collectives {k} ms"] or "nan") for k in ("transfer", "wait"))
        split = "-" if m["engine"] == "one" else f"{transfer:.2f} + {wait:.2f}"
        assert row["NCCL ms: transfer + wait"] == split, row
        assert row["peak GiB"] == f"{float(m['peak_mem_GiB']):.2f}", row


QUALITY = "| configuration | schedule | 125M val vs dense | kept mass | seeds |"


def test_quality_table_is_its_csvs():
    for row in _rows(RESULTS, QUALITY):
        paired = [row["125M val vs dense"], row["kept mass"], row["seeds"]]
        assert paired == list(_paired(_path(row["seeds file"]))), row["configuration"]
        if row["step file"] == "-":
            assert row["1.3B step"] == "-"
            continue
        path = _path(row["step file"])
        options = re.search(r"`(\{.*?\})`", row["configuration"])
        configs = {r["config"] for r in _csv(path)}
        config = options.group(1) if options and options.group(1) in configs else "default"
        assert row["1.3B step"] == f"{float(_e2e(path, config)['speedup']):.3f}x", row["configuration"]


README_DEFAULT = "| model (device) | sparse step vs dense |"


def test_readme_default_table_quotes_results():
    results = {row["size"]: row for row in _rows(RESULTS, DEFAULT_STEP)}
    rows = _rows(README, README_DEFAULT)
    assert len(rows) == len(results)
    for row in rows:
        size, device = re.match(r"\[(\S+) \((\w+)\)\]", row["model (device)"]).groups()
        measured = results[size]
        assert device == measured["device"], size
        assert row["sparse step vs dense"] == measured["speedup"], size
        whole_run = row["whole run, default schedule (projected, equal steps)"]
        assert whole_run == measured[WHOLE_RUN_COLUMN], size
        assert row["peak memory vs dense"] == measured["peak memory vs dense"], size


def _slug(heading: str) -> str:
    """GitHub's anchor of a markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_readme_links_into_results_quote_its_figures():
    anchors = {_slug(line.lstrip("#")) for line in RESULTS.splitlines() if line.startswith("## ")}
    links = re.findall(r"\[([^\]]+)\]\(bench/RESULTS\.md#([^)]+)\)", README)
    assert len(links) >= 5
    for text, anchor in links:
        assert anchor in anchors, anchor
        for figure in re.findall(r"[+-]?\d+\.\d+(?:%|x)?", text):
            assert figure in RESULTS, (text, figure)
    mean = _cells(_table_after(RESULTS, MAIN_JOB)[-1])[3]  # the main job's result, as RESULTS states it
    assert f"[{mean}](bench/RESULTS.md#" in README


def test_readme_is_a_reference_with_the_ci_test_command():
    assert len(README.splitlines()) <= 180
    quick = README.split("\n## Quick start\n", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    commands = [line.split("#")[0].strip() for line in quick.splitlines()]
    assert 'pip install -e ".[test]"' in commands and "python -m bench.train" in commands
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert [c for c in commands if "pytest" in c] == [c for c in ci if "pytest" in c and not c.startswith("#")]


# a git revision: 7-40 hex digits with at least one letter and one digit (so plain numbers do not count)
REVISION = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b")


def test_no_revision_hashes_in_code_or_readme():
    """Revisions belong to RESULTS (the one each figure was measured at) and to git, not to the
    code's comments and docstrings or the README."""
    skip = (".", "build", "runs")  # hidden folders (.git, .venv), build outputs, bench runs
    files = [
        p
        for p in ROOT.rglob("*.py")
        if not any(part.startswith(skip) or part.endswith(".egg-info") for part in p.relative_to(ROOT).parts[:-1])
    ]
    found = [
        f"{p.relative_to(ROOT)}:{i}: {m.group(0)}"
        for p in files
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if (m := REVISION.search(line))
    ]
    assert not found
    assert not REVISION.search(README)


WHOLE_RUN = "| model, steps, peak lr | recipe (the default's pattern) |"


def test_whole_run_budgets_are_their_csv():
    """Section 6c: every budget's paired mean ± s.e. (or a single seed's gap) is the budgets CSV's, and
    each row's k and projections follow from them. A recipe is its schedule, then the default's pattern
    or ", PATTERN" (the CSV's structure); a projection cell ending "(s = S, ...)" projects at that step
    (the recipe's own) instead of the header's, and "-" marks a step not measured at that size."""
    path = _path(next(line for line in RESULTS.splitlines() if "most-sparse_structures_budgets" in line))
    rows = _csv(path)
    table = _rows(RESULTS, WHOLE_RUN)
    assert len(table) == 48
    for row in table:
        model, recipe = row["model, steps, peak lr"], row["recipe (the default's pattern)"]
        # "SIZE, STEPS, LR[, what else differs from bench.train's defaults] (N seeds)" -> the CSV's prefix:
        # the size's name (none for 126M), the lr where not the size's usual one, then the rest as written
        name, _, lr, *rest = model.rsplit(" (", 1)[0].split(", ")
        name = name.split(" ")[0]
        parts = {"126M": [], "353M": ["350m"], "1.21B": ["1.3b"]}[name]
        parts += [f"lr {lr}"] * (lr != {"126M": "5e-4", "353M": "5e-4", "1.21B": "3e-4"}[name]) + rest
        size = f"{', '.join(parts)}: " if parts else ""
        match = re.match(r"[\d.]+% / (\d+)% / [\d.]+%", recipe)  # dense warm-up / sparse / dense tail
        schedule, sparse = match.group(0), int(match.group(1)) / 100
        rest = recipe[match.end() :]
        pattern = rest[2:] if rest.startswith(", ") else "block-shared: default chunked"
        seeds = int(re.search(r"\((\d) seeds?\)", model).group(1))
        per_seed: dict[str, list[tuple[int, float]]] = {}  # seed -> (budget, gap) in budget order
        # "BUDGET: GAP" over every seed, or "BUDGET (seed S): GAP" where only seed S ran that budget
        text = row["budget, steps: val vs dense (paired)"]
        cells = re.findall(r"(\d+)(?: \(seed (\d+)\))?: ([^;]+)", text)
        assert len(cells) == len(text.split(";")), (model, text)  # no cell the pattern skips
        for budget, only, cell in cells:
            head = f"{size}{pattern}, {schedule}"
            tail = f"{budget} steps (time-to-quality budget)"
            names = (f"{head}, {tail}", f"{head} stretched to {tail}")
            matching = [r for r in rows if r["structure"] in names]
            if only:  # that seed alone ran this budget
                assert {r["seed"].rsplit("_s", 1)[1] for r in matching} == {only}, (model, budget)
                matching = [r for r in matching if r["seed"].rsplit("_s", 1)[1] == only]
            diffs = [float(r["diff"]) for r in matching]
            assert len(diffs) == (1 if only else seeds), (model, budget)
            for r in matching:
                dense_seed, seed = (name.rsplit("_s", 1)[1] for name in r["seed"].split(" / "))
                assert dense_seed == seed, r["seed"]
                per_seed.setdefault(seed, []).append((int(budget), float(r["diff"])))
            mean = sum(diffs) / len(diffs)
            want = f"{mean:+.2%}"
            if len(diffs) > 1:
                se = (sum((d - mean) ** 2 for d in diffs) / (len(diffs) - 1) / len(diffs)) ** 0.5
                want += f" ± {se:.2%}"
            assert cell.strip() == want, (model, budget)
        # k per seed (bench.whole_run's): linear between the budgets on either side of the dense loss, or
        # above the largest budget where none reached it; the projections from that k
        base = int(model.split(", ")[1])  # the dense run's steps
        found = []
        for seed in sorted(per_seed, key=int):
            budgets = per_seed[seed]
            crossing = [(x, y) for x, y in zip(budgets, budgets[1:], strict=False) if x[1] > 0 >= y[1]]
            if crossing:
                (a, da), (b, db) = crossing[0]
                found.append(((a + da / (da - db) * (b - a)) / base, ""))
            elif budgets[0][1] <= 0:  # the smallest budget already reached it: k at most that budget's
                found.append((budgets[0][0] / base, "<= "))
            else:
                assert all(gap > 0 for _, gap in budgets), (model, seed)  # not reached at any budget
                found.append((budgets[-1][0] / base, "> "))
        ks = row["k, steps to the dense loss (per seed)"].split(" (")[0]
        assert ks == ", ".join(f"{mark}{k:.3f}" for k, mark in found), model
        for header, s in (("projected whole run, 1.3B (s = 1.475)", 1.475), ("2.7B (s = 1.555)", 1.555)):
            cell = row[header]
            if cell == "-":  # the recipe's step not measured at that size
                assert pattern != "block-shared: default chunked", (model, header)
                continue
            if own := re.search(r" \(s = ([\d.]+)[^)]*\)$", cell):  # the recipe's own step
                s, cell = float(own.group(1)), cell[: own.start()]
            bound = {"": "", "> ": "< ", "<= ": ">= "}
            cells = [f"{bound[mark]}{projected_speedup(sparse, s, k):.2f}x" for k, mark in found]
            if all(mark for _, mark in found) and len(set(cells)) == 1:
                cells = cells[:1]  # one bound for every seed
            assert cell == ", ".join(cells), (model, header)
