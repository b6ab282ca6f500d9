"""The custom op, eagerly, against the independent autograd oracle (tests/oracle.py)."""

import pytest
import torch

import sparse_compile.ops.spec
from sparse_compile import SparsityConfig
from sparse_compile.kernels import transposable_24_mask

from .oracle import oracle_ffn

CONFIGS = {
    "weights": SparsityConfig(weights="2:4"),
    "act24": SparsityConfig(activations="2:4"),
    "act64:2:8": SparsityConfig(activations="64:2:8"),
    "act32:4:16": SparsityConfig(activations="32:4:16"),
    "venom": SparsityConfig(weights="2:4", activations="64:2:8"),
}


def run_op(x, w1, b1, w2, b2, config):
    """The rewrite's call sequence: sparsify_weight (if 2:4 weights) then sqrelu_ffn."""
    leaves = {
        k: v.detach().clone().requires_grad_(True)
        for k, v in dict(x=x, w1=w1, b1=b1, w2=w2, b2=b2).items()
        if v is not None
    }
    ws = []
    for name in ("w1", "w2"):
        w = leaves[name]
        if config.weights:
            w = torch.ops.sparse_compile.sparsify_weight(w, config.weights, float(config.masked_decay))
        ws.append(w)
    y, _ = torch.ops.sparse_compile.sqrelu_ffn(
        leaves["x"], ws[0], leaves.get("b1"), ws[1], leaves.get("b2"), config.op_spec()
    )
    return y, leaves


def _inputs(shape, d=32, h=128, d_out=24, bias=True, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, dtype=dtype)  # noqa: E731
    return r(*shape, d), r(h, d) * 0.2, r(h) * 0.1 if bias else None, r(d_out, h) * 0.1, r(d_out) if bias else None


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("shape, bias", [((128,), True), ((2, 64), False), ((2, 2, 32), True)])
def test_op_matches_oracle(name, shape, bias):
    config = CONFIGS[name]
    args = _inputs(shape, bias=bias, seed=len(shape))
    y, leaves = run_op(*args, config)
    y_ref, ref = oracle_ffn(*args, config)
    assert_same_function(y, leaves, y_ref, ref, rtol=1e-5, atol=1e-5)


def assert_same_function(y, leaves: dict, y_ref, ref: dict, **tol) -> None:
    """Outputs equal, and one random cotangent backpropagated through both gives every leaf in
    ``leaves`` the grad of its namesake in ``ref`` (within ``tol``, torch.testing.assert_close's)."""
    gy = torch.randn_like(y)
    (y * gy).sum().backward()
    (y_ref * gy).sum().backward()
    torch.testing.assert_close(y, y_ref, **tol)
    for k, leaf in leaves.items():
        torch.testing.assert_close(leaf.grad, ref[k].grad, msg=f"grad {k}", **tol)


def test_activation_sparsity_is_real():
    x, w1, b1, w2, b2 = _inputs((256,))
    _, r = torch.ops.sparse_compile.sqrelu_ffn(x, w1, b1, w2, b2, CONFIGS["act64:2:8"].op_spec())
    assert r.shape == (256, 128)
    density = (r != 0).float().mean().item()
    assert 0 < density <= 2 / 8
    blocks = (r != 0).reshape(4, 64, 16, 8)
    assert (blocks.any(1).sum(-1) <= 4).all() and (blocks.sum(-1) <= 2).all()


def test_masked_decay_and_straight_through():
    w = torch.randn(8, 16, requires_grad=True)
    ws = torch.ops.sparse_compile.sparsify_weight(w, "2:4", 0.5)
    mask = transposable_24_mask(w)
    torch.testing.assert_close(ws, w * mask)
    g = torch.randn(8, 16)
    ws.backward(g)
    torch.testing.assert_close(w.grad, g + 0.5 * (~mask) * w.detach())


def test_token_count_not_multiple_of_v_runs_dense_and_warns():
    x, w1, b1, w2, b2 = _inputs((100,), seed=3)
    config = CONFIGS["act64:2:8"]
    sparse_compile.ops.spec.warn_dense_fallback.cache_clear()
    with pytest.warns(UserWarning, match="T=100 tokens.*not a multiple of V=64"):
        y, leaves = run_op(x, w1, b1, w2, b2, config)
    y_plain = torch.nn.functional.linear(torch.relu(torch.nn.functional.linear(x, w1, b1)) ** 2, w2, b2)
    torch.testing.assert_close(y, y_plain, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "mutate, match",
    [
        (lambda a: (a[0].double(), *a[1:]), "dtype"),
        (lambda a: (a[0], a[1].half(), *a[2:]), "dtype"),
        (lambda a: (a[0][..., :16], *a[1:]), "shapes do not chain"),
    ],
)
def test_op_rejects_bad_input(mutate, match):
    args = mutate(_inputs((64,)))
    with pytest.raises(ValueError, match=match):
        torch.ops.sparse_compile.sqrelu_ffn(*args, CONFIGS["venom"].op_spec())


def test_op_rejects_integer_tensors():
    x = torch.randint(0, 4, (64, 32))
    with pytest.raises(ValueError, match=r"x.dtype=torch.int64"):
        torch.ops.sparse_compile.sqrelu_ffn(x, x[:8].T.contiguous(), None, x[:8], None, CONFIGS["venom"].op_spec())


@pytest.mark.parametrize("config", ["act64:2:8", "act24"])
def test_float32_weights_are_cast_inside_and_kept_for_backward(config):
    """x in bf16 with float32 weights (what the rewrite passes under autocast): the same output and,
    in float32, the same gradients as the op on weights cast beforehand, bit for bit; and what
    autograd keeps for backward is the float32 parameters themselves, no bf16 copies of them."""
    x, *params = _inputs((256,))  # x [256, 32]: no parameter's shape
    x = x.bfloat16()
    spec = CONFIGS[config].op_spec()
    saved = []

    def pack(t):
        saved.append(t)
        return t

    outs = {}
    for label, cast in (("inside", lambda p: p), ("outside", lambda p: p.bfloat16())):
        leaves = [t.detach().clone().requires_grad_(True) for t in (x, *params)]
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            y, _ = torch.ops.sparse_compile.sqrelu_ffn(leaves[0], *(cast(p) for p in leaves[1:]), spec)
        if label == "inside":
            kept = [t for t in saved if t.dim() == 2 and t.shape in {p.shape for p in params}]
            assert kept and all(t.dtype == torch.float32 for t in kept)
            assert {t.data_ptr() for t in kept} == {leaves[1].data_ptr(), leaves[3].data_ptr()}
        y.float().pow(2).sum().backward()
        outs[label] = (y, *(t.grad for t in leaves))
    for a, b in zip(outs["inside"], outs["outside"], strict=True):
        assert a.dtype == b.dtype and torch.equal(a, b)
