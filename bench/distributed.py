"""--distributed for bench.train: the process group from torchrun's environment, the model wrapping
(DDP or FSDP2), and the few reductions the logs need. One process per GPU (or CPU process, gloo).

DDP runs with torch._dynamo.config.optimize_ddp = False in both arms, so no bucket boundary cuts an
FFN chain (README, "Distributed"). FSDP2 is set up as PyTorch documents it for compiled training:
each transformer block compiled on its own (``Module.compile``: one graph per block), then
``fully_shard`` per block and on the root, so FSDP's all-gather / reduce-scatter hooks run between
the block graphs and can prefetch and overlap; the embedding, final norm and head run eagerly.
``FSDPOptions`` (--fsdp-reshard, --fsdp-prefetch, --fsdp-param-dtype) sets the blocks'
reshard_after_forward, an explicit prefetch depth and the all-gathered parameters' dtype.
"""

import argparse
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


@dataclass(frozen=True)
class FSDPOptions:
    """How FSDP2 shards the blocks. ``reshard_after_forward``: free each block's all-gathered
    parameters after its forward (all-gathered again for its backward; False keeps them, one
    all-gather per step at the memory of unsharded blocks). ``prefetch``: 0 leaves FSDP2's implicit
    prefetching (the next block's all-gather issued when the host reaches it); N > 0 issues the
    all-gathers of the next N blocks in forward and of the previous N in backward
    (``set_modules_to_forward_prefetch`` / ``set_modules_to_backward_prefetch``). ``param_dtype``:
    'float32' all-gathers the float32 parameters (autocast casts them inside each block's graph);
    'bfloat16' all-gathers bf16 copies (MixedPrecisionPolicy, gradients reduced in float32): half
    the bytes, and the blocks see bf16 weights, norms included."""

    reshard_after_forward: bool = True
    prefetch: int = 0
    param_dtype: str = "float32"

    def __post_init__(self) -> None:
        if self.prefetch < 0:
            raise ValueError(f"FSDP prefetch {self.prefetch}: expected an int >= 0")
        if self.param_dtype not in PARAM_DTYPES:
            raise ValueError(f"FSDP param_dtype {self.param_dtype!r}: expected one of {PARAM_DTYPES}")

    def describe(self) -> str:
        return (
            f"reshard_after_forward={self.reshard_after_forward}, prefetch={self.prefetch or 'implicit'}, "
            f"param_dtype={self.param_dtype}"
        )


PARAM_DTYPES = ("float32", "bfloat16")


def add_fsdp_args(p: argparse.ArgumentParser) -> None:
    """--fsdp-reshard, --fsdp-prefetch, --fsdp-param-dtype (used with --distributed fsdp)."""
    p.add_argument(
        "--fsdp-reshard", choices=("yes", "no"), default="yes",
        help="FSDP2 blocks' reshard_after_forward (no: keep each block's gathered parameters until its backward)",
    )  # fmt: skip
    p.add_argument(
        "--fsdp-prefetch", type=int, default=0,
        help="FSDP2: all-gather the next N blocks ahead in forward and backward (0: FSDP2's implicit prefetch)",
    )  # fmt: skip
    p.add_argument(
        "--fsdp-param-dtype", choices=PARAM_DTYPES, default="float32",
        help="FSDP2: dtype of the all-gathered parameters (bfloat16: MixedPrecisionPolicy, float32 reduction)",
    )  # fmt: skip


def fsdp_options(args: argparse.Namespace, p: argparse.ArgumentParser) -> FSDPOptions:
    """FSDPOptions from add_fsdp_args' flags; a bad value is the parser's error."""
    if args.distributed != "fsdp" and (args.fsdp_reshard, args.fsdp_prefetch, args.fsdp_param_dtype) != (
        "yes", 0, "float32"
    ):  # fmt: skip
        p.error(f"--fsdp-* flags apply with --distributed fsdp, not --distributed {args.distributed}")
    try:
        return FSDPOptions(args.fsdp_reshard == "yes", args.fsdp_prefetch, args.fsdp_param_dtype)
    except ValueError as e:
        p.error(f"--fsdp-prefetch {args.fsdp_prefetch}: {e}")
        raise


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


def compile_model(model: nn.Module, d: Dist, fsdp: FSDPOptions | None = None, **compile_kwargs) -> nn.Module:
    """``model`` ready to train: torch.compile(model, **compile_kwargs), of DDP(model) under DDP; under
    FSDP2 each block compiled in place, then sharded (the returned model is ``model`` itself)."""
    if d.mode == "fsdp":
        for block in model.blocks:
            block.compile(**compile_kwargs)
        return wrap(model, d, fsdp)
    return torch.compile(wrap(model, d), **compile_kwargs)


def wrap(model: nn.Module, d: Dist, fsdp: FSDPOptions | None = None) -> nn.Module:
    """DDP(model), or ``model`` itself after fully_shard per block and on the root (FSDP2)."""
    if d.mode == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        torch._dynamo.config.optimize_ddp = False
        on_gpu = next(model.parameters()).is_cuda
        return DistributedDataParallel(model, device_ids=[d.local_rank] if on_gpu else None)
    if d.mode == "fsdp":
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        fsdp = fsdp or FSDPOptions()
        mp = MixedPrecisionPolicy()
        if fsdp.param_dtype == "bfloat16":
            mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        blocks = list(model.blocks)
        for block in blocks:
            fully_shard(block, reshard_after_forward=fsdp.reshard_after_forward, mp_policy=mp)
        fully_shard(model, mp_policy=mp)
        if fsdp.prefetch:
            for i, block in enumerate(blocks):
                block.set_modules_to_forward_prefetch(blocks[i + 1 : i + 1 + fsdp.prefetch])
                block.set_modules_to_backward_prefetch(blocks[max(0, i - fsdp.prefetch) : i][::-1])
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
