"""One rank of the 2-process DDP / FSDP2 check (gloo, CPU): trains 10 steps, writes its losses and report."""

import json
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import sparse_compile
from bench.model import GPT, GPTConfig

CFG = GPTConfig(block_size=64, n_layer=2, n_head=2, n_embd=256)
# venom: its V=64 token blocks coincide with the sequences, so each rank's masks are one process's
OPTIONS = {"preset": "venom"}
GLOBAL_BATCH, SEQ, STEPS = 4, 64, 10


def batches(steps: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(123)
    return [torch.randint(0, 256, (GLOBAL_BATCH, SEQ + 1), generator=g) for _ in range(steps)]


# dense warm-up, sparse, dense recovery: flipped on every rank at the same step
PHASES = ["dense"] * 2 + ["sparse"] * 6 + ["dense"] * 2


def train(model: torch.nn.Module, compiled, rank: int, world: int, graphs: list[int] | None = None) -> list[float]:
    """Train STEPS steps through PHASES; ``graphs`` collects Dynamo's graph count after each step."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    per_rank = GLOBAL_BATCH // world
    for idx, phase in zip(batches(STEPS), PHASES, strict=True):
        sparse_compile.set_phase(phase)
        idx = idx[rank * per_rank : (rank + 1) * per_rank]
        _, loss = compiled(idx[:, :-1], idx[:, 1:])
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.detach())
        if graphs is not None:
            graphs.append(torch._dynamo.utils.counters["stats"]["unique_graphs"])
    sparse_compile.set_phase("sparse")
    return losses


def main(
    rank: int, world: int, port: str, out: str, mode: str, optimize_ddp: bool, bucket_mb: float, options: dict
) -> None:
    global OPTIONS
    OPTIONS = options
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch._dynamo.config.optimize_ddp = optimize_ddp
    torch.manual_seed(0)
    model = GPT(CFG)
    if mode == "fsdp":  # FSDP2: one unit per block and the root; compile the sharded model
        from torch.distributed.fsdp import fully_shard

        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
        compiled = torch.compile(model, backend="sparse", options=OPTIONS)
    elif mode == "ddp-inner":  # DDP around the compiled model: DDP's hooks stay outside the graph
        inner = torch.compile(model, backend="sparse", options=OPTIONS)
        compiled = DistributedDataParallel(inner, bucket_cap_mb=bucket_mb)
    else:
        ddp = DistributedDataParallel(model, bucket_cap_mb=bucket_mb)
        compiled = torch.compile(ddp, backend="sparse", options=OPTIONS)
    graphs: list[int] = []
    losses = train(model, compiled, rank, world, graphs)
    every_rank: list = [None] * world
    dist.all_gather_object(every_rank, graphs)
    mean = [loss.clone() for loss in losses]
    for m in mean:  # the global-batch loss: mean over ranks
        dist.all_reduce(m)
    if rank == 0:
        reports = sparse_compile.compile_reports()
        record = {
            "losses": [m.item() / world for m in mean],
            "sparse": sum(len(r.sparse_sites) for r in reports),
            "modules": [s.record.module for r in reports for s in r.sparse_sites],
            "graphs_per_rank": every_rank,
            "dense_reasons": [s.record.reason for r in reports for s in r.dense_sites],
        }
        with open(out, "w") as f:
            json.dump(record, f)
    dist.barrier()
    # Both ranks are past their last collective. gloo's teardown can hang a rank whose peer has
    # already exited (seen here), so leave without it.
    os._exit(0)


if __name__ == "__main__":
    port, out, mode, optimize_ddp, bucket_mb = sys.argv[1:3] + [sys.argv[3], sys.argv[4] == "1", float(sys.argv[5])]
    options = json.loads(sys.argv[6]) if len(sys.argv) > 6 else OPTIONS
    torch.multiprocessing.spawn(main, args=(2, port, out, mode, optimize_ddp, bucket_mb, options), nprocs=2)
