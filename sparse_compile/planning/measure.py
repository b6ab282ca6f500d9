"""Timing and error for the compile-time kernel choices (f1_choice.py, gather_choice.py, act24_choice.py)."""

from collections.abc import Callable

import torch


def back_to_back_ms(fn: Callable[[], object], reps: int = 25) -> float:
    """Mean time of ``reps`` back-to-back calls (CUDA events around all of them, after 3 warm-up
    calls): the GPU queue stays full, as in a training step, so host-side setup per call overlaps
    the previous call's work instead of being added to it (cuSPARSELt's per-call host setup would
    otherwise count in full)."""
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / reps


def interleaved_ratio(baseline: Callable[[], object], candidate: Callable[[], object], rounds: int = 2) -> float:
    """baseline time / candidate time, each the best of ``rounds`` back_to_back_ms, interleaved: a
    single round right after a Triton kernel's autotuning can misread it by a large factor."""
    times = [(back_to_back_ms(baseline), back_to_back_ms(candidate)) for _ in range(rounds)]
    return min(b for b, _ in times) / min(c for _, c in times)


def one_call_ms(fn: Callable[[], object]) -> float:
    """Time of one call after one warm-up call, synchronized: screens out a pathologically slow
    cuSPARSELt algorithm before back_to_back_ms queues 28 calls of it."""
    fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def max_rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    """max |got - want| / max |want|, in float32: the error relative to the output's scale."""
    return ((got.float() - want.float()).abs().max() / want.float().abs().max().clamp_min(1e-30)).item()
