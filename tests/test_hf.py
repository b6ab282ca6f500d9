"""sparse_compile.integrations.hf: a tiny squared-ReLU causal LM from a transformers config, trained by
transformers.Trainer with PhaseCallback (gradient accumulation, evaluation, save and resume) and by an
accelerate loop, with the sparse backend's default options."""

import ast
import inspect
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")
accelerate = pytest.importorskip("accelerate")

import sparse_compile  # noqa: E402
from sparse_compile import PhaseSchedule, Report, compile_reports  # noqa: E402
from sparse_compile.backend import PhaseDispatcher  # noqa: E402
from sparse_compile.integrations import hf  # noqa: E402
from sparse_compile.integrations.hf import LOG_KEY, PhaseCallback, compile_sparse  # noqa: E402

SEQ = 128  # a multiple of the default pattern's V = 128 tokens
VOCAB = 256
STEPS = 8
LAYERS = 2


def tiny_lm() -> "transformers.NemotronForCausalLM":
    """Two decoder layers whose MLP is up_proj -> relu² -> down_proj (Nemotron's), hidden 64, FFN 2048
    (16 chunks of the default's 128 units): the README's and the accelerate recipe's model, so that the
    compiles share their kernels."""
    config = transformers.NemotronConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=2048,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=SEQ,
        hidden_act="relu2",
    )
    torch.manual_seed(0)
    return transformers.NemotronForCausalLM(config)


def dataset(n: int, seed: int = 1) -> list[dict]:
    """Random token sequences; "source" is a column the model does not take, which the Trainer's
    remove_unused_columns drops by the forward signature."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for i in range(n):
        ids = torch.randint(0, VOCAB, (SEQ,), generator=g)
        rows.append({"input_ids": ids, "labels": ids.clone(), "source": i})
    return rows


def _reset_accelerate() -> None:
    """accelerate keeps its state (device, mixed precision) process-wide, and an Accelerator with other
    settings than an earlier one's raises: start without one, as a process would."""
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


@pytest.fixture(autouse=True)
def _fresh_accelerate_state():
    _reset_accelerate()
    yield
    _reset_accelerate()


class StepRecorder(transformers.TrainerCallback):
    """The Trainer's step, for the dispatcher's record, and the graphs compiled within each step."""

    step = -1  # the step that began last, -1 outside Trainer

    def __init__(self) -> None:
        self.compiles: list[tuple[int, int]] = []  # (step, graphs the backend compiled during it)

    def on_step_begin(self, args, state, control, **kwargs):
        StepRecorder.step = state.global_step
        self.start = len(compile_reports())

    def on_step_end(self, args, state, control, **kwargs):
        self.compiles.append((state.global_step - 1, len(compile_reports()) - self.start))


@dataclass
class Run:
    trainer: transformers.Trainer
    schedule: PhaseSchedule
    first: int  # the step it started at (resumed: the checkpoint's)
    accumulation: int
    graph_calls: int  # calls of a compiled graph per micro-batch: 1, or one per layer with the MLPs compiled
    compiles: list[tuple[int, int]]
    phase_after: str  # sparse_compile.phase() once train() returned
    # (step, whether gradients were on, phase) of every call of a compiled graph with sparse sites:
    # the variant the backend's dispatcher ran
    dispatches: list[tuple[int, bool, str]] = field(default_factory=list)


def _recording_dispatcher(calls: list):
    original = PhaseDispatcher.__call__

    def record(self, *args):
        calls[-1].append((StepRecorder.step, torch.is_grad_enabled(), sparse_compile.phase()))
        return original(self, *args)

    return record


