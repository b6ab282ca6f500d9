"""The gather kernels' autotuning choices, kept on disk: a machine tunes a kernel for a shape once.

Triton's own disk cache of autotuning results (TRITON_CACHE_AUTOTUNING) skips kernels whose
configs carry a pre_hook, and every gather config has one (it sets the TMA descriptor's block shape
per config). Without a cache every process compiles each of a gather kernel's ~13 configs and times
them, once per (layer shape, variant) key: most of the sparse phase's entry time, and the choice
can differ between two runs of the same job (timing noise), which changes the tiles and so the
rounding of the run.

One JSON file per (kernel source with its callees, config list, Triton version, device name, CUDA
version) maps each tuning key Triton built (the ``key`` arguments' values and the tensors' dtypes)
to the index of the chosen config. Loaded into the autotuner's in-memory cache before the first
launch on a device; written (merged with the file, atomic replace) when a launch added a key.
Folder: ``SPARSE_COMPILE_TUNE_DIR``, default ``$XDG_CACHE_HOME/sparse_compile/tune`` (or
``~/.cache/...``); ``SPARSE_COMPILE_TUNE_DIR=off`` keeps nothing.
"""

import hashlib
import inspect
import json
import os
import tempfile
from pathlib import Path

import torch
import triton
from triton.runtime.jit import JITFunction

_PLAIN = (bool, int, float, str, type(None))


def tune_dir() -> Path | None:
    """The cache folder, or None when ``SPARSE_COMPILE_TUNE_DIR=off``."""
    env = os.environ.get("SPARSE_COMPILE_TUNE_DIR")
    if env == "off":
        return None
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "sparse_compile" / "tune"


def stored_choices() -> str:
    """What the cache holds now, for a benchmark's record: "off", or "N choices in DIR" (a
    benchmark's compile time is shorter when its shapes were tuned before)."""
    root = tune_dir()
    if root is None:
        return "off"
    n = 0
    for path in root.glob("*.json") if root.is_dir() else ():
        try:
            entries = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        n += len(entries) if isinstance(entries, dict) else 0
    return f"{n} choices in {root}"


def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else device.type


class TuneStore:
    """The disk side of one autotuned kernel's choices (``kernel``: a ``triton.autotune`` object)."""

    def __init__(self, kernel) -> None:
        self.kernel = kernel
        self._known: dict[str, int] = {}  # per device: how many keys the file has seen
        self._paths: dict[str, Path | None] = {}
        self._names: dict[tuple[str, int | None], str] = {}  # load/save run at every launch: no name query

    def _name(self, device: torch.device) -> str:
        key = (device.type, device.index)
        if key not in self._names:
            self._names[key] = _device_name(device)
        return self._names[key]

    def path(self, device: torch.device) -> Path | None:
        name = self._name(device)
        if name not in self._paths:
            root = tune_dir()
            fn = self.kernel.fn
            while not inspect.isfunction(getattr(fn, "fn", None)):  # through heuristics to the jit object
                fn = fn.fn
            # a JITFunction's cache_key hashes its source and its callees'; the interpreter's has none
            source = fn.cache_key if isinstance(fn, JITFunction) else inspect.getsource(fn.fn)
            parts = [triton.__version__, str(torch.version.cuda), name, source]
            parts += [str(c) for c in self.kernel.configs]
            digest = hashlib.sha256("\n".join(parts).encode()).hexdigest()[:32]
            self._paths[name] = None if root is None else root / f"{fn.fn.__name__}-{digest}.json"
        return self._paths[name]

    def _read(self, path: Path) -> dict[str, int]:
        try:
            entries = json.loads(path.read_text())
        except (OSError, ValueError):
            return {}
        n = len(self.kernel.configs)
        if not isinstance(entries, dict):
            return {}
        return {k: i for k, i in entries.items() if isinstance(i, int) and 0 <= i < n}

    def load(self, device: torch.device) -> None:
        """Before a launch: the file's choices into the autotuner's cache, once per device."""
        name = self._name(device)
        if name in self._known or len(self.kernel.configs) < 2:
            return
        path = self.path(device)
        entries = {} if path is None else self._read(path)
        for key, index in entries.items():
            self.kernel.cache.setdefault(tuple(json.loads(key)), self.kernel.configs[index])
        self._known[name] = len(self.kernel.cache)

    def save(self, device: torch.device) -> None:
        """After a launch: when it tuned a new key, the choices merged into the file."""
        name = self._name(device)
        if len(self.kernel.configs) < 2 or len(self.kernel.cache) == self._known.get(name, -1):
            return
        self._known[name] = len(self.kernel.cache)
        path = self.path(device)
        if path is None:
            return
        entries = self._read(path)
        for key, config in self.kernel.cache.items():
            if all(isinstance(k, _PLAIN) for k in key) and config in self.kernel.configs:
                entries[json.dumps(list(key))] = self.kernel.configs.index(config)
        tmp = None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile("w", dir=path.parent, suffix=".tmp", delete=False) as f:
                tmp = f.name
                json.dump(entries, f, indent=0, sort_keys=True)
            os.replace(tmp, path)
        except OSError:  # a read-only or full disk: tuning still works, it is just not kept
            if tmp is not None and os.path.exists(tmp):
                os.unlink(tmp)
