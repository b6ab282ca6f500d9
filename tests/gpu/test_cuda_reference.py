"""The op's CUDA branch (reference kernels on CUDA tensors), bf16, on a real GPU. Run by hand on H100/H200."""

import contextlib
import copy

import pytest
import torch

import sparse_compile
from sparse_compile import SparsityConfig, compile_reports, dense_phase
from sparse_compile.planning.plan import GATHER

from ..oracle import oracle_ffn
from ..test_backend import Stack, oracle_forward
from ..test_op import run_op

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (the CPU path is in tests/)")

CONFIGS = [
    SparsityConfig(weights="2:4"),
    SparsityConfig(activations="2:4"),
    SparsityConfig(activations="128:2:8"),
    SparsityConfig(weights="2:4", activations="64:2:8"),
]


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"{c.weights}-{c.activations}")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_op_on_cuda_matches_oracle(config, dtype):
    g = torch.Generator(device="cuda").manual_seed(0)
    r = lambda *s, scale=1.0: (torch.randn(*s, generator=g, device="cuda") * scale).to(dtype)  # noqa: E731
    args = (r(4, 256, 512), r(2048, 512, scale=0.05), r(2048, scale=0.1), r(512, 2048, scale=0.02), r(512))
    y, leaves = run_op(*args, config)  # the reference op on CUDA tensors
    y_ref, ref = oracle_ffn(*args, config)
    gy = torch.randn_like(y)
    (y.float() * gy.float()).sum().backward()
    (y_ref.float() * gy.float()).sum().backward()
    assert y.device.type == "cuda" and y.dtype == dtype
    assert _rel(y, y_ref) < 1e-2
    for k, leaf in leaves.items():
        assert _rel(leaf.grad, ref[k].grad) < 2e-2, k


def test_compiled_cuda_model_sparse_vs_oracle_and_dense_bit_identical():
    model = Stack(256, 1024).cuda()
    ref, baseline = copy.deepcopy(model), copy.deepcopy(model)
    config = SparsityConfig(weights="2:4", activations="64:2:8")
    x = torch.randn(8, 128, 256, device="cuda")
    # venom (the oracle's config), forced sparse under the size rule
    compiled = torch.compile(model, backend="sparse", options={"preset": "venom", "small_ffn": "sparse"})
    with torch.autocast("cuda", dtype=torch.bfloat16):
        y = compiled(x)
        y_ref = oracle_forward(ref, x, config)
        with dense_phase():
            y_dense = compiled(x)
        y_default = torch.compile(baseline)(x)
    assert _rel(y, y_ref) < 1e-2
    assert torch.equal(y_dense, y_default)
    report = compile_reports()[-1]
    assert [s.kernel for s in report.sparse_sites] == [GATHER] * 2  # venom, bf16, T % 64 == 0


def train_gpt(
    options: dict, perturb: bool = False, steps: int = 50, refit_at: int | None = None
) -> tuple[torch.Tensor, set[str], list[str]]:
    """``steps`` steps of a 4-block GPT on one batch under torch.compile(backend="sparse", options=options), bf16
    autocast: (losses, the sites' kernels, the sites' notes). ``perturb``: initial weights scaled by
    1 + 2^-9 N(0, 1) (a bf16 rounding's size). ``refit_at``: step ``refit_at`` runs under probe_units() and
    recluster() refits after it, as bench.train's --recluster-every does."""
    from bench.model import GPT, GPTConfig

    idx = torch.randint(0, 256, (8, 257), device="cuda", generator=torch.Generator("cuda").manual_seed(0))
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=256, n_layer=4, n_head=4, n_embd=256)).cuda()
    if perturb:
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(1 + 2**-9 * torch.randn_like(p))
    compiled = torch.compile(model, backend="sparse", options={"small_ffn": "sparse", **options})
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for step in range(steps):
        with sparse_compile.probe_units() if step == refit_at else contextlib.nullcontext():
            with torch.autocast("cuda", dtype=torch.bfloat16):
                _, loss = compiled(idx[:, :-1], idx[:, 1:])
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
        if step == refit_at:
            assert sparse_compile.recluster(), "refit_at: no site was refitted"
    sites = compile_reports()[-1].sparse_sites
    return torch.tensor(losses), {s.kernel for s in sites}, [s.record.reason for s in sites]


def assert_trains_like_reference(fast: torch.Tensor, options: dict) -> None:
    """``fast`` (train_gpt's losses on the fast kernels) against the reference kernels' run of the same
    ``options``: the run memorizes its batch, which amplifies rounding differences in its steep
    middle; so the first steps equal to 2e-3, and every step within twice the gap that a
    bf16-rounding-sized perturbation of the initial weights opens in the reference run."""
    ref, ref_kernels, _ = train_gpt({**options, "kernels": "reference"})
    assert ref_kernels == {"reference (cuda)"}
    noise = (train_gpt({**options, "kernels": "reference"}, perturb=True)[0] - ref).abs().max().item()
    assert fast[-1] < fast[0] - 1.0
    torch.testing.assert_close(fast[:3], ref[:3], rtol=2e-3, atol=0.0)
    gap = (fast - ref).abs().max().item()
    assert gap <= 2 * noise + 1e-2, f"gap {gap:.3f}, noise {noise:.3f}\n{fast}\n{ref}"


def test_gpt_trains_on_cuda_with_the_sparse_backend():
    losses, _, notes = train_gpt({}, steps=30)  # the default config
    assert losses[-1] < losses[0] - 1.0  # memorizes the one batch
    assert len(notes) == 4
    assert sparse_compile.phase() == "sparse"
