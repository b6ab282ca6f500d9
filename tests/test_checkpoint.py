"""FFNs inside activation-checkpoint regions (torch.utils.checkpoint, use_reentrant=False): Dynamo
traces each region into a tag_activation_checkpoint call on a body subgraph; the pass rewrites the
FFNs in a copy of each body (the dense variant keeps the original), and AOTAutograd recomputes the
sparse op in backward. The checkpointed model computes what the same model without checkpointing
computes under backend='sparse', forward and every gradient."""

import pytest
import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

import sparse_compile
from sparse_compile import dense_phase, explain

from .ffn_zoo import SquaredReLU

OPTIONS = {"activations": "16:2:8", "kernels": "reference"}


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(32)
        self.mlp = nn.Sequential(nn.Linear(32, 128), SquaredReLU(), nn.Linear(128, 32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(self.ln(x))


class Net(nn.Module):
    """Three blocks; ``checkpointed`` blocks run under torch.utils.checkpoint (the last one never:
    a site outside any region beside those inside)."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(3))
        self.checkpointed = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, block in enumerate(self.blocks):
            x = checkpoint(block, x, use_reentrant=False) if self.checkpointed and i < 2 else block(x)
        return x


def _run(model: Net, x: torch.Tensor, checkpointed: bool, dense: bool = False):
    """Output and every parameter's gradient of the model compiled with backend='sparse'."""
    torch._dynamo.reset()
    model.checkpointed = checkpointed
    model.zero_grad()
    compiled = torch.compile(model, backend="sparse", options=OPTIONS)
    if dense:
        with dense_phase():
            y = compiled(x)
    else:
        y = compiled(x)
    (y * torch.linspace(-1, 1, y.shape[-1])).sum().backward()
    return y.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def test_ffns_inside_checkpoint_regions_run_sparse_with_the_same_numbers():
    torch.manual_seed(0)
    model, x = Net(), torch.randn(2, 64, 32)
    y, grads = _run(model, x, checkpointed=True)
    report = sparse_compile.compile_reports()[-1]
    assert [s.record.module for s in report.sparse_sites] == ["blocks.2.mlp", "blocks.0.mlp", "blocks.1.mlp"]
    assert not report.dense_sites
    want_y, want_grads = _run(model, x, checkpointed=False)
    assert torch.equal(y, want_y)
    for name, g in want_grads.items():
        torch.testing.assert_close(grads[name], g, rtol=1e-5, atol=1e-6, msg=name)
    # the dense phase runs the regions' original bodies: the dense model's numbers, not the sparse ones
    y_dense, _ = _run(model, x, checkpointed=True, dense=True)
    torch._dynamo.reset()
    assert torch.allclose(y_dense, torch.compile(model)(x), rtol=1e-5, atol=1e-6)
    assert not torch.allclose(y_dense, y, rtol=1e-3, atol=1e-3)


def test_explain_lists_the_sites_inside_checkpoint_regions():
    torch.manual_seed(0)
    model, x = Net(), torch.randn(2, 64, 32)
    report = explain(model, x, config=OPTIONS)
    assert len(report.sparse_sites) == 3 and "3 sparse FFN site(s), 0 dense" in str(report)


@pytest.mark.skipif(not hasattr(torch.compiler, "nested_compile_region"), reason="torch.compiler.nested_compile_region")
def test_ffns_in_regions_not_rewritten_are_reported_dense_with_the_reason():
    """torch.compiler.nested_compile_region traces into invoke_subgraph, whose body is compiled once
    and shared by an identifier: its FFN stays dense, and the report names it and says why."""

    class Shared(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.block = Block()

        @torch.compiler.nested_compile_region
        def inner(self, x: torch.Tensor) -> torch.Tensor:
            return self.block(x)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.inner(self.inner(x))

    torch.manual_seed(0)
    report = explain(Shared(), torch.randn(2, 64, 32), config=OPTIONS)
    assert not report.sparse_sites and [s.record.module for s in report.dense_sites] == ["block.mlp"]
    assert report.dense_sites[0].record.reason == (
        "inside a region of the higher-order op invoke_subgraph, whose FFNs are not rewritten (rewritten: "
        "tag_activation_checkpoint, torch.utils.checkpoint's)"
    )
