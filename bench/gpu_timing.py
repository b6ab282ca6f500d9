"""Measurements the kernel benchmarks share: the preamble with the copy-rate ceiling, and the tiling sweep."""

import argparse
from collections.abc import Callable, Iterable

import torch
import triton.testing

from bench.env import environment


def copy_gbps() -> float:
    """Device-to-device copy rate of a 1 GiB buffer, GB/s counting bytes read + written."""
    src = torch.empty(1 << 29, dtype=torch.float16, device="cuda").normal_()
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(lambda: dst.copy_(src), warmup=25, rep=200, return_mode="median")
    return 2 * src.numel() * 2 / ms / 1e6


def start_gpu_bench(p: argparse.ArgumentParser, program: str, argv: list[str] | None) -> tuple[dict, float]:
    """A kernel benchmark's preamble: refuse without a GPU, print where the numbers come from, and
    measure the copy ceiling. Returns (environment, copy GB/s)."""
    if not torch.cuda.is_available():
        p.error("needs a CUDA GPU")
    env = environment(torch.device("cuda"), program, argv)
    print("\n".join(f"{k}: {v}" for k, v in env.items()), flush=True)
    copy = copy_gbps()
    print(f"measured copy: {copy:.0f} GB/s (read + write)", flush=True)
    return env, copy


def sweep_tilings(
    run: Callable[..., object],
    configs: Iterable[dict],
    exact: Callable[[object], bool],
    nbytes: float,
    ceiling: float,
    **labels: object,
) -> list[dict]:
    """For each config (keyword arguments of ``run``): whether ``exact(run(**config))``, the do_bench
    median ms, and the fraction of ``ceiling`` GB/s that moving ``nbytes`` at that time is. Rows
    carry ``labels`` and the config; fastest first."""
    out = []
    for cfg in configs:
        ok = exact(run(**cfg))
        ms = triton.testing.do_bench(lambda c=cfg: run(**c), return_mode="median")
        out.append({**labels, **cfg, "exact": ok, "ms": ms, "of copy": nbytes / ms / 1e6 / ceiling})
    return sorted(out, key=lambda r: r["ms"])
