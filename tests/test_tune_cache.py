"""The gather kernels' tuning choices on disk (kernels/tune_cache.py): what one process tuned, the
next one starts with; other kernels, devices or config lists never read it."""

import json

import torch
import triton
import triton.language as tl

from sparse_compile.kernels import gather_gemm_triton
from sparse_compile.kernels.tune_cache import TuneStore, stored_choices, tune_dir

CPU = torch.device("cpu")


def _hook(nargs: dict) -> None:  # a pre_hook, as every gather config has: Triton's own cache skips those
    pass


def _configs(n: int = 3) -> list[triton.Config]:
    return [triton.Config({"BLOCK": 16 * 2**i}, num_warps=4, pre_hook=_hook) for i in range(n)]


@triton.jit
def _copy(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + i, tl.load(x_ptr + i, mask=i < n), mask=i < n)


@triton.jit
def _negate(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + i, -tl.load(x_ptr + i, mask=i < n), mask=i < n)


def _tuned(fn, configs=None):
    return triton.autotune(configs=configs or _configs(), key=["n"])(fn)


def test_a_new_process_starts_with_the_choices(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARSE_COMPILE_TUNE_DIR", str(tmp_path))
    first = _tuned(_copy)
    store = TuneStore(first)
    store.load(CPU)
    assert first.cache == {}
    first.cache[(4096, "torch.float16", "torch.float16")] = first.configs[2]  # what a launch tunes
    first.cache[(512, "torch.float32", "torch.float32")] = first.configs[0]
    store.save(CPU)
    (path,) = tmp_path.iterdir()
    assert path.name.startswith("_copy-") and len(json.loads(path.read_text())) == 2

    again = _tuned(_copy)  # the next process: the same kernel and configs
    TuneStore(again).load(CPU)
    assert again.cache == {
        (4096, "torch.float16", "torch.float16"): again.configs[2],
        (512, "torch.float32", "torch.float32"): again.configs[0],
    }
    assert again.cache[(4096, "torch.float16", "torch.float16")].pre_hook is _hook

    # another kernel, another config list: other files, nothing loaded
    for other in (_tuned(_negate), _tuned(_copy, _configs(2))):
        TuneStore(other).load(CPU)
        assert other.cache == {}


def test_save_merges_and_writes_only_new_keys(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARSE_COMPILE_TUNE_DIR", str(tmp_path))
    a, b = _tuned(_copy), _tuned(_copy)
    sa, sb = TuneStore(a), TuneStore(b)
    sa.load(CPU)
    sb.load(CPU)
    a.cache[(1, "x")] = a.configs[1]
    b.cache[(2, "x")] = b.configs[2]
    sa.save(CPU)
    sb.save(CPU)  # a second process writing later keeps the first one's key
    (path,) = tmp_path.iterdir()
    assert json.loads(path.read_text()) == {'[1, "x"]': 1, '[2, "x"]': 2}
    assert stored_choices() == f"2 choices in {tmp_path}"
    path.write_text("{}")
    sa.save(CPU)  # no key added since the last save: no write
    assert path.read_text() == "{}"


def test_bad_files_and_off_are_ignored(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARSE_COMPILE_TUNE_DIR", str(tmp_path))
    k = _tuned(_copy)
    store = TuneStore(k)
    path = store.path(CPU)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"[1]": 7, "[2]": 1, "[3]": "a"}))  # index out of range, not an int
    store.load(CPU)
    assert k.cache == {(2,): k.configs[1]}
    path.write_text("not json")
    k2 = _tuned(_copy)
    TuneStore(k2).load(CPU)
    assert k2.cache == {}

    monkeypatch.setenv("SPARSE_COMPILE_TUNE_DIR", "off")
    assert tune_dir() is None and stored_choices() == "off"
    k3 = _tuned(_copy)
    s3 = TuneStore(k3)
    s3.load(CPU)
    k3.cache[(5,)] = k3.configs[0]
    s3.save(CPU)
    assert path.read_text() == "not json"


def test_default_folder(monkeypatch, tmp_path):
    monkeypatch.delenv("SPARSE_COMPILE_TUNE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert tune_dir() == tmp_path / "sparse_compile" / "tune"


def test_the_gather_kernels_use_it(monkeypatch):
    """Both gathers load their store before the launch and save it after (interpreter: one config)."""
    from sparse_compile.kernels.activation_mask import vnm_compact_ref

    calls = []

    class Recording:
        def __init__(self, name):
            self.name = name

        def load(self, device):
            calls.append((self.name, "load", device.type))

        def save(self, device):
            calls.append((self.name, "save", device.type))

    monkeypatch.setattr(gather_gemm_triton, "_K_STORE", Recording("k"))
    monkeypatch.setattr(gather_gemm_triton, "_N_STORE", Recording("n"))
    h_c, r_c, ids = vnm_compact_ref(torch.randn(32, 32), None, 16, 2, 8)
    gather_gemm_triton.gather_k_mm(h_c, ids, torch.randn(32, 24), 16)
    gather_gemm_triton.gather_n_mm(torch.randn(32, 24), torch.randn(32, 24), ids, 16, r_c)
    assert calls == [("k", "load", "cpu"), ("k", "save", "cpu"), ("n", "load", "cpu"), ("n", "save", "cpu")]
    assert gather_gemm_triton.TuneStore is TuneStore
