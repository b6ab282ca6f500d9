"""The token-dim weight-gradient approximation: against a loop-by-loop statement of its rule, and
wired through both ops (reference and Triton gather) and the config."""

import dataclasses

import pytest
import torch

from sparse_compile import SparsityConfig
from sparse_compile.kernels.weight_grad_approx import dense_rows, token_perm, token_vnm_grad
from sparse_compile.kernels.weight_grad_gather import token_vnm_grad_gather

from .test_gather_op import _inputs, _run_vnm
from .test_op import run_op


def _loops(a, b, v, n, m, dense_frac):
    """a^T b with a [T, h] kept per (block of v hidden units, group of m permuted tokens): the 4 tokens
    of largest sum |a| over the block (ties: earlier in the order), then per unit its n largest |a|."""
    t, h = a.shape
    perm = token_perm(t, a.device).tolist()
    out = torch.zeros(h, b.shape[1], dtype=torch.float64)
    for h0 in range(0, h, v):
        for g0 in range(0, t, m):
            toks = perm[g0 : g0 + m]
            norms = [sum(abs(a[tk, j].item()) for j in range(h0, h0 + v)) for tk in toks]
            four = sorted(range(m), key=lambda i: (-norms[i], i))[:4]
            four.sort()
            for j in range(h0, h0 + v):
                vals = [abs(a[toks[i], j].item()) for i in four]
                keep = sorted(range(4), key=lambda q: (-vals[q], q))[:n]
                for q in keep:
                    tk = toks[four[q]]
                    out[j] += a[tk, j].double() * b[tk].double()
    k = round(dense_frac * h)
    counts = [(a[:, j] != 0).sum().item() for j in range(h)]
    for j in sorted(range(h), key=lambda j: (-counts[j], j))[:k]:
        out[j] = a[:, j].double() @ b.double()
    return out


@pytest.mark.parametrize("v, n, m", [(4, 2, 8), (2, 1, 4), (4, 4, 16), (1, 2, 4)])
@pytest.mark.parametrize("dense_frac", [0.0, 0.25])
def test_matches_the_rule(v, n, m, dense_frac):
    g = torch.Generator().manual_seed(v * 10 + m)
    a = torch.relu(torch.randn(32, 8, generator=g)) * torch.randn(32, 8, generator=g)  # zeros, signs
    b = torch.randn(32, 5, generator=g)
    got = token_vnm_grad(a, b, (v, n, m), dense_frac)
    torch.testing.assert_close(got.double(), _loops(a, b, v, n, m, dense_frac), rtol=1e-5, atol=1e-5)
    assert not torch.allclose(got, a.t() @ b)  # it is an approximation


DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # CPU: the Triton interpreter (conftest)


@pytest.mark.parametrize("v, n, m", [(16, 2, 8), (32, 1, 16), (16, 4, 8)])
@pytest.mark.parametrize("dense_frac", [0.0, 0.25])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_gather_kernel_equals_reference(v, n, m, dense_frac, dtype):
    """token_vnm_grad_gather (selection kernel on |a^T|, gather-K GEMM with the permutation in
    its ids) against the reference, and against the exact product: an approximation of it."""
    g = torch.Generator().manual_seed(v + m + n)
    a = (torch.relu(torch.randn(64, 3 * v, generator=g)) * torch.randn(64, 3 * v, generator=g)).to(DEVICE, dtype)
    b = torch.randn(64, 24, generator=g).to(DEVICE, dtype)
    got = token_vnm_grad_gather(a, b, (v, n, m), dense_frac)
    want = token_vnm_grad(a, b, (v, n, m), dense_frac)
    assert got.shape == want.shape and got.dtype == want.dtype
    scale = want.float().abs().max().item()
    assert (got.float() - want.float()).abs().max().item() <= (2e-3 if dtype == torch.float16 else 1e-5) * scale
    assert not torch.allclose(got.float(), (a.t() @ b).float(), atol=1e-2 * scale)


def test_gather_kernel_refuses_v_it_cannot_tile():
    with pytest.raises(ValueError, match="V=4; the gather-K GEMM needs V a multiple of 16"):
        token_vnm_grad_gather(torch.randn(32, 8), torch.randn(32, 3), (4, 2, 8))


def test_exact_where_the_pattern_does_not_fit_and_with_all_rows_dense():
    a, b = torch.randn(30, 8), torch.randn(30, 3)  # T=30 is not a multiple of M=8
    torch.testing.assert_close(token_vnm_grad(a, b, (4, 2, 8)), a.t() @ b)
    a, b = torch.randn(32, 8), torch.randn(32, 3)
    torch.testing.assert_close(token_vnm_grad(a, b, (4, 2, 8), dense_frac=1.0), a.t() @ b)


def test_dense_rows_are_the_densest():
    a = torch.zeros(8, 4)
    a[:, 2] = 1.0
    a[:5, 0] = 1.0
    assert dense_rows(a, 0.5).tolist() == [2, 0]


def test_token_perm_is_fixed():
    assert torch.equal(token_perm(64, "cpu"), token_perm(64, "cpu")) and sorted(token_perm(64, "cpu").tolist()) == list(
        range(64)
    )


@pytest.mark.parametrize("gather", [False, True])
def test_op_backward_uses_it(gather):
    """Only dW1 and dW2 change, and they change to the approximation of the exact op's operands."""
    exact = SparsityConfig(activations="16:2:8", kernels="triton")
    approx = dataclasses.replace(exact, weight_grad="tokens:16:2:8", weight_grad_dense_frac=0.0)
    args = _inputs((64,), dtype=torch.float32, seed=3)
    grads = {}
    for name, config in (("exact", exact), ("approx", approx)):
        if gather:
            y, _, _, leaves = _run_vnm(*args, config)
        else:
            y, leaves = run_op(*args, config)
        (y * torch.linspace(-1, 1, y.numel(), device=y.device).reshape(y.shape)).sum().backward()
        grads[name] = {k: t.grad for k, t in leaves.items()}
    for k in ("x", "b1", "b2"):
        torch.testing.assert_close(grads["approx"][k], grads["exact"][k])
    for k in ("w1", "w2"):
        cos = torch.nn.functional.cosine_similarity(grads["approx"][k].flatten(), grads["exact"][k].flatten(), dim=0)
        assert 0.5 < cos < 1 - 1e-6, (k, cos)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"weight_grad": "tokens"}, "tokens:V:N:M"),
        ({"weight_grad": "tokens:64:3:8"}, "weight_grad='tokens:64:3:8'"),
        ({"weight_grad": "64:2:8"}, "weight_grad='64:2:8'"),
        ({"weight_grad_dense_frac": 1.5}, "weight_grad_dense_frac=1.5"),
    ],
)
def test_config_rejects(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SparsityConfig(activations="64:2:8", **kwargs)
