"""Activation checkpointing on a real GPU: a GPT whose blocks run under torch.utils.checkpoint,
compiled with the default pattern on the Triton chunk kernels, gives the output and gradients of
the same GPT without checkpointing (the backward's recompute reruns the sparse op with the same
masks). Run by hand on H100/H200; the CPU test is tests/test_checkpoint.py."""

import pytest
import torch
from torch.utils.checkpoint import checkpoint

import sparse_compile

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (the CPU path is in tests/)")


def _step(checkpointed: bool) -> tuple[torch.Tensor, dict[str, torch.Tensor], sparse_compile.Report]:
    """Loss and gradients of one step of a 2-block d=512 GPT (h = 2048: chunks of 128) on 4 x 1024
    tokens, bf16 autocast, every site forced sparse (small_ffn='sparse': the size rule would keep
    them dense at this size)."""
    from bench.model import GPT, GPTConfig

    torch._dynamo.reset()
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=1024, n_layer=2, n_head=8, n_embd=512)).cuda()
    if checkpointed:
        for block in model.blocks:
            block.forward = lambda x, f=block.forward: checkpoint(f, x, use_reentrant=False)
    idx = torch.randint(0, 256, (4, 1025), device="cuda", generator=torch.Generator("cuda").manual_seed(0))
    compiled = torch.compile(model, backend="sparse", options={"small_ffn": "sparse"})
    with torch.autocast("cuda", dtype=torch.bfloat16):
        _, loss = compiled(idx[:, :-1], idx[:, 1:])
    loss.backward()
    grads = {n: p.grad.float().clone() for n, p in model.named_parameters() if p.grad is not None}
    return loss.detach().float(), grads, sparse_compile.compile_reports()[-1]


def test_checkpointed_blocks_run_sparse_with_the_same_numbers():
    loss, grads, report = _step(checkpointed=True)
    assert len(report.sparse_sites) == 2 and report.sparse_sites[0].kernel.startswith("triton")
    want_loss, want_grads, _ = _step(checkpointed=False)
    torch.testing.assert_close(loss, want_loss, rtol=1e-3, atol=0.0)
    assert grads.keys() == want_grads.keys()
    for name, g in want_grads.items():
        torch.testing.assert_close(grads[name], g, rtol=2e-2, atol=1e-4, msg=name)
