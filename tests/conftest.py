import os

import pytest
import torch

if not torch.cuda.is_available():
    # Triton kernels run in the interpreter on CPU (fp16/fp32 only: bf16 tl.dot is wrong there).
    os.environ.setdefault("TRITON_INTERPRET", "1")

import sparse_compile


@pytest.fixture
def interpreter(monkeypatch):
    """Triton kernels on CPU tensors: the interpreter, for this test."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert os.environ["TRITON_INTERPRET"] == "1"


@pytest.fixture(autouse=True)
def _fresh_state():
    """Each test starts in the sparse phase with empty Dynamo caches and counters."""
    torch._dynamo.reset()
    sparse_compile.backend._reports.clear()
    torch._dynamo.utils.counters.clear()
    sparse_compile.set_phase("sparse")
    sparse_compile.reset_units()
    yield
    sparse_compile.set_phase("sparse")
