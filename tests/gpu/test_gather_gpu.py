"""The compact V:N:M path (Triton gather kernels) on a real GPU, bf16/fp16, against the reference
op and the oracle; a compiled GPT trains on it like on the reference kernels. Run by hand on H100/H200."""

import pytest
import torch

from sparse_compile import SparsityConfig
from sparse_compile.planning.plan import GATHER

from ..oracle import oracle_ffn
from .test_cuda_reference import _rel, train_gpt

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (the CPU path is in tests/)")

CONFIGS = [
    SparsityConfig(activations="128:2:8"),
    SparsityConfig(activations="128:4:8"),
    SparsityConfig(activations="128:2:16"),
    SparsityConfig(weights="2:4", activations="64:2:8"),
]


def ffn_leaves(seed: int, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """(x [4, 256, 512], w1 [2048, 512], b1, w2 [512, 2048], b2) on CUDA, requiring grad."""
    g = torch.Generator(device="cuda").manual_seed(seed)

    def r(*s, scale=1.0):
        return (torch.randn(*s, generator=g, device="cuda") * scale).to(dtype).requires_grad_()

    return r(4, 256, 512), r(2048, 512, scale=0.05), r(2048, scale=0.1), r(512, 2048, scale=0.02), r(512)


def run_with_grads(op, leaves: tuple[torch.Tensor, ...], weights: str | None, spec: str) -> list[torch.Tensor]:
    """[y, dx, dw1, db1, dw2, db2] of one FFN op call on ``leaves`` (its weights 2:4-masked first if
    ``weights``), under a fixed cotangent that weights every output element differently."""
    x, w1, b1, w2, b2 = leaves
    for t in leaves:
        t.grad = None
    ops = torch.ops.sparse_compile
    w1s, w2s = (ops.sparsify_weight(w, "2:4", 0.0) if weights else w for w in (w1, w2))
    y = op(x, w1s, b1, w2s, b2, spec)[0]
    (y.float() * torch.linspace(-1, 1, y.numel(), device="cuda").reshape(y.shape)).sum().backward()
    return [y.detach()] + [t.grad.clone() for t in leaves]


def _poison() -> None:
    """Leave NaN in the caching allocator's free blocks, so an output element a kernel forgets shows."""
    junk = torch.full((1 << 28,), float("nan"), device="cuda", dtype=torch.float16)
    del junk


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"{c.weights}-{c.activations}")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("dense", ["", ";dense_gemms=B1+B3+F2"], ids=["gather", "cublas"])
def test_gather_op_matches_reference_op_and_oracle(config, dtype, dense):
    leaves = ffn_leaves(1, dtype)
    ops = torch.ops.sparse_compile
    outs = {}
    for name, op in (("gather", ops.sqrelu_ffn_vnm), ("reference", ops.sqrelu_ffn)):
        _poison()
        outs[name] = run_with_grads(op, leaves, config.weights, config.op_spec() + (dense if name == "gather" else ""))
        assert all(torch.isfinite(o).all() for o in outs[name]), name
    y_ref, ref = oracle_ffn(*(t.detach() for t in leaves), config)
    for i, (a, b) in enumerate(zip(outs["gather"], outs["reference"], strict=True)):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert _rel(a, b) < 1e-2, f"output {i}: gather vs reference op"
    assert _rel(outs["gather"][0], y_ref) < 1e-2


def test_gpt_trains_on_gather_kernels_like_on_reference_kernels():
    curves = {}
    for kernels in ("auto", "reference"):
        curves[kernels], kernel_names, _ = train_gpt({"activations": "128:2:8", "kernels": kernels})
        assert kernel_names == ({GATHER} if kernels == "auto" else {"reference (cuda)"})
    assert curves["auto"][-1] < curves["auto"][0] - 1.0
    torch.testing.assert_close(curves["auto"], curves["reference"], rtol=3e-2, atol=3e-2)


def test_gather_choice_measures_each_gemm():
    from sparse_compile.planning.gather_choice import choose_gathers

    for shape in [(4096, 1024, 4096), (16384, 2048, 8192)]:
        choice = choose_gathers(0, torch.bfloat16, *shape, 128, 2, 16)
        assert choice.dense <= {"F2", "B1", "B3"}
        assert all(f"{g} {'cuBLAS' if g in choice.dense else 'gather'} (" in choice.why for g in ("F2", "B1", "B3"))
        print(shape, choice.why)
