"""Timing and error for the compile-time kernel choices (f1_choice.py, gather_choice.py, act24_choice.py),
and the cuSPARSELt algorithm sweep that f1_choice and act24_choice share (fastest_cslt_alg)."""

from collections.abc import Callable

import torch

MAX_ALGS = 32  # an upper bound on cuSPARSELt's algorithm ids; the search stops at the first refused
SLOW, SLOW_FLOOR_MS = 4.0, 10.0  # see too_slow


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


def too_slow(call, dense_ms: float) -> bool:
    """One call of a cuSPARSELt algorithm over max(4x cuBLAS, 10 ms): not worth timing 28 calls (some
    algorithms are pathologically slow; the 10 ms floor keeps a small GEMM, whose single call is
    dominated by cuSPARSELt's per-call host setup that back-to-back timing hides, in the search)."""
    return one_call_ms(call) > max(SLOW * dense_ms, SLOW_FLOOR_MS)


def none_usable(wrong: int, slow: int) -> str:
    return f"no cuSPARSELt algorithm both right and fast enough to time ({wrong} wrong, {slow} over 4x cuBLAS)"


def fastest_cslt_alg(
    product: Callable[[int], torch.Tensor], timed: Callable[[int], object], want: torch.Tensor, dense_ms: float
) -> tuple[int | None, str]:
    """The sweep of every cuSPARSELt algorithm id, in order until cuSPARSELt refuses one: an id whose
    ``product(alg)`` differs from ``want`` (cuBLAS, every row: an algorithm may go wrong in some row
    blocks only) is wrong, one whose ``timed(alg)`` is too_slow against ``dense_ms`` is skipped, and
    the rest are timed back to back. -> (the fastest id, "") or (None, why none is usable)."""
    best: tuple[float, int] | None = None
    wrong = slow = 0
    for alg in range(MAX_ALGS):
        try:
            got = product(alg)
        except RuntimeError:
            break
        if got.shape != want.shape or max_rel_err(got, want) > 2e-2:  # bf16 rounding: ~4e-3
            wrong += 1
            continue
        call = lambda a=alg: timed(a)  # noqa: E731
        if too_slow(call, dense_ms):
            slow += 1
            continue
        ms = back_to_back_ms(call)
        if best is None or ms < best[0]:
            best = (ms, alg)
    return (None, none_usable(wrong, slow)) if best is None else (best[1], "")