def train(
    out: Path, schedule: PhaseSchedule | None, calls: list, resume: Path | None = None, mlps: bool = False, **args
) -> Run:
    """``STEPS`` steps of Trainer with PhaseCallback(schedule) on compile_sparse(tiny_lm()) (``mlps``: on
    each layer's MLP instead), saving at step 4 or resuming from ``resume``, a log at every step."""
    model = tiny_lm()
    for module in [layer.mlp for layer in model.model.layers] if mlps else [model]:
        compile_sparse(module)
    training_args = transformers.TrainingArguments(
        output_dir=str(out),
        max_steps=STEPS,
        per_device_train_batch_size=2,
        per_device_eval_batch_size=2,
        learning_rate=1e-3,
        logging_steps=1,
        save_steps=4,
        report_to="none",
        use_cpu=True,
        disable_tqdm=True,
        **args,
    )
    recorder = StepRecorder()
    trainer = transformers.Trainer(
        model=model,
        args=training_args,
        train_dataset=dataset(64),
        eval_dataset=dataset(4, seed=2),
        callbacks=[PhaseCallback(schedule), recorder],
    )
    calls.append([])
    trainer.train(resume_from_checkpoint=None if resume is None else str(resume))
    StepRecorder.step = -1
    schedule = schedule or PhaseSchedule.from_fractions(STEPS)  # the callback's default
    first = 0 if resume is None else int(resume.name.split("-")[1])
    accumulation = args.get("gradient_accumulation_steps", 1)
    graph_calls = LAYERS if mlps else 1
    phase_after = sparse_compile.phase()
    return Run(trainer, schedule, first, accumulation, graph_calls, recorder.compiles, phase_after, calls[-1])


@dataclass
class TrainerRuns:
    runs: dict[str, Run]
    reports: list[Report]  # of every graph the runs compiled


@pytest.fixture(scope="module")
def trainer_runs(tmp_path_factory) -> TrainerRuns:
    """Five Trainer runs in one Dynamo state, so that they share the compiled graphs (compiling the
    model is most of this file's time): the default schedule, saving at step 4; its resume from
    checkpoint-4; sparse [2, 6) with gradient accumulation 2; its resume; and the default schedule with
    an evaluation every 2 steps, on the layers' MLPs compiled (the whole model's evaluation graph would
    be a second compile of all of it)."""
    out = tmp_path_factory.mktemp("trainer")
    torch._dynamo.reset()
    first_report = len(compile_reports())
    calls: list[list] = []
    window = PhaseSchedule.from_fractions(STEPS, warmup=0.25, final_dense=0.25)
    runs: dict[str, Run] = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(PhaseDispatcher, "__call__", _recording_dispatcher(calls))
        for name, kwargs in {
            "default": {},
            "default_resumed": {"resume": out / "default" / "checkpoint-4"},
            "accumulation": {"schedule": window, "gradient_accumulation_steps": 2},
            "accumulation_resumed": {
                "schedule": window, "gradient_accumulation_steps": 2, "resume": out / "accumulation" / "checkpoint-4"
            },
            "evaluation": {"mlps": True, "eval_strategy": "steps", "eval_steps": 2, "save_strategy": "no"},
        }.items():  # fmt: skip
            _reset_accelerate()
            runs[name] = train(out / name, calls=calls, **{"schedule": None, **kwargs})
    _reset_accelerate()
    sparse_compile.set_phase("sparse")
    return TrainerRuns(runs, compile_reports()[first_report:])


def training_logs(trainer) -> dict[int, dict]:
    return {h["step"]: h for h in trainer.state.log_history if "loss" in h}


def check_run(run: Run) -> None:
    """Steps [run.first, STEPS): each micro-batch ran the compiled graph in the schedule's phase, and
    no step after the first compiled anything (the phase flips included); every step's loss is finite
    and logged with its phase (a resumed run's history holds the checkpoint's: trainer_state.json)."""
    steps = range(run.first, STEPS)
    trained = [(s, p) for s, grad, p in run.dispatches if grad]
    calls = run.accumulation * run.graph_calls
    assert trained == [(s, run.schedule.phase_at(s)) for s in steps for _ in range(calls)]
    assert [c for _, c in run.compiles[1:]] == [0] * (len(steps) - 1)
    logs = training_logs(run.trainer)
    assert sorted(logs) == list(range(1, STEPS + 1))
    for s in range(STEPS):
        assert math.isfinite(logs[s + 1]["loss"])
        assert logs[s + 1][LOG_KEY] == (1.0 if run.schedule.phase_at(s) == "sparse" else 0.0)


def check_resume(full: Run, resumed: Run) -> None:
    """The resumed run's losses are the uninterrupted run's (the same graphs on the same CPU threads)."""
    a, b = training_logs(full.trainer), training_logs(resumed.trainer)
    for step in range(resumed.first + 1, STEPS + 1):
        assert b[step]["loss"] == pytest.approx(a[step]["loss"], rel=1e-5, abs=1e-6), step


