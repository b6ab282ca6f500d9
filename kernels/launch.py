"""Triton launches with the per-call work done once per signature (host time, not GPU time).

``kernel[grid](*args, **kwargs)`` costs several times the host time of the compiled kernel's own
launcher, the more so for the gather and weight-gradient kernels (30 arguments, an autotuner, TMA
descriptors; ``python -m bench.op_host_time`` times both). Per call Triton binds and specializes
every argument, builds the cache key, finds the autotuned config and merges keyword dicts; for a
small FFN the sparse op's Triton launches per site and step are a large part of why the step is
host-bound.

``FastLaunch(kernel)[grid](*args, **kwargs)`` launches the same compiled kernel with the same
arguments. The first call with a given signature goes through Triton (compiling, autotuning) and
records the compiled kernel and the config it ran; later calls with that signature call the
compiled kernel's launcher directly. The signature keeps every value Triton specializes on, and
more: each tensor's dtype and whether its address is 16-byte aligned; every other argument by type
and value (sizes, strides, flags, launch options), a TMA descriptor by its base's dtype and
alignment, shape, strides and block shape. A call whose signature was not seen, or with an argument
of another type, takes Triton's path. Under the CPU interpreter (``TRITON_INTERPRET=1``), or with
``SPARSE_COMPILE_FAST_LAUNCH=0``, or with a Triton release other than the ones in ``TESTED``
(the launcher's arguments are Triton's internals), every call takes Triton's path. Triton's
launch hooks (``knobs.runtime.launch_enter_hook``, used by its own profiler) are not called on
the direct path. An autotuned kernel's ``best_config`` is set to the config each launch ran,
as Triton's own launch does, and the config's pre_hook runs before each launch.
"""

import contextlib
import inspect
import os
from collections.abc import Callable, Iterator

import torch
import triton
from triton.runtime import driver
from triton.runtime.autotuner import Autotuner
from triton.tools.tensor_descriptor import TensorDescriptor

TESTED = ("3.6.",)  # Triton releases whose launcher FastLaunch calls: checked bit-equal on a GPU
_SCALARS = frozenset((int, bool, float, str, type(None)))


def signature(args: tuple, kwargs: dict) -> tuple | None:
    """The launch's signature (see the module doc), or None when an argument has another type.
    Flat, one marker per argument (its type, or a tensor's dtype) before its values: cheaper to
    build and hash than per-argument tuples."""
    key = [len(args)]  # then the positional values, the keywords' names, their values
    add = key.append
    for v in (*args, *kwargs, *kwargs.values()):
        t = type(v)
        if t in _SCALARS:
            add(t)
            add(v)
        elif isinstance(v, torch.Tensor):
            add(v.dtype)
            add(v.data_ptr() % 16 == 0)
        elif t is TensorDescriptor:
            b = v.base
            add(t)
            add(b.dtype)
            add(b.data_ptr() % 16 == 0)
            add(tuple(v.shape))
            add(tuple(v.strides))
            add(tuple(v.block_shape))
        else:
            return None
    return tuple(key)


def default_active(version: str, env: str | None) -> bool:
    """Whether FastLaunch starts on: a tested Triton release, and SPARSE_COMPILE_FAST_LAUNCH not "0"."""
    return env != "0" and version.startswith(TESTED)


class FastLaunch:
    """``kernel`` (a ``triton.jit`` function or a ``triton.autotune`` over one) launched as
    ``FastLaunch(kernel)[grid](*args, **kwargs)``, with the same grid forms Triton takes."""

    def __init__(self, kernel) -> None:
        self.kernel = kernel
        self.tuned = isinstance(kernel, Autotuner)
        jit = kernel.fn if self.tuned else kernel
        params = inspect.signature(jit.fn).parameters
        self.names = list(params)
        self.defaults = {n: p.default for n, p in params.items() if p.default is not inspect.Parameter.empty}
        self._entries: dict[tuple, tuple] = {}
        # the CPU interpreter (decided at import, as triton.jit decides it): no compiled launcher
        self._interpreted = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")

    # off: every launch takes Triton's path (benchmarks compare the two; SPARSE_COMPILE_FAST_LAUNCH=0).
    # On only with the Triton it was checked against (3.6: the compiled launcher's arguments are
    # Triton's internals and may change in another release)
    active = default_active(triton.__version__, os.environ.get("SPARSE_COMPILE_FAST_LAUNCH"))

    def enabled(self) -> bool:
        """Active, and not under the CPU interpreter, whose kernels have no compiled launcher."""
        return self.active and not self._interpreted

    def __getitem__(self, grid) -> Callable:
        return lambda *args, **kwargs: self.run(grid, args, kwargs)

    def run(self, grid, args: tuple, kwargs: dict):
        if not self.enabled():
            return self.kernel[grid](*args, **kwargs)
        device = driver.active.get_current_device()  # a compiled kernel is loaded per device
        sig = signature(args, kwargs)
        key = None if sig is None else (device, sig)
        entry = None if key is None else self._entries.get(key)
        if entry is None:
            compiled = self.kernel[grid](*args, **kwargs)
            if key is not None:
                compiled = compiled.result() if hasattr(compiled, "result") else compiled
                config = self.kernel.best_config if self.tuned else None
                self._entries[key] = (compiled, config)
            return compiled
        compiled, config = entry
        named = dict(self.defaults)
        named.update(zip(self.names, args, strict=False))  # the rest come as keywords
        named.update(kwargs)
        if config is not None:
            named.update(config.kwargs)
            self.kernel.best_config = config
            if config.pre_hook is not None:
                config.pre_hook(named)
        g = grid(named) if callable(grid) else grid
        stream = driver.active.get_current_stream(device)
        compiled.run(
            g[0], g[1] if len(g) > 1 else 1, g[2] if len(g) > 2 else 1, stream, compiled.function,
            compiled.packed_metadata, None, None, None, *[named[n] for n in self.names],
        )  # fmt: skip
        return compiled


@contextlib.contextmanager
def triton_path() -> Iterator[None]:
    """Every FastLaunch launch through Triton's own path while active (benchmarks and tests compare
    the two); the setting it found is restored after, also when it was off."""
    was = FastLaunch.active
    FastLaunch.active = False
    try:
        yield
    finally:
        FastLaunch.active = was
