"""DDP and FSDP2 (2 processes, gloo, CPU) with backend="sparse": sites stay sparse, losses equal one process."""

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import sparse_compile
from bench.model import GPT
from bench.multi_gpu import free_port

from .ddp_worker import CFG, OPTIONS, train

ROOT = Path(__file__).resolve().parent.parent


def _run_ddp(tmp_path, optimize_ddp: bool, bucket_mb: float, mode: str = "ddp", options: dict | None = None) -> dict:
    out = tmp_path / f"{mode}_{optimize_ddp}.json"
    cmd = [
        sys.executable,
        "-m",
        "tests.ddp_worker",
        free_port(),
        str(out),
        mode,
        "1" if optimize_ddp else "0",
        str(bucket_mb),
        *([json.dumps(options)] if options is not None else []),
    ]
    log = tmp_path / f"{mode}_{optimize_ddp}.log"
    with open(log, "w") as f:  # a file, not a pipe: multiprocessing helpers may hold pipes open after exit
        done = subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, timeout=300)
    assert done.returncode == 0, log.read_text()[-3000:]
    return json.loads(out.read_text())


@pytest.mark.parametrize("mode", ["ddp", "ddp-inner"])
def test_ddp_without_graph_split_keeps_every_site_sparse_and_matches_one_process(tmp_path, mode):
    """torch.compile(DDP(model)) with optimize_ddp=False, and DDP(torch.compile(model))."""
    ddp = _run_ddp(tmp_path, optimize_ddp=False, bucket_mb=1.0, mode=mode)
    assert ddp["sparse"] == CFG.n_layer and ddp["dense_reasons"] == []
    torch.manual_seed(0)
    model = GPT(CFG)
    single = train(model, torch.compile(model, backend="sparse", options=OPTIONS), rank=0, world=1)
    # same global batch per step; V=64 token blocks coincide with sequences, so masks are the same
    torch.testing.assert_close(torch.tensor(ddp["losses"]), torch.stack(single), rtol=1e-4, atol=1e-5)
    _same_graphs_on_every_rank_and_no_recompile(ddp)


def _same_graphs_on_every_rank_and_no_recompile(record: dict) -> None:
    """The phase flips (dense, sparse, dense) compiled nothing after the first step, on any rank."""
    first, *others = record["graphs_per_rank"]
    assert all(o == first for o in others), record["graphs_per_rank"]
    assert first[0] >= 1 and all(n == first[0] for n in first), first


@pytest.mark.parametrize("bucket_mb", [1.0])
def test_ddp_graph_split_is_reported(tmp_path, bucket_mb):
    ddp = _run_ddp(tmp_path, optimize_ddp=True, bucket_mb=bucket_mb)
    assert ddp["sparse"] < CFG.n_layer
    assert any("optimize_ddp = False" in reason for reason in ddp["dense_reasons"])


def test_fsdp2_keeps_sites_sparse_and_matches_one_process(tmp_path):
    """fully_shard per block + root, then torch.compile(backend="sparse"): FSDP's hooks run outside the
    graph (Dynamo skips them), so the graph sees all-gathered weights and sparsifies those; the block
    graph is shared by both blocks. Losses equal one sparse process and differ from dense."""
    fsdp = _run_ddp(tmp_path, optimize_ddp=False, bucket_mb=1.0, mode="fsdp")
    assert fsdp["sparse"] >= 1 and fsdp["dense_reasons"] == []
    torch.manual_seed(0)
    model = GPT(CFG)
    single = torch.stack(train(model, torch.compile(model, backend="sparse", options=OPTIONS), rank=0, world=1))
    torch.testing.assert_close(torch.tensor(fsdp["losses"]), single, rtol=1e-4, atol=1e-5)
    _same_graphs_on_every_rank_and_no_recompile(fsdp)
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = GPT(CFG)
    dense = torch.stack(train(model, torch.compile(model), rank=0, world=1))
    assert (dense - single).abs().max() > 1e-3  # the comparison can tell sparse from dense


# routed tokens: V=16 blocks of one group each, padded per call; 4 groups of chunks of 16 units (hidden 1024)
ROUTED = {"activations": "16:4:16", "chunk": 16, "routes": 4}


@pytest.mark.parametrize("mode, router", [("ddp", "weighted"), ("fsdp", "representatives")])
def test_routed_tokens_stay_on_their_rank(tmp_path, mode, router):
    """Each rank routes and pads its own tokens (no token crosses ranks, no collective in the op): both
    engines keep every site sparse on the routed op, and their losses equal one process on the same
    global batch, where a block shared across ranks' tokens would differ. One engine runs the default
    router (weighted), the other the representatives (their op paths differ)."""
    options = {**ROUTED, "router": router}
    record = _run_ddp(tmp_path, optimize_ddp=False, bucket_mb=1.0, mode=mode, options=options)
    assert record["sparse"] >= 1 and record["dense_reasons"] == []
    torch.manual_seed(0)
    sparse_compile.reset_units()
    model = GPT(CFG)
    single = torch.stack(train(model, torch.compile(model, backend="sparse", options=options), rank=0, world=1))
    assert {s.kernel for s in sparse_compile.compile_reports()[-1].sparse_sites} == {"routed reference"}
    torch.testing.assert_close(torch.tensor(record["losses"]), single, rtol=1e-4, atol=1e-5)
    _same_graphs_on_every_rank_and_no_recompile(record)
    for path in ("sparse_compile/ops/ffn_routed.py", "kernels/routing.py", "kernels/ffn_routed.py"):
        assert "torch.distributed" not in (ROOT / path).read_text(), path


