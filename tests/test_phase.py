import re

import pytest

import sparse_compile
from sparse_compile import PhaseSchedule, dense_phase, phase, set_phase


def test_dense_phase_restores_previous():
    assert phase() == "sparse"
    with dense_phase():
        assert phase() == "dense"
        with dense_phase():
            assert phase() == "dense"
        assert phase() == "dense"
    assert phase() == "sparse"
    set_phase("dense")
    with dense_phase():
        pass
    assert phase() == "dense"


def test_dense_phase_restores_on_error():
    with pytest.raises(RuntimeError), dense_phase():
        raise RuntimeError
    assert phase() == "sparse"


def test_set_phase_rejects_unknown():
    with pytest.raises(ValueError, match=r"set_phase\('Dense'\)"):
        set_phase("Dense")


def test_schedule_switches_at_the_right_steps():
    s = PhaseSchedule(dense_warmup_steps=3, dense_from_step=7)
    phases = [s.step(i) for i in range(10)]
    assert phases == ["dense"] * 3 + ["sparse"] * 4 + ["dense"] * 3
    assert sparse_compile.phase() == "dense"
    assert [PhaseSchedule().phase_at(i) for i in range(3)] == ["sparse"] * 3


def test_schedule_from_fractions():
    s = PhaseSchedule.from_fractions(100, warmup=0.1, final_dense=0.25)
    assert (s.dense_warmup_steps, s.dense_from_step) == (10, 75)
    default = PhaseSchedule.from_fractions(100)  # the default pattern's measured recipe: 10% / 40% dense
    assert (default.dense_warmup_steps, default.dense_from_step) == (10, 60)
    with pytest.raises(ValueError, match="warmup"):
        PhaseSchedule.from_fractions(100, warmup=1.5, final_dense=0.0)
    with pytest.raises(ValueError, match="> 1"):
        PhaseSchedule.from_fractions(100, warmup=0.6, final_dense=0.6)


def test_schedule_until_lr_decay():
    s = PhaseSchedule.until_lr_decay(200, 30)  # dense 5% = 10 steps, sparse to the decay at 170, dense after
    assert [s.phase_at(i) for i in (0, 9, 10, 169, 170, 199)] == ["dense"] * 2 + ["sparse"] * 2 + ["dense"] * 2
    assert sum(s.phase_at(i) == "sparse" for i in range(200)) == 160  # 80% of the steps
    assert PhaseSchedule.until_lr_decay(200, 30, warmup=0.1, dense_every=4) == PhaseSchedule(20, 170, 4)
    assert PhaseSchedule.until_lr_decay(100, 100, warmup=0.0) == PhaseSchedule(0, 0)  # all decay: all dense
    for kwargs, match in (
        ({"total_steps": 100, "decay_steps": 0}, "decay_steps=0"),
        ({"total_steps": 100, "decay_steps": 101}, "decay_steps=101"),
        ({"total_steps": 100, "decay_steps": 15.0}, "decay_steps=15.0"),
        ({"total_steps": 0, "decay_steps": 1}, "total_steps=0"),
        ({"total_steps": 100, "decay_steps": 15, "warmup": -0.1}, "warmup=-0.1"),
        ({"total_steps": 100, "decay_steps": 90, "warmup": 0.2}, "past the decay's start"),
    ):
        with pytest.raises(ValueError, match=re.escape(match)):
            PhaseSchedule.until_lr_decay(**kwargs)


def test_schedule_dense_every_kth_step_of_the_sparse_window():
    s = PhaseSchedule.from_fractions(20, warmup=0.1, final_dense=0.25, dense_every=3)  # sparse window [2, 15)
    phases = [s.phase_at(i) for i in range(20)]
    dense_inside = [i for i in range(2, 15) if phases[i] == "dense"]
    assert dense_inside == [4, 7, 10, 13]  # warm-up + 2, + 5, ...: every third step of the window
    assert phases[:2] == ["dense"] * 2 and phases[15:] == ["dense"] * 5
    assert [s.in_sparse_window(i) for i in (1, 2, 4, 14, 15)] == [False, True, True, True, False]
    assert PhaseSchedule(2, 15).in_sparse_window(4) and PhaseSchedule(2, 15).phase_at(4) == "sparse"


@pytest.mark.parametrize(
    "kwargs",
    [{"dense_warmup_steps": -1}, {"dense_warmup_steps": 5, "dense_from_step": 3}, {"dense_every": 1},
     {"dense_every": -2}],
)  # fmt: skip
def test_schedule_rejects_bad_steps(kwargs):
    with pytest.raises(ValueError, match="PhaseSchedule"):
        PhaseSchedule(**kwargs)