def test_trainer_follows_the_default_schedule(trainer_runs):
    run = trainer_runs.runs["default"]
    assert run.schedule == PhaseSchedule(1, 5)  # dense, 4 sparse, then dense
    check_run(run)
    assert run.phase_after == "sparse"  # restored at train end
    # every graph compiled (training, evaluation; the whole model's, the MLPs') has every FFN site
    # sparse, and no graph was compiled per phase
    whole = [r for r in trainer_runs.reports if len(r.sites) > 1]
    assert len(whole) == 1 and len(whole[0].sites) == LAYERS
    assert all(r.sites and len(r.sparse_sites) == len(r.sites) for r in trainer_runs.reports)


def test_trainer_resume_continues_the_schedule(trainer_runs):
    resumed = trainer_runs.runs["default_resumed"]
    assert resumed.first == 4
    check_run(resumed)
    check_resume(trainer_runs.runs["default"], resumed)


def test_trainer_gradient_accumulation_and_resume(trainer_runs):
    full, resumed = trainer_runs.runs["accumulation"], trainer_runs.runs["accumulation_resumed"]
    assert [full.schedule.phase_at(s) for s in range(4, STEPS)] == ["sparse"] * 2 + ["dense"] * 2  # a flip after 4
    check_run(full)
    check_run(resumed)
    check_resume(full, resumed)


def test_trainer_evaluates_in_the_schedules_window(trainer_runs):
    run = trainer_runs.runs["evaluation"]
    check_run(run)
    evaluated = {(s, p) for s, grad, p in run.dispatches if not grad}  # after steps 2, 4, 6, 8
    assert sorted(evaluated) == [(1, "sparse"), (3, "sparse"), (5, "dense"), (7, "dense")]
    assert all(math.isfinite(h["eval_loss"]) for h in run.trainer.state.log_history if "eval_loss" in h)


def test_accelerate_loop_recipe(monkeypatch, capsys):
    """The accelerate recipe of sparse_compile.integrations.hf's docstring, as written: 4 steps, each in
    its phase, one compiled graph for both phases with every FFN site sparse, finite losses."""
    recipe = re.search(r"```python\n(.*?)```", hf.__doc__, re.S).group(1)
    calls: list[list] = [[]]
    monkeypatch.setattr(PhaseDispatcher, "__call__", _recording_dispatcher(calls))
    exec(compile(recipe, "hf recipe", "exec"), {})
    assert [p for _, _, p in calls[0]] == ["dense", "sparse", "sparse", "dense"]
    printed = [line.split() for line in capsys.readouterr().out.splitlines() if line.startswith("step ")]
    assert [line[2] for line in printed] == ["dense", "sparse", "sparse", "dense"]
    assert all(math.isfinite(float(line[4])) for line in printed)
    (report,) = compile_reports()
    assert len(report.sites) == len(report.sparse_sites) == 2
    assert sparse_compile.phase() == "sparse"


def test_compile_sparse_keeps_the_model():
    model = tiny_lm()
    before = inspect.signature(model.forward)
    assert compile_sparse(model) is model
    assert inspect.signature(model.forward) == before and "input_ids" in before.parameters
    assert not any(k.startswith("_orig_mod") for k in model.state_dict())
    with pytest.raises(ValueError, match="bogus"):
        compile_sparse(tiny_lm(), {"bogus": 1})
    with pytest.raises(ValueError, match="not both"):
        compile_sparse(tiny_lm(), {"mode": "default"}, mode="default")
    compile_sparse(tiny_lm(), {"activations": "64:4:16"}, mode="default")  # torch.compile takes one of the two
    with pytest.raises(TypeError, match="already wrapped"):
        compile_sparse(torch.compile(tiny_lm(), backend="sparse"))


