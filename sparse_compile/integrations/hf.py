"""Train with ``backend="sparse"`` under Hugging Face ``transformers.Trainer`` or an ``accelerate`` loop.

Needs transformers (and accelerate, which Trainer runs on); ``import sparse_compile`` never imports
either. Two pieces:

- ``compile_sparse(model, options)`` compiles the model with the sparse backend before ``Trainer``
  (or ``Accelerator.prepare``) gets it. Leave ``TrainingArguments.torch_compile`` and
  ``torch_compile_backend`` unset: accelerate checks the backend name against its own fixed list
  (``accelerate.utils.DynamoBackend``) and rejects "sparse".
- ``PhaseCallback`` drives a ``PhaseSchedule`` from the Trainer's optimizer steps and logs the phase:
  ``Trainer(model=compile_sparse(model), args=args, train_dataset=data, callbacks=[PhaseCallback()])``.

Why the model is compiled in place (``nn.Module.compile``) rather than wrapped by ``torch.compile``:
the wrapper (``OptimizedModule``) has ``forward(*args, **kwargs)``, from which the Trainer's
``remove_unused_columns`` keeps no column ("The batch received was empty"), and it prefixes the
state-dict keys with ``_orig_mod.``. Compiled in place, only ``__call__`` runs the compiled code: the
class, ``forward``'s signature, the state dict, ``save_pretrained`` and checkpoint resume are those of
the plain model, and accelerate, whose own compile stays off, prepares it as a plain module.

Mixed precision (``TrainingArguments(bf16=True)``, ``Accelerator(mixed_precision="bf16")``):
accelerate wraps the model's ``forward`` in autocast; the compiled ``__call__`` looks ``forward`` up
at every call, so the graph holds the autocast region and each FFN site computes in bf16 as under
``torch.autocast`` (its report row says "inputs cast to bfloat16 as autocast does").

An ``accelerate`` loop without Trainer (``tests/test_hf.py`` runs this block as written): compile,
``prepare``, and set each step's phase before its forward.

```python
import torch
import transformers
from accelerate import Accelerator

from sparse_compile import PhaseSchedule, set_phase
from sparse_compile.integrations.hf import compile_sparse

config = transformers.NemotronConfig(  # Nemotron's MLP: up_proj -> relu² -> down_proj
    vocab_size=256, hidden_size=64, intermediate_size=2048, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=4,
)
model = compile_sparse(transformers.NemotronForCausalLM(config))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
data = [{"input_ids": (x := torch.randint(0, 256, (128,))), "labels": x} for _ in range(8)]  # 128-token sequences
accelerator = Accelerator()  # mixed_precision="bf16" on a GPU
model, opt, loader = accelerator.prepare(model, opt, torch.utils.data.DataLoader(data, batch_size=2))
schedule = PhaseSchedule.from_fractions(len(loader), warmup=0.25, final_dense=0.25)  # dense, sparse, sparse, dense
for step, batch in enumerate(loader):
    name = schedule.step(step)  # sets the phase of this step
    loss = model(**batch).loss
    accelerator.backward(loss)
    opt.step()
    opt.zero_grad()
    print(f"step {step} {name} loss {loss.item():.4f}")
set_phase("sparse")  # the phase before the loop
```
"""

from collections.abc import Mapping
from typing import Any

import torch
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from sparse_compile.options import BackendOptions
from sparse_compile.phase import PHASES, PhaseSchedule, phase, set_phase

__all__ = ["PhaseCallback", "compile_sparse"]

# the key PhaseCallback adds to the Trainer's training logs
LOG_KEY = "sparse_phase"


def compile_sparse(
    model: torch.nn.Module,
    options: Mapping[str, Any] | None = None,
    *,
    mode: str | None = None,
    dynamic: bool | None = None,
    fullgraph: bool = False,
) -> torch.nn.Module:
    """Compile ``model`` in place with ``backend="sparse"`` and return it (the same object).

    ``model.compile(backend="sparse", options=options, ...)``: calls of the model run the compiled
    graphs; its class, ``forward`` signature and state dict stay the plain model's, so Trainer's
    ``remove_unused_columns``, ``save_pretrained`` and checkpoint resume work as without compiling.
    ``options``: the backend's options (README, "Options"); checked here, so a bad key fails before
    training starts. ``mode``, ``dynamic``, ``fullgraph``: as for ``torch.compile``.

    Give the model to ``Trainer`` with ``TrainingArguments.torch_compile`` off (its default).
    Raises TypeError for a model ``torch.compile`` already wrapped (compile the module itself).
    """
    if isinstance(model, torch._dynamo.eval_frame.OptimizedModule):
        raise TypeError(
            "compile_sparse: the model is already wrapped by torch.compile; pass the module itself "
            "(model._orig_mod) so that its forward signature stays visible to Trainer"
        )
    BackendOptions.parse(options, mode)  # the backend parses them again at the first call
    # torch.compile takes mode or options, not both; the backend reads a mode from its options too
    merged = {**(options or {}), **({} if mode is None else {"mode": mode})}
    model.compile(backend="sparse", options=merged, dynamic=dynamic, fullgraph=fullgraph)
    return model


