"""forward="dense" on a real GPU: at the 1.3B FFN's shape the gather op's output is the dense FFN's and
its gradients the reference op's (the masked function's); a compiled GPT trains on it like on the
reference kernels. Run by hand on H100/H200."""

import pytest
import torch
import torch.nn.functional as F

from sparse_compile import SparsityConfig
from sparse_compile.planning.plan import GATHER

from .test_cuda_reference import _rel, assert_trains_like_reference, train_gpt
from .test_gather_gpu import _poison

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (the CPU path is in tests/)")


@pytest.mark.parametrize(
    "config",
    [
        SparsityConfig(activations="128:4:16", chunk=128, forward="dense"),
        SparsityConfig(activations="128:4:16", chunk=128, causal=True, score_rows=16, forward="dense"),
        SparsityConfig(activations="128:2:16", forward="dense"),
    ],
    ids=["own-block-c128", "causal-scored-c128", "128:2:16"],
)
def test_dense_forward_op_at_the_1_3b_shape(config):
    """(T, d, h) = (16384, 2048, 8192) in 8 sequences of 2048, bf16, outputs poisoned: y against the
    dense FFN on cuBLAS, every gradient against the reference op with the same spec."""
    g = torch.Generator(device="cuda").manual_seed(0)

    def r(*s, scale=1.0):
        return (torch.randn(*s, generator=g, device="cuda") * scale).bfloat16().requires_grad_()

    leaves = (r(8, 2048, 2048), r(8192, 2048, scale=0.03), r(8192, scale=0.1), r(2048, 8192, scale=0.02), r(2048))
    dy = torch.randn(8, 2048, 2048, generator=g, device="cuda").bfloat16()
    ops = torch.ops.sparse_compile
    outs = {}
    for name, op in (("gather", ops.sqrelu_ffn_vnm), ("reference", ops.sqrelu_ffn)):
        for t in leaves:
            t.grad = None
        _poison()
        y = op(*leaves, config.op_spec())[0]
        y.backward(dy)
        outs[name] = [y.detach()] + [t.grad.clone() for t in leaves]
        assert all(torch.isfinite(o).all() for o in outs[name]), name
    x, w1, b1, w2, b2 = (t.detach() for t in leaves)
    y_dense = F.linear(torch.relu(F.linear(x, w1, b1)).square(), w2, b2)
    assert _rel(outs["gather"][0], y_dense) < 1e-3
    for i, (a, b) in enumerate(zip(outs["gather"], outs["reference"], strict=True)):
        assert _rel(a, b) < 1e-2, f"output {i}: gather vs reference op"


def test_gpt_trains_on_dense_forward_like_on_reference_kernels():
    options = {"forward": "dense", "causal": False}
    fast, kernels, _ = train_gpt({**options, "kernels": "auto"})
    assert kernels == {GATHER}
    assert_trains_like_reference(fast, options)
