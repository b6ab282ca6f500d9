"""--distributed for bench.train: the process group from torchrun's environment, the model wrapping
(DDP or FSDP2), and the few reductions the logs need. One process per GPU (or CPU process, gloo).

DDP runs with torch._dynamo.config.optimize_ddp = False in both arms, so no bucket boundary cuts an
FFN chain (README, "Distributed"). FSDP2 is set up as PyTorch documents it for compiled training:
each transformer block compiled on its own (``Module.compile``: one graph per block), then
``fully_shard`` per block and on the root, so FSDP's all-gather / reduce-scatter hooks run between
the block graphs and can prefetch and overlap; the embedding, final norm and head run eagerly.
"""

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn

MODES = ("none", "ddp", "fsdp")


@dataclass(frozen=True)
class Dist:
    mode: str = "none"
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        return self.rank == 0


def setup(mode: str, device_type: str) -> Dist:
    """Join the process group torchrun describes (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT)."""
    if mode == "none":
        return Dist()
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        raise SystemExit(f"--distributed {mode} needs torchrun: torchrun --nproc-per-node N -m bench.train ...")
    dist.init_process_group("nccl" if device_type == "cuda" else "gloo")
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if device_type == "cuda":
        torch.cuda.set_device(local)
    return Dist(mode, dist.get_rank(), dist.get_world_size(), local)


def compile_model(model: nn.Module, d: Dist, **compile_kwargs) -> nn.Module:
    """``model`` ready to train: torch.compile(model, **compile_kwargs), of DDP(model) under DDP; under
    FSDP2 each block compiled in place, then sharded (the returned model is ``model`` itself)."""
    if d.mode == "fsdp":
        for block in model.blocks:
            block.compile(**compile_kwargs)
        return wrap(model, d)
    return torch.compile(wrap(model, d), **compile_kwargs)


def wrap(model: nn.Module, d: Dist) -> nn.Module:
    """DDP(model), or ``model`` itself after fully_shard per block and on the root (FSDP2)."""
    if d.mode == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        torch._dynamo.config.optimize_ddp = False
        on_gpu = next(model.parameters()).is_cuda
        return DistributedDataParallel(model, device_ids=[d.local_rank] if on_gpu else None)
    if d.mode == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
    return model


def mean(value: float, d: Dist, device: torch.device) -> float:
    """The mean of ``value`` over ranks (every rank must call it)."""
    if d.world == 1:
        return value
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return t.item() / d.world


def full(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor of an FSDP2 shard (a collective: every rank must call it), else ``t``."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def teardown(d: Dist) -> None:
    if d.world > 1 or dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
