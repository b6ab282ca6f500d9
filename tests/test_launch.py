"""kernels/launch.py: FastLaunch takes Triton's path once per signature, then the compiled
kernel's launcher with the arguments Triton would pass (in signature order, defaults and the
autotuned config's values filled in). A fake kernel records both paths; the real launches are
checked bit-equal on a GPU (tests/gpu/test_chunks_gpu.py, bench.op_host_time)."""

import pytest
import torch
from triton.runtime.autotuner import Autotuner

from sparse_compile.kernels import launch
from sparse_compile.kernels.launch import FastLaunch, signature


def _body(x_ptr, n, FLAG, BLOCK=64, EXTRA=3):
    pass


class _Compiled:
    function, packed_metadata = "fn", "meta"

    def __init__(self, calls: list) -> None:
        self.calls = calls

    def run(self, *args):
        self.calls.append(("fast", args))


class _Jit:
    """Stands for a triton.jit function: ``kernel[grid](...)`` is Triton's path."""

    def __init__(self) -> None:
        self.fn, self.calls = _body, []
        self.compiled = _Compiled(self.calls)

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.calls.append(("triton", grid, args, kwargs))
            return self.compiled

        return launch


class _Config:
    def __init__(self, hooks: list) -> None:
        self.kwargs = {"BLOCK": 128}
        self.pre_hook = hooks.append


class _Tuner(Autotuner):
    """Stands for a triton.autotune object over _Jit (its config chosen on Triton's path)."""

    def __init__(self) -> None:
        self.fn, self.hooks = _Jit(), []
        self.config = _Config(self.hooks)

    def __getitem__(self, grid):
        launch = self.fn[grid]

        def tuned(*args, **kwargs):
            self.best_config = self.config
            return launch(*args, **kwargs)

        return tuned


class _Driver:
    class active:  # noqa: N801 (triton.runtime.driver.active)
        get_current_device = staticmethod(lambda: 0)
        get_current_stream = staticmethod(lambda device: 77)


@pytest.fixture
def compiled_launcher(monkeypatch):
    monkeypatch.setattr(launch, "driver", _Driver)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setattr(FastLaunch, "active", True)


def test_the_second_call_of_a_signature_runs_the_compiled_launcher(compiled_launcher):
    kernel = _Jit()
    fast = FastLaunch(kernel)
    x = torch.randn(64)
    assert fast[(3,)](x, 10, True, num_warps=4) is kernel.compiled
    assert [c[0] for c in kernel.calls] == ["triton"]
    fast[(3,)](x, 10, True, num_warps=4)
    fast[(2, 5)](torch.randn(64), 10, True, EXTRA=9, num_warps=4)  # new keyword value: Triton's path
    fast[(2, 5)](torch.randn(64), 10, True, EXTRA=9, num_warps=4)
    kinds = [c[0] for c in kernel.calls]
    assert kinds == ["triton", "fast", "triton", "fast"]
    # grid padded to 3-D, the stream, the compiled function and metadata, no hooks, then every
    # parameter in signature order with the defaults filled in (num_warps is an option: not passed)
    assert kernel.calls[1][1] == (3, 1, 1, 77, "fn", "meta", None, None, None, x, 10, True, 64, 3)
    assert kernel.calls[3][1][:3] == (2, 5, 1) and kernel.calls[3][1][-1] == 9


@pytest.mark.parametrize(
    "change",
    ["dtype", "misaligned", "bool for int", "int value", "option"],
)
def test_what_triton_specializes_on_takes_triton_s_path_again(compiled_launcher, change):
    """A tensor's dtype or 16-byte alignment, an argument's type (True is not 1) or value, a launch
    option: each makes another signature, compiled by Triton, never the first one's kernel."""
    kernel = _Jit()
    fast = FastLaunch(kernel)
    x = torch.randn(64, dtype=torch.float16)
    fast[(1,)](x, 1, False, num_warps=4)
    fast[(1,)](x, 1, False, num_warps=4)
    args, kwargs = [x, 1, False], {"num_warps": 4}
    if change == "dtype":
        args[0] = torch.randn(64, dtype=torch.bfloat16)
    elif change == "misaligned":
        args[0] = x[1:]  # 2 bytes past a 16-byte boundary
        assert args[0].data_ptr() % 16
    elif change == "bool for int":
        args[1] = True
    elif change == "int value":
        args[1] = 17
    else:
        kwargs["num_warps"] = 8
    fast[(1,)](*args, **kwargs)
    assert [c[0] for c in kernel.calls] == ["triton", "fast", "triton"]
    assert kernel.calls[-1][2][1] is args[1] and kernel.calls[-1][3] == kwargs


def test_an_unknown_argument_type_always_takes_triton_s_path(compiled_launcher):
    kernel = _Jit()
    fast = FastLaunch(kernel)
    for _ in range(3):
        fast[(1,)](torch.randn(8), 2, object())
    assert [c[0] for c in kernel.calls] == ["triton"] * 3
    assert signature((object(),), {}) is None


@pytest.mark.parametrize("off", ["interpreter", "inactive"])
def test_off_every_call_takes_triton_s_path(compiled_launcher, monkeypatch, off):
    if off == "interpreter":
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    else:
        monkeypatch.setattr(FastLaunch, "active", False)
    kernel = _Jit()
    fast = FastLaunch(kernel)
    x = torch.randn(8)
    for _ in range(3):
        fast[(1,)](x, 2, True)
    assert [c[0] for c in kernel.calls] == ["triton"] * 3


def test_an_autotuned_kernel_launches_with_its_config(compiled_launcher):
    """The config Triton chose: its values passed, its pre_hook run on the named arguments, set
    again as best_config (callers read it after a launch), and the grid computed from them."""
    tuner = _Tuner()
    fast = FastLaunch(tuner)
    x = torch.randn(64)

    def grid(meta):
        return (meta["n"] // meta["BLOCK"],)

    fast[grid](x, 1024, True)
    tuner.best_config = None
    fast[grid](x, 1024, True)
    assert tuner.best_config is tuner.config
    assert [c[0] for c in tuner.fn.calls] == ["triton", "fast"]
    assert tuner.fn.calls[1][1] == (8, 1, 1, 77, "fn", "meta", None, None, None, x, 1024, True, 128, 3)
    assert len(tuner.hooks) == 1 and tuner.hooks[0]["BLOCK"] == 128 and tuner.hooks[0]["x_ptr"] is x


def test_a_keyword_and_a_positional_value_make_different_signatures():
    x = torch.randn(4)
    assert signature((x, 1), {}) != signature((x,), {"n": 1})
    assert signature((x, "n", 1), {}) != signature((x,), {"n": 1})
    assert signature((x, True), {}) != signature((x, 1), {})
    assert signature((x, 1), {}) == signature((torch.randn(4), 1), {})  # values of tensors: not kept


def test_on_only_with_a_tested_triton_and_not_switched_off():
    from sparse_compile.kernels.launch import default_active

    assert default_active("3.6.0", None) and default_active("3.6.1", "1")
    assert not default_active("3.6.0", "0")
    assert not default_active("3.7.0", None) and not default_active("3.60.0", None)


@pytest.mark.parametrize("before", [True, False])
def test_triton_path_turns_fast_launch_off_and_restores_what_it_found(monkeypatch, before):
    monkeypatch.setattr(FastLaunch, "active", before)
    with pytest.raises(RuntimeError, match="inside"), launch.triton_path():
        assert FastLaunch.active is False
        raise RuntimeError("inside")
    assert FastLaunch.active is before