class PhaseCallback(TrainerCallback):
    """Sets the phase of every model compiled with ``backend="sparse"`` at each optimizer step of
    ``Trainer.train()``, from a ``PhaseSchedule``.

    ``schedule``: indexed by the Trainer's optimizer step (``state.global_step``, from 0). None (the
    default): ``PhaseSchedule.from_fractions(state.max_steps)``, built when training begins (its
    default fractions: dense for the first 10% and the last 40% of the steps), whatever the lr schedule.
    ``PhaseSchedule.until_lr_decay`` is the opt-in for a warm-up-stable-decay lr (80% of the steps
    sparse: further behind at equal steps; projected at the 1.3B config's step speedup, sooner than the
    default to the dense loss in short runs (1.21B over 3200 steps, 126M over 1200), not in longer ones
    (126M over 2400) or at 353M; bench/RESULTS.md 6c).
    ``eval_phase``: the phase evaluation during training runs in. None (the default): the schedule's
    window at the optimizer step that ran just before it, as ``bench/train.py`` evaluates: sparse
    inside the sparse window (``dense_every``'s dense steps included), dense in the warm-up and the
    recovery; "dense" or "sparse": that phase.

    At each event:
    - train begin: remembers the phase in effect and builds the default schedule. Raises ValueError
      where ``args.torch_compile`` is set: accelerate would compile the model again with a backend of
      its fixed list, not the sparse one (use ``compile_sparse``).
    - step begin: ``schedule.step(state.global_step)``. The Trainer calls it once per optimizer step, so
      with gradient accumulation every micro-batch of a step runs in that step's phase.
    - step end: switches to the evaluation's phase (the next step begin sets the schedule's).
    - log: each training log (the one with "loss") gets ``"sparse_phase"``: the fraction of the
      optimizer steps since the previous training log that ran sparse (with ``logging_steps=1``, 1.0
      for a sparse step and 0.0 for a dense one). A number, so every ``report_to`` integration takes
      it. It goes to the callbacks after this one (the progress bar or printer) and into
      ``state.log_history`` (trainer_state.json); the Trainer calls the ``report_to`` integrations
      before the callbacks given to it, so for them move this one first:
      ``trainer.callback_handler.callbacks.insert(0, trainer.pop_callback(PhaseCallback))``.
      Only the phase is logged, no kept mass: the backend does not measure the activation mass its
      masks keep while training (``sparse_compile.clustering.kept_mass`` computes it offline from
      captured activations, as ``bench/train.py``'s probe does).
    - train end: restores the phase in effect at train begin. An ``evaluate()`` after ``train()`` runs
      in it (sparse unless set otherwise); ``with sparse_compile.dense_phase(): trainer.evaluate()``
      evaluates the dense model.

    Resuming (``train(resume_from_checkpoint=...)``): the Trainer restores ``state.global_step``, and
    the schedule continues at that step. The default schedule is built from ``state.max_steps``, so a
    resumed run must keep ``max_steps`` (as its learning-rate schedule must).
    """

    def __init__(self, schedule: PhaseSchedule | None = None, eval_phase: str | None = None) -> None:
        if schedule is not None and not isinstance(schedule, PhaseSchedule):
            raise TypeError(f"PhaseCallback: schedule={schedule!r}: expected a PhaseSchedule or None")
        if eval_phase is not None and eval_phase not in PHASES:
            raise ValueError(f"PhaseCallback: eval_phase={eval_phase!r}: expected None or one of {PHASES}")
        self.given = schedule
        self.schedule = schedule  # the one in use: ``given``, or the default built at train begin
        self.eval_phase = eval_phase
        self._previous = phase()
        self._steps = self._sparse_steps = 0  # optimizer steps since the previous training log

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if args.torch_compile:
            raise ValueError(
                "PhaseCallback: TrainingArguments.torch_compile is set, so accelerate compiles the model with "
                f"backend {args.torch_compile_backend!r} and the sparse backend's phases do nothing. Leave "
                "torch_compile off and compile the model first: sparse_compile.integrations.hf.compile_sparse(model)"
            )
        self._previous = phase()
        self.schedule = self.given if self.given is not None else PhaseSchedule.from_fractions(state.max_steps)
        self._steps = self._sparse_steps = 0
        set_phase(self._eval_phase(state.global_step))  # for an evaluation before the first step (eval_on_start)

    def on_step_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self._steps += 1
        self._sparse_steps += self.schedule.step(state.global_step) == "sparse"

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        set_phase(self._eval_phase(state.global_step - 1))

    def _eval_phase(self, step: int) -> str:
        """The phase an evaluation after optimizer step ``step`` runs in."""
        if self.eval_phase is not None:
            return self.eval_phase
        return "sparse" if self.schedule.in_sparse_window(step) else "dense"

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: dict[str, float] | None = None,
        **kwargs: Any,
    ) -> None:
        if logs is None or "loss" not in logs or not self._steps:
            return
        frac = self._sparse_steps / self._steps
        self._steps = self._sparse_steps = 0
        logs[LOG_KEY] = frac
        # the Trainer stored a copy of these logs before calling the callbacks
        last = state.log_history[-1] if state.log_history else None
        if last is not None and last.get("step") == state.global_step and "loss" in last:
            last[LOG_KEY] = frac

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        set_phase(self._previous)
