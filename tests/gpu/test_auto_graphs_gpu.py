"""small_ffn='graphs' on a real GPU: a GPT whose FFN sites pay only with CUDA graphs (T x d x h = 8192
x 1024 x 4096 = 2**35, the chunked bound with graphs) compiled with no options (or the scored mass
loss alone) runs them sparse under Inductor's cudagraph trees, trains as the same sites forced
sparse without graphs do, and switches to the dense phase and back. Run by hand on H100/H200."""

import pytest
import torch

from sparse_compile import compile_reports, dense_phase
from sparse_compile.report import AUTO_GRAPHS_NOTE

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (the CPU path is in tests/)")


def _train(options: dict, steps: int = 4) -> tuple[list[float], float]:
    """Losses of ``steps`` sparse-phase steps of a 2-block d=1024 GPT on 4 x 2048 tokens (bf16
    autocast, AdamW), then the loss of one dense-phase step and of one more sparse step."""
    from torch._inductor import cudagraph_trees

    from bench.model import GPT, GPTConfig

    torch._dynamo.reset()
    cudagraph_trees.reset_cudagraph_trees()
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=2048, n_layer=2, n_head=8, n_embd=1024)).cuda()
    idx = torch.randint(0, 256, (4, 2049), device="cuda", generator=torch.Generator("cuda").manual_seed(0))
    compiled = torch.compile(model, backend="sparse", options=options)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step() -> float:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            _, loss = compiled(idx[:, :-1], idx[:, 1:])
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss.item()

    losses = [step() for _ in range(steps)]
    with dense_phase():
        dense = step()
    return [*losses, step()], dense


@pytest.mark.parametrize(
    "extra", [{}, {"mass_loss": 0.1, "mass_loss_rows": "scoring"}], ids=["default", "mass-loss-scoring"]
)
def test_sites_that_pay_only_with_graphs_run_sparse_under_them(extra):
    """mass-loss-scoring: the mass loss's fused dZ kernel and its GEMMs inside the captured graphs too."""
    from torch._dynamo.utils import counters
    from torch._inductor import cudagraph_trees

    forced, forced_dense = _train({"small_ffn": "sparse", **extra})  # the same sites, no CUDA graphs
    assert not compile_reports()[-1].cuda_graphs
    assert cudagraph_trees.get_manager(torch.cuda.current_device(), create_if_none_exists=False) is None
    counters.clear()
    graphs, graphs_dense = _train(extra)
    report = compile_reports()[-1]
    assert len(report.sparse_sites) == 2 and report.auto_graphs == 2 and report.cuda_graphs
    assert AUTO_GRAPHS_NOTE.format(n=2, bound=2**37) in str(report)
    assert ("dZ there from the forward's Z" in str(report)) == bool(extra)  # the mass loss's path, planned
    assert cudagraph_trees.get_manager(torch.cuda.current_device(), create_if_none_exists=False) is not None
    assert counters["inductor"]["cudagraph_skips"] == 0
    torch.testing.assert_close(torch.tensor(graphs), torch.tensor(forced), rtol=2e-3, atol=0.0)
    torch.testing.assert_close(graphs_dense, forced_dense, rtol=2e-3, atol=0.0)
    assert graphs[-1] < graphs[0]


class CpuPositions(torch.nn.Module):
    """One FFN site that pays only with CUDA graphs (T x d x h = 8192 x 1024 x 4096 = 2**35) after
    an embedding whose positions are made on the CPU and moved (torch.arange without device=, a
    common spelling), which Inductor may decline to run under CUDA graphs."""

    def __init__(self) -> None:
        from bench.model import MLP, GPTConfig

        super().__init__()
        self.wte = torch.nn.Embedding(256, 1024)
        self.wpe = torch.nn.Embedding(2048, 1024)
        self.ln = torch.nn.LayerNorm(1024)
        self.mlp = MLP(GPTConfig(n_embd=1024))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]).to(idx.device))
        return x + self.mlp(self.ln(x))


def test_the_report_agrees_with_inductor_on_cuda_graphs():
    """Where Inductor declines CUDA graphs for the sparse graph (its cudagraph_skips counter), the
    site that needed them stays dense, the note gives Inductor's reason, and the output is the dense
    graph's; where it accepts them (e.g. its graph partitions keep the CPU ops outside), the site
    runs sparse under them."""
    from torch._dynamo.utils import counters
    from torch._inductor import cudagraph_trees

    torch._dynamo.reset()
    cudagraph_trees.reset_cudagraph_trees()
    counters.clear()
    torch.manual_seed(0)
    model = CpuPositions().cuda()
    idx = torch.randint(0, 256, (4, 2048), device="cuda", generator=torch.Generator("cuda").manual_seed(0))
    with torch.autocast("cuda", dtype=torch.bfloat16):
        y = torch.compile(model, backend="sparse")(idx).float().clone()
    report = compile_reports()[-1]
    if counters["inductor"]["cudagraph_skips"]:
        assert not report.sparse_sites and not report.cuda_graphs and not report.auto_graphs
        assert "Inductor declined them: skipping cudagraphs due to" in str(report)
        torch._dynamo.reset()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            dense = torch.compile(model, backend="sparse", options={"small_ffn": "dense"})(idx).float()
        torch.testing.assert_close(y, dense, rtol=0.0, atol=0.0)
    else:
        assert len(report.sparse_sites) == 1 and report.auto_graphs == 1 and report.cuda_graphs
    assert torch.isfinite(y).all()