def _train(out: Path, batch_size: int, mode: str = "none", extra: tuple[str, ...] = ()) -> str:
    """bench.train (sparse run only, 4 steps), under torchrun with 2 ranks unless mode is none; its log."""
    cmd = [sys.executable]
    if mode != "none":
        cmd += ["-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", free_port()]
    cmd += ["-m", "bench.train", "--distributed", mode, "--runs", "sparse", "--steps", "4"]
    # sequences of 128 tokens: the default's causal V=128 blocks, one per sequence on every rank
    cmd += ["--batch-size", str(batch_size), "--seq-len", "128", "--log-every", "2", "--eval-every", "2"]
    cmd += ["--eval-iters", "1", "--no-progress", "--out", str(out), *extra]
    log = out.with_suffix(".log")
    with open(log, "w") as f:
        done = subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, timeout=300)
    text = log.read_text()
    assert done.returncode == 0, text[-3000:]
    return text


def _losses(out: Path) -> torch.Tensor:
    rows = list(csv.DictReader((out / "log.csv").open()))
    return torch.tensor([[float(r["loss"]), float(r["val_loss"])] for r in rows], dtype=torch.float64)


@pytest.fixture(scope="module")
def one_process_batch_4(tmp_path_factory) -> torch.Tensor:
    out = tmp_path_factory.mktemp("single") / "single"
    _train(out, batch_size=4)
    return _losses(out)


@pytest.mark.parametrize(
    "mode, extra",
    [
        ("ddp", ()),
        ("fsdp", ()),  # the 4 blocks in one unit (--fsdp-unit 4), no resharding
        ("fsdp", ("--fsdp-unit", "3", "--fsdp-reshard", "yes", "--fsdp-prefetch", "1")),  # units of 3 and 1
    ],
    ids=["ddp", "fsdp", "fsdp-units-reshard-prefetch"],
)
def test_train_script_under_torchrun(tmp_path, mode, extra, one_process_batch_4):
    """torchrun --nproc-per-node 2 -m bench.train --distributed MODE --batch-size 2: every FFN sparse,
    rank 0 writes, and the train and validation losses equal one process at --batch-size 4 (the two
    ranks split the same global batches), whatever FSDP2's units, resharding and prefetching."""
    out = tmp_path / mode
    text = _train(out, batch_size=2, mode=mode, extra=extra)
    summary = (out / "summary.txt").read_text()
    assert "per rank x 2 ranks" in summary and " 0 dense " in summary and "sparse FFN site(s)" in summary
    if mode == "fsdp":  # the settings the run used, as the summary states them (CPU: float32 blocks)
        units = ("True, prefetch=1, 3 block(s)" if extra else "False, prefetch=implicit, 4 block(s)") + " per unit"
        assert f"FSDP2 reshard_after_forward={units}, block params float32" in summary
    assert text.count("wrote ") == 1  # rank 0 only
    rows = (out / "log.csv").read_text().splitlines()
    assert len(rows) == 1 + 2 and rows[1].startswith("sparse,2,")
    torch.testing.assert_close(_losses(out), one_process_batch_4, rtol=1e-4, atol=0)


def test_recluster_under_torch_distributed_gives_every_rank_the_fit_of_the_summed_profiles(tmp_path):
    """Two gloo ranks, each probing its own batch: recluster() fits on the profiles summed over the
    ranks (cluster_units on the sum, computed here), every rank gets the same permutation; ranks that
    recorded different shapes get a ValueError on every rank, not a hang."""
    from sparse_compile.clustering import cluster_units

    out = tmp_path / "units.json"
    log = tmp_path / "units.log"
    with open(log, "w") as f:
        done = subprocess.run([sys.executable, "-m", "tests.units_worker", free_port(), str(out)], cwd=ROOT,
                              stdout=f, stderr=subprocess.STDOUT, timeout=300)  # fmt: skip
    assert done.returncode == 0, log.read_text()[-3000:]
    r0, r1 = json.loads(out.read_text())
    assert r0["sites"] == r1["sites"] == ["blocks.0", "blocks.1"]
    for name in r0["sites"]:
        p0, p1 = torch.tensor(r0["profiles"][name]), torch.tensor(r1["profiles"][name])
        assert not torch.equal(p0, p1)  # the ranks saw different batches
        want = cluster_units(p0 + p1, 8)
        assert r0["perms"][name] == r1["perms"][name] == want.tolist(), name
    alone = [cluster_units(torch.tensor(r["profiles"][n]), 8) for r in (r0, r1) for n in r0["sites"]]
    # alone, the ranks would have fitted different permutations
    assert any(not torch.equal(a, b) for a, b in zip(alone[:2], alone[2:], strict=True))
    assert "ranks recorded different sites or profile shapes" in r0["error"] and r0["error"] == r1["error"]