def test_callback_events_without_training():
    """eval_phase, the log of a window of steps, and the phase restored at train end, by the callback's
    events alone."""
    args = transformers.TrainingArguments(output_dir="unused", report_to="none", use_cpu=True)
    state, control = transformers.TrainerState(max_steps=10), transformers.TrainerControl()
    sparse_compile.set_phase("dense")
    callback = PhaseCallback(eval_phase="dense")
    callback.on_train_begin(args, state, control)
    assert callback.schedule == PhaseSchedule.from_fractions(10) == PhaseSchedule(1, 6)
    phases = []
    for step in range(3):
        state.global_step = step
        callback.on_step_begin(args, state, control)
        phases.append(sparse_compile.phase())
        state.global_step = step + 1
        callback.on_step_end(args, state, control)
        assert sparse_compile.phase() == "dense"  # what an evaluation here runs in
    assert phases == ["dense", "sparse", "sparse"]
    state.log_history.append({"loss": 1.0, "step": 3})
    logs = {"loss": 1.0}
    callback.on_log(args, state, control, logs=logs)
    assert logs[LOG_KEY] == state.log_history[-1][LOG_KEY] == pytest.approx(2 / 3)
    callback.on_log(args, state, control, logs={"eval_loss": 1.0})  # not a training log: left alone
    sparse_compile.set_phase("sparse")
    callback.on_train_end(args, state, control)
    assert sparse_compile.phase() == "dense"  # the phase before train()

    # by default an evaluation runs in the schedule's window: sparse after dense_every's dense step 2
    callback = PhaseCallback(PhaseSchedule(1, 4, dense_every=2))
    callback.on_train_begin(args, state, control)
    evaluated = []
    for step in range(5):
        state.global_step = step
        callback.on_step_begin(args, state, control)
        state.global_step = step + 1
        callback.on_step_end(args, state, control)
        evaluated.append(sparse_compile.phase())
    assert [callback.schedule.phase_at(s) for s in range(5)] == ["dense", "sparse", "dense", "sparse", "dense"]
    assert evaluated == ["dense", "sparse", "sparse", "sparse", "dense"]


def test_default_schedule_is_from_fractions_under_any_lr_schedule(tmp_path):
    """PhaseCallback with no schedule builds from_fractions' 10% / 40% whatever the Trainer's lr schedule:
    under a warm-up-stable-decay lr too (until_lr_decay is an opt-in, given as the schedule)."""

    def begin(schedule=None, **kwargs):
        args = transformers.TrainingArguments(
            output_dir=str(tmp_path), max_steps=200, report_to="none", use_cpu=True, **kwargs
        )
        callback = PhaseCallback(schedule)
        callback.on_train_begin(args, transformers.TrainerState(max_steps=200), transformers.TrainerControl())
        return callback.schedule

    wsd = {"lr_scheduler_type": "warmup_stable_decay", "lr_scheduler_kwargs": {"num_decay_steps": 30}}
    for kwargs in ({}, {"lr_scheduler_type": "cosine"}, wsd):
        assert begin(**kwargs) == PhaseSchedule(20, 120), kwargs
    opt_in = PhaseSchedule.until_lr_decay(200, 30)
    assert begin(opt_in, **wsd) == opt_in == PhaseSchedule(10, 170)


def test_callback_rejects_accelerate_compile(tmp_path):
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), max_steps=1, torch_compile=True, report_to="none", use_cpu=True
    )
    trainer = transformers.Trainer(model=tiny_lm(), args=args, train_dataset=dataset(2), callbacks=[PhaseCallback()])
    with pytest.raises(ValueError, match="compile_sparse"):
        trainer.train()
    with pytest.raises(ValueError, match="eval_phase"):
        PhaseCallback(eval_phase="half")


def test_only_the_integration_imports_the_frameworks():
    """``import sparse_compile`` never imports transformers or accelerate: no module of the package
    but integrations/hf.py names them, and none imports integrations/hf.py."""
    import sparse_compile.kernels
    import sparse_compile.passes

    roots = [Path(p) for mod in (sparse_compile, sparse_compile.passes, sparse_compile.kernels) for p in mod.__path__]
    files = {f for root in roots for f in root.rglob("*.py")} - {Path(hf.__file__)}
    assert len(files) > 10
    banned = ("transformers", "accelerate", "sparse_compile.integrations.hf")
    for f in files:
        for node in ast.walk(ast.parse(f.read_text(), str(f))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            else:
                continue
            assert not [n for n in names if n.split(".")[0] in banned[:2] or n == banned[2]], (f, names)
