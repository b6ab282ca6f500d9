"""The training phase the compiled graphs run: 'sparse' or 'dense'.

The backend compiles both variants of every graph that has an FFN site and reads this
flag on every call, outside anything Dynamo traces: flipping it never recompiles.
"""

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

PHASES = ("sparse", "dense")
# The default recipe, under any learning-rate schedule: dense for the first 10% and the last 40% of the
# steps, half the run sparse. Chosen by the wall time to the dense run's loss (bench/RESULTS.md, 6c): a
# quarter sparse ends closer at equal steps but gains less; 80%-90% sparse end further behind at equal
# steps. Projected at the 1.3B config's step speedup, 80%-95% reached the dense loss sooner than half in
# short runs (1.21B over 3200 steps, 0.04 tokens per parameter; 126M over 1200, 0.16), not in longer ones
# (126M over 2400: level) or at 353M (2000 steps, 80% only: level); the longer the run, the less a sparse
# step is worth.
WARMUP_FRAC = 0.1
FINAL_DENSE_FRAC = 0.4
# PhaseSchedule.until_lr_decay's recipe for a warm-up-stable-decay lr (constant peak, then a final decay):
# dense for the first 5%, sparse at the peak, dense through the decay. Not the default: at the best peak lr
# tried for the dense run it ends further behind than the default at equal steps; run longer, it reaches the
# dense run's loss sooner than the default (projected at the 1.3B config's step speedup) in short runs
# (1.21B over 3200 steps, 126M over 1200), not in longer ones (126M over 2400) or at 353M (bench/RESULTS.md,
# 6c).
# LR_DECAY_FRAC: the decay measured.
LR_DECAY_WARMUP_FRAC = 0.05
LR_DECAY_FRAC = 0.15
_current = "sparse"


def phase() -> str:
    """The phase compiled models run now: 'sparse' or 'dense'."""
    return _current


def set_phase(name: str) -> None:
    """Switch every model compiled with backend='sparse' to ``name`` ('sparse' or 'dense')."""
    global _current
    if name not in PHASES:
        raise ValueError(f"set_phase({name!r}): expected one of {PHASES}")
    _current = name


@contextlib.contextmanager
def dense_phase() -> Iterator[None]:
    """Run the plain dense graphs inside the block; restore the previous phase after it."""
    previous = _current
    set_phase("dense")
    try:
        yield
    finally:
        set_phase(previous)


@dataclass(frozen=True)
class PhaseSchedule:
    """Step-based phases: dense for steps < dense_warmup_steps, sparse until dense_from_step, dense after.
    With ``dense_every`` = k > 1, every k-th step of the sparse window runs dense as well (steps
    dense_warmup_steps + k - 1, + 2k - 1, ...): the weights keep seeing the dense function.

    ``schedule.step(i)`` sets and returns the phase of step i; call it once per training step.
    """

    dense_warmup_steps: int = 0
    dense_from_step: int | None = None
    dense_every: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.dense_warmup_steps, int) or self.dense_warmup_steps < 0:
            raise ValueError(f"PhaseSchedule.dense_warmup_steps={self.dense_warmup_steps!r}: expected an int >= 0")
        if not isinstance(self.dense_every, int) or self.dense_every < 0 or self.dense_every == 1:
            raise ValueError(
                f"PhaseSchedule.dense_every={self.dense_every!r}: expected 0 (never) or an int >= 2 "
                "(1 would make every step dense)"
            )
        end = self.dense_from_step
        if end is not None and (not isinstance(end, int) or end < self.dense_warmup_steps):
            raise ValueError(
                f"PhaseSchedule.dense_from_step={end!r}: expected None or an int >= dense_warmup_steps "
                f"({self.dense_warmup_steps})"
            )

    @classmethod
    def from_fractions(
        cls,
        total_steps: int,
        warmup: float = WARMUP_FRAC,
        final_dense: float = FINAL_DENSE_FRAC,
        dense_every: int = 0,
    ) -> "PhaseSchedule":
        """Dense for the first ``warmup`` and the last ``final_dense`` fractions of ``total_steps``
        (and every ``dense_every``-th step between). The defaults (10% / 40%: half the steps sparse) are
        the default pattern's recipe under any lr schedule (measured under cosine and warm-up-stable-decay)."""
        for name, frac in (("warmup", warmup), ("final_dense", final_dense)):
            if not 0.0 <= frac <= 1.0:
                raise ValueError(f"PhaseSchedule.from_fractions: {name}={frac!r}: expected a fraction in [0, 1]")
        if warmup + final_dense > 1.0:
            raise ValueError(f"PhaseSchedule.from_fractions: warmup + final_dense = {warmup + final_dense} > 1")
        start = round(total_steps * warmup)
        return cls(start, max(start, total_steps - round(total_steps * final_dense)), dense_every)

    @classmethod
    def until_lr_decay(
        cls,
        total_steps: int,
        decay_steps: int,
        warmup: float = LR_DECAY_WARMUP_FRAC,
        dense_every: int = 0,
    ) -> "PhaseSchedule":
        """For a warm-up-stable-decay learning rate whose last ``decay_steps`` of ``total_steps`` decay
        it: dense for the first ``warmup`` fraction, sparse from there until the decay starts, dense
        through the decay (with a 15% decay: 80% of the steps sparse). An opt-in, not the default: at
        equal steps it ends further behind the dense run than ``from_fractions``; given more steps it
        reached the dense run's loss sooner than the default (projected at the 1.3B config's step speedup)
        in short runs (a 1.21B model over 3200 steps, a 126M one over 1200), not in longer ones (126M over
        2400) or at 353M (bench/RESULTS.md, 6c).
        Not for cosine, whose lr falls from the warm-up on."""
        if not isinstance(total_steps, int) or total_steps < 1:
            raise ValueError(f"PhaseSchedule.until_lr_decay: total_steps={total_steps!r}: expected an int >= 1")
        if not isinstance(decay_steps, int) or not 0 < decay_steps <= total_steps:
            raise ValueError(
                f"PhaseSchedule.until_lr_decay: decay_steps={decay_steps!r}: expected an int in [1, total_steps "
                f"= {total_steps}] (the steps of the lr's final decay)"
            )
        if not 0.0 <= warmup <= 1.0:
            raise ValueError(f"PhaseSchedule.until_lr_decay: warmup={warmup!r}: expected a fraction in [0, 1]")
        start, end = round(total_steps * warmup), total_steps - decay_steps
        if start > end:
            raise ValueError(
                f"PhaseSchedule.until_lr_decay: the dense warm-up ({start} steps, warmup={warmup}) runs past the "
                f"decay's start (step {end} of {total_steps}): expected warmup <= {end / total_steps:g}"
            )
        return cls(start, end, dense_every)

    def phase_at(self, step: int) -> str:
        if not self.in_sparse_window(step):
            return "dense"
        if self.dense_every and (step - self.dense_warmup_steps) % self.dense_every == self.dense_every - 1:
            return "dense"
        return "sparse"

    def in_sparse_window(self, step: int) -> bool:
        """Whether step lies between the dense warm-up and the dense recovery (dense_every's dense
        steps included)."""
        return step >= self.dense_warmup_steps and (self.dense_from_step is None or step < self.dense_from_step)

    def step(self, step: int) -> str:
        name = self.phase_at(step)
        set_phase(name)
        return name
