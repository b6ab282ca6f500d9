"""--distributed for bench.train: the process group from torchrun's environment, the model wrapping
(DDP or FSDP2), and the few reductions the logs need. One process per GPU (or CPU process, gloo).

DDP runs with torch._dynamo.config.optimize_ddp = False in both arms, so no bucket boundary cuts an
FFN chain (README, "Distributed"). FSDP2 is set up as PyTorch documents it for compiled training:
each transformer block compiled on its own (``Module.compile``: one graph per block), then
``fully_shard`` per unit of blocks and on the root, so FSDP's all-gather / reduce-scatter hooks run
between the block graphs and can prefetch and overlap; the embedding, final norm and head run
eagerly.
``FSDPOptions`` (--fsdp-unit, --fsdp-reshard, --fsdp-prefetch, --fsdp-param-dtype) sets the blocks
per unit, the units' reshard_after_forward, an explicit prefetch depth and the blocks' all-gathered
dtype; its defaults are the fastest settings measured (bench.e2e --distributed fsdp with each flag).
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
    """How FSDP2 shards the blocks.

    ``reshard_after_forward``: free each unit's all-gathered parameters after its forward (all-gathered
    again for its backward); False keeps them until the backward: one all-gather per unit per step,
    the memory of the unsharded blocks held through the step. ``prefetch``: 0 leaves FSDP2's
    implicit prefetching (a unit's all-gather issued when the host reaches it); N > 0 issues the
    all-gathers of the next N units in forward and of the previous N in backward. ``unit``: blocks
    per FSDP unit (one all-gather and one reduce-scatter per unit, so fewer hooks for the host to
    run). ``param_dtype``: the blocks' all-gathered parameters: 'float32', or 'bfloat16'
    (MixedPrecisionPolicy, gradients reduced in float32, the blocks' inputs not cast), which halves
    the bytes and under bf16 autocast gives the matmuls the same bf16 weights autocast would (the
    norms' weights become bf16-rounded); 'auto': bfloat16 on CUDA, float32 on CPU (no autocast).
    The embedding, final norm and head (the root unit) stay float32."""

    reshard_after_forward: bool = False
    prefetch: int = 0
    unit: int = 4
    param_dtype: str = "auto"

    def __post_init__(self) -> None:
        if self.prefetch < 0:
            raise ValueError(f"FSDP prefetch {self.prefetch}: expected an int >= 0")
        if self.unit < 1:
            raise ValueError(f"FSDP unit {self.unit}: expected blocks per unit >= 1")
        if self.param_dtype not in PARAM_DTYPES:
            raise ValueError(f"FSDP param_dtype {self.param_dtype!r}: expected one of {PARAM_DTYPES}")

    def dtype(self, device_type: str) -> str:
        """The blocks' parameter dtype on ``device_type`` ('auto' resolved)."""
        if self.param_dtype != "auto":
            return self.param_dtype
        return "bfloat16" if device_type == "cuda" else "float32"

    def describe(self, device_type: str) -> str:
        return (
            f"reshard_after_forward={self.reshard_after_forward}, prefetch={self.prefetch or 'implicit'}, "
            f"{self.unit} block(s) per unit, block params {self.dtype(device_type)}"
        )


PARAM_DTYPES = ("auto", "float32", "bfloat16")


def add_fsdp_args(p: argparse.ArgumentParser) -> None:
    """--fsdp-reshard, --fsdp-prefetch, --fsdp-unit, --fsdp-param-dtype (with --distributed fsdp)."""
    p.add_argument(
        "--fsdp-reshard", choices=("yes", "no"), default="no",
        help="FSDP2 units' reshard_after_forward (yes: free the gathered parameters after the forward, "
        "all-gather them again for the backward)",
    )  # fmt: skip
    p.add_argument(
        "--fsdp-prefetch", type=int, default=0,
        help="FSDP2: all-gather the next N units ahead in forward and backward (0: FSDP2's implicit prefetch)",
    )  # fmt: skip
    p.add_argument("--fsdp-unit", type=int, default=4, help="FSDP2: transformer blocks per FSDP unit")
    p.add_argument(
        "--fsdp-param-dtype", choices=PARAM_DTYPES, default="auto",
        help="FSDP2: dtype of the blocks' all-gathered parameters (bfloat16: MixedPrecisionPolicy, float32 "
        "reduction; auto: bfloat16 on CUDA, float32 on CPU)",
    )  # fmt: skip


def fsdp_options(args: argparse.Namespace, p: argparse.ArgumentParser) -> FSDPOptions:
    """FSDPOptions from add_fsdp_args' flags; a bad value is the parser's error."""
    flags = ("fsdp_reshard", "fsdp_prefetch", "fsdp_unit", "fsdp_param_dtype")
    if args.distributed != "fsdp" and any(getattr(args, f) != p.get_default(f) for f in flags):
        p.error(f"--fsdp-* flags apply with --distributed fsdp, not --distributed {args.distributed}")
    if args.fsdp_param_dtype == "bfloat16" and args.device == "cpu":
        p.error("--fsdp-param-dtype bfloat16 needs --device cuda (bf16 autocast); the CPU runs float32")
    try:
        return FSDPOptions(args.fsdp_reshard == "yes", args.fsdp_prefetch, args.fsdp_unit, args.fsdp_param_dtype)
    except ValueError as e:
        p.error(f"--fsdp-prefetch {args.fsdp_prefetch}, --fsdp-unit {args.fsdp_unit}: {e}")
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
    """DDP(model), or ``model`` itself after fully_shard per unit of ``fsdp.unit`` blocks and on the
    root (FSDP2)."""
    if d.mode == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        torch._dynamo.config.optimize_ddp = False
        on_gpu = next(model.parameters()).is_cuda
        return DistributedDataParallel(model, device_ids=[d.local_rank] if on_gpu else None)
    if d.mode == "fsdp":
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        fsdp = fsdp or FSDPOptions()
        mp = MixedPrecisionPolicy()
        if fsdp.dtype(next(model.parameters()).device.type) == "bfloat16":
            mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32, cast_forward_inputs=False)
        blocks = list(model.blocks)
        units = [blocks[i : i + fsdp.unit] for i in range(0, len(blocks), fsdp.unit)]
        for unit in units:
            module = unit if len(unit) > 1 else unit[0]
            fully_shard(module, reshard_after_forward=fsdp.reshard_after_forward, mp_policy=mp)
        fully_shard(model)
        if fsdp.prefetch:
            first = [unit[0] for unit in units]
            for i, m in enumerate(first):
                m.set_modules_to_forward_prefetch(first[i + 1 : i + 1 + fsdp.prefetch])
                m.set_modules_to_backward_prefetch(first[max(0, i - fsdp.prefetch) : i][::-1])
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
