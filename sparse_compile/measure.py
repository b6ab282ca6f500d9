"""Timing and error for the compile-time kernel choices (f1_choice.py, gather_choice.py)."""

from collections.abc import Callable

import torch


def back_to_back_ms(fn: Callable[[], object], reps: int = 25) -> float:
    """Mean time of ``reps`` back-to-back calls (CUDA events around all of them, after 3 warm-up
    calls): the GPU queue stays full, as in a training step, so host-side setup per call overlaps
    the previous call's work instead of being added to it (cuSPARSELt's ~0.4 ms per call would
    otherwise count in full: bench/RESULTS.md 4j)."""
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / reps


def max_rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    """max |got - want| / max |want|, in float32: the error relative to the output's scale."""
    return ((got.float() - want.float()).abs().max() / want.float().abs().max().clamp_min(1e-30)).item()