ROUTED_REFIT = """
import json, os, sys, torch, torch.distributed as dist
import sparse_compile
from sparse_compile.ops import routes

def run(rank, port, router, what, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.manual_seed(0)  # the same weights on both ranks
    net = torch.nn.Sequential(torch.nn.Linear(32, 256), torch.nn.ReLU(), torch.nn.Linear(256, 32))

    class FFN(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.up, self.down = net[0], net[2]

        def forward(self, x):
            return self.down(torch.relu(self.up(x)).square())

    model = FFN()
    options = {"activations": "16:4:16", "chunk": 4, "routes": 4, "router": router}
    compiled = torch.compile(model, backend="sparse", options=options)
    x = torch.randn(2, 48, 32, generator=torch.Generator().manual_seed(100 + rank))  # each rank its own batch
    compiled(x)
    with sparse_compile.probe_units(), torch.no_grad():
        compiled(x)
    sparse_compile.recluster()
    (s,) = routes._sites.values()
    first = {k: getattr(s, k).tolist() for k in ("perm", "groups", "rep", "lin")}
    if what == "router":  # then a router-only refit on another batch per rank
        x2 = torch.randn(2, 48, 32, generator=torch.Generator().manual_seed(200 + rank)) * 2
        with sparse_compile.probe_units(), torch.no_grad():
            compiled(x2)
        sparse_compile.recluster(routes="router")
    state = {k: getattr(s, k).tolist() for k in ("perm", "groups", "rep", "lin")}
    state["first"] = first
    json.dump(state, open(f"{out}.{rank}", "w"))
    dist.destroy_process_group()

run(int(sys.argv[1]), *sys.argv[2:6])
"""


@pytest.mark.parametrize("router, what", [("weighted", "all"), ("linear", "all"), ("weighted", "router")])
def test_routed_refit_under_torch_distributed_gives_every_rank_the_first_ranks_router(tmp_path, router, what):
    """Two gloo ranks, each probing its own batch: recluster() sends the first rank's permutation, groups,
    representatives and fitted router to both; a router-only refit after it (each rank another batch) keeps
    the first fit's permutation and groups and sends the first rank's new router to both."""
    out, port = tmp_path / "state", free_port()
    cmd = [sys.executable, "-c", ROUTED_REFIT]
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT, "text": True}
    ranks = [subprocess.Popen([*cmd, str(rank), port, router, what, str(out)], cwd=ROOT, **pipes) for rank in (0, 1)]
    for p in ranks:
        text, _ = p.communicate(timeout=300)
        assert p.returncode == 0, text[-3000:]
    r0, r1 = (json.loads(Path(f"{out}.{rank}").read_text()) for rank in (0, 1))
    assert r0 == r1
    assert torch.tensor(r0["lin"])[:, -1].abs().sum() > 0  # fitted: an unfitted router's biases are 0
    if what == "router":
        first = r0["first"]
        assert (r0["perm"], r0["groups"]) == (first["perm"], first["groups"]) and r0["lin"] != first["lin"]


FSDP_DTYPES = """
import os, sys, torch, torch.distributed as dist
from bench import distributed
from bench.model import GPT, GPTConfig
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1])
dist.init_process_group("gloo", rank=0, world_size=1)
torch.manual_seed(0)
model = GPT(GPTConfig(block_size=32, n_layer=5, n_head=2, n_embd=64))
options = distributed.FSDPOptions(unit=2, param_dtype=sys.argv[2])
distributed.wrap(model, distributed.Dist("fsdp", 0, 1, 0), options)
seen = {}
def light(i, b):
    def forward(x):  # the parameters FSDP hands the block's forward, in a cheap function of x
        seen[i] = sorted({str(p.dtype).removeprefix("torch.") for p in b.parameters()})
        return x + 0.0 * sum(p.float().sum() for p in b.parameters())
    return forward
for i, b in enumerate(model.blocks):
    b.forward = light(i, b)
before = type(model.blocks[0].ln_1.weight).__name__
model(torch.randint(0, 256, (2, 32)))
after = type(model.blocks[0].ln_1.weight).__name__
print(seen, str(model.wte.weight.dtype).removeprefix("torch."), before, after)
dist.destroy_process_group()
"""


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_fsdp_param_dtype_reaches_the_blocks_not_the_root(dtype):
    """FSDPOptions(param_dtype=...): inside their forward every block's parameters are that dtype
    (FSDP2's MixedPrecisionPolicy on the units), the embedding stays float32; before the forward the
    blocks hold their shards (DTensors), after it the gathered parameters (no resharding by default)."""
    cmd = [sys.executable, "-c", FSDP_DTYPES, free_port(), dtype]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    blocks = {i: [dtype] for i in range(5)}
    assert done.stdout.strip().splitlines()[-1] == f"{blocks} float32 DTensor Parameter"
