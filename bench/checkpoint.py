"""Checkpoint and resume for bench.train: a long run split over several calls gives the numbers of
one uninterrupted run.

One file, OUT/checkpoint.pt, rewritten every --save-every steps and when --stop-at stops a run.
It holds every run already finished (its logged rows and timings) and the state of the run in
progress after its last completed step:
- the model's state_dict (the plain dense one: the backend keeps no parameters or masks; the
  2:4 weight masks and activation patterns are recomputed from the weights at every step) and the
  optimizer's;
- the step, the batch sampler's generator state (the data position) and the global RNG states;
- the loss / time accumulators since the last logged row and the health probe's last weight masks;
- the backend's hidden-unit permutations (sparse_compile.unit_permutations(), with --recluster-every).
The learning-rate schedule and the phase schedule are functions of the step, so they need nothing.
"""

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

FILE = "checkpoint.pt"


@dataclass
class RunState:
    """Where one training run stands after ``step`` completed steps."""

    name: str
    step: int
    model: dict
    optimizer: dict
    batches: torch.Tensor
    rng: dict
    result: dict  # RunResult fields
    interval: dict  # losses, time and tokens since the last logged row
    health: list | None  # the probe's last weight masks (flip rate), or None before the first probe
    units: dict | None = None  # sparse_compile.unit_permutations() (hidden-unit permutations by site)
    routes: dict | None = None  # sparse_compile.route_state() (routed sites' groups and routers)


@dataclass
class Checkpoint:
    finished: dict[str, dict] = field(default_factory=dict)  # run name -> RunResult fields
    current: RunState | None = None
    args: dict[str, Any] = field(default_factory=dict)  # the arguments that must match on resume


def rng_state() -> dict:
    state = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["cpu"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save(out: Path, ckpt: Checkpoint) -> None:
    """Write OUT/checkpoint.pt atomically (a partial file never replaces a good one)."""
    tmp = out / (FILE + ".tmp")
    torch.save(ckpt, tmp)
    tmp.replace(out / FILE)


def load(folder: str | Path, args: dict[str, Any], absent: dict[str, Any] | None = None) -> Checkpoint:
    """The checkpoint in ``folder``; raises ValueError if it is missing or was written with other
    training arguments (``args``: name -> value, e.g. steps, seed, size, sparsity). ``absent``: the
    value of an argument that a checkpoint does not hold (one written before the argument existed)."""
    path = Path(folder) / FILE
    if not path.is_file():
        raise ValueError(f"--resume {folder}: no {FILE} there (write one with --save-every or --stop-at)")
    ckpt = torch.load(path, weights_only=False)
    absent = absent or {}
    saved = {k: ckpt.args.get(k, absent.get(k)) for k in args}
    changed = {k: (saved[k], v) for k, v in args.items() if saved[k] != v}
    if changed:
        raise ValueError(f"--resume {folder}: the checkpoint was written with other arguments (saved, now): {changed}")
    return ckpt
