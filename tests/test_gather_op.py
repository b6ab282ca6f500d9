"""The compact V:N:M op (Triton gather kernels) against the oracle, its dispatch, and a compiled
model on it. On CPU the kernels run in the Triton interpreter (fp32/fp16, small shapes)."""

import pytest
import torch

import sparse_compile
from sparse_compile import SparsityConfig, compile_reports
from sparse_compile.planning.plan import GATHER, W24, plan_kernels

from .oracle import oracle_ffn
from .test_backend import Stack, assert_compiled_matches_oracle
from .test_op import assert_same_function, run_op

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
CONFIGS = {
    "16:2:8": SparsityConfig(activations="16:2:8", kernels="triton"),
    "32:4:16": SparsityConfig(activations="32:4:16", kernels="triton"),
    "venom16": SparsityConfig(weights="2:4", activations="16:1:8", kernels="triton"),
}


def _inputs(shape, d=32, h=128, d_out=24, bias=True, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)

    def r(*s, scale=1.0):
        return (torch.randn(*s, generator=g) * scale).to(DEVICE, dtype)

    return (
        r(*shape, d),
        r(h, d, scale=0.2),
        r(h, scale=0.1) if bias else None,
        r(d_out, h, scale=0.1),
        (r(d_out) if bias else None),
    )


def _run_vnm(x, w1, b1, w2, b2, config, spec_suffix=""):
    named = dict(x=x, w1=w1, b1=b1, w2=w2, b2=b2)
    leaves = {k: v.detach().clone().requires_grad_(True) for k, v in named.items() if v is not None}
    ws = [
        torch.ops.sparse_compile.sparsify_weight(leaves[n], "2:4", 0.0) if config.weights else leaves[n]
        for n in ("w1", "w2")
    ]
    y, r_c, ids, _ = torch.ops.sparse_compile.sqrelu_ffn_vnm(
        leaves["x"], ws[0], leaves.get("b1"), ws[1], leaves.get("b2"), config.op_spec() + spec_suffix
    )
    return y, r_c, ids, leaves


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("shape, bias", [((64,), True), ((2, 32), False)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_vnm_op_matches_reference(name, shape, bias, dtype):
    """fp32: against the oracle. fp16: against the reference op in fp16, which computes the same Z and
    so the same masks (an fp32 oracle rounds H differently and may pick other columns at near-ties)."""
    config = CONFIGS[name]
    args = _inputs(shape, bias=bias, dtype=dtype, seed=len(shape))
    y, r_c, ids, leaves = _run_vnm(*args, config)
    v, n, m = config.activation_pattern
    assert r_c.shape == (64, 128 * 4 // m) and ids.shape == (64 // v, 128 * 4 // m) and ids.dtype == torch.int32
    assert ((r_c.reshape(64, -1, 4) != 0).sum(-1) <= n).all()  # at most N kept per row and group
    y_ref, ref = oracle_ffn(*args, config) if dtype == torch.float32 else run_op(*args, config)
    tol = dict(rtol=1e-4, atol=1e-4) if dtype == torch.float32 else dict(rtol=1e-2, atol=1e-2)
    assert_same_function(y, leaves, y_ref, ref, **tol)


@pytest.mark.parametrize("dense", ["F2", "B1", "B3", "B1+B3+F2"])
@pytest.mark.parametrize("name", ["16:2:8", "venom16"])
def test_vnm_op_with_cublas_gemms_matches_oracle(dense, name):
    """F2, B1, B3 on cuBLAS over the dense operand (what kernels="auto" picks where the gather
    kernels measure slower) compute the same function."""
    config = CONFIGS[name]
    args = _inputs((64,), seed=3)
    y, _, _, leaves = _run_vnm(*args, config, f";dense_gemms={dense}")
    assert_same_function(y, leaves, *oracle_ffn(*args, config), rtol=1e-4, atol=1e-4)


def test_op_spec_rejects_unknown_dense_gemm():
    from sparse_compile.ops import parse_spec

    assert parse_spec("weights=none;activations=16:2:8;kernels=auto;dense_gemms=B1+F2").dense_gemms == {"F2", "B1"}
    with pytest.raises(ValueError, match="dense_gemms='B2'; allowed: F2, B1, B3"):
        parse_spec("weights=none;activations=16:2:8;kernels=auto;dense_gemms=B2")


def test_act24_plan_spec_round_trip():
    from sparse_compile.contract import op_spec
    from sparse_compile.ops import parse_spec
    from sparse_compile.planning.plan import CSLT24, KernelPlan

    plan = KernelPlan(CSLT24, False, f1_alg=2, act24_alg=5)
    assert plan.op == "sqrelu_ffn_24"
    spec = parse_spec(op_spec(SparsityConfig(weights="2:4", activations="2:4"), plan))
    assert (spec.activations, spec.f1_alg, spec.act24_alg) == ((1, 2, 4), 2, 5)


def test_act24_op_rejects_a_spec_without_its_algorithm():
    x, w1, w2 = torch.randn(64, 64), torch.randn(128, 64), torch.randn(64, 128)
    spec = SparsityConfig(activations="2:4").op_spec()
    with pytest.raises(ValueError, match="needs activations=2:4, act24_alg"):
        torch.ops.sparse_compile.sqrelu_ffn_24(x, w1, None, w2, None, spec)


def test_vnm_op_registration():
    """Fake shapes, autograd and schema agree with the real op (torch.library.opcheck)."""
    x, w1, b1, w2, b2 = _inputs((32,), d=16, h=64, d_out=16)
    args = (x.requires_grad_(), w1.requires_grad_(), b1, w2.requires_grad_(), b2, CONFIGS["16:2:8"].op_spec())
    torch.library.opcheck(torch.ops.sparse_compile.sqrelu_ffn_vnm.default, args)


def test_vnm_op_registration_with_the_scored_mass_loss():
    """The same with the mass loss on the scoring rows (causal chunks scored on 4 of 16 rows): the fourth
    output, dz_s [T/V x 4 + T/seq, h], has the fake's shape."""
    x, w1, b1, w2, b2 = _inputs((2, 32), d=16, h=128, d_out=16)
    config = SparsityConfig(activations="16:4:8", chunk=16, causal=True, score_rows=4, mass_loss=0.5,
                            mass_loss_rows="scoring", kernels="triton")  # fmt: skip
    args = (x.requires_grad_(), w1.requires_grad_(), b1, w2.requires_grad_(), b2, config.op_spec())
    assert torch.ops.sparse_compile.sqrelu_ffn_vnm(*args)[3].shape == (4 * 4 + 2, 128)
    torch.library.opcheck(torch.ops.sparse_compile.sqrelu_ffn_vnm.default, args)
    spec = "weights=none;activations=16:4:8;kernels=triton;chunk=16;score_rows=4;mass_loss=0.5;mass_loss_rows=scoring"
    with pytest.raises(ValueError, match=r"causal=False, score_rows=4; the gather path takes the term on the scoring"):
        torch.ops.sparse_compile.sqrelu_ffn_vnm(x, w1, b1, w2, b2, spec)  # a spec no config writes: not causal


def test_vnm_op_rejects_partial_block():
    x, w1, b1, w2, b2 = _inputs((40,))
    with pytest.raises(ValueError, match="T=40"):
        torch.ops.sparse_compile.sqrelu_ffn_vnm(x, w1, b1, w2, b2, CONFIGS["16:2:8"].op_spec())


def test_compiled_model_on_gather_kernels():
    """torch.compile(backend='sparse', kernels='triton'): every site on the gather op, numbers = oracle."""
    report = assert_compiled_matches_oracle(CONFIGS["16:2:8"], torch.randn(2, 16, 32, device=DEVICE), 1e-4)
    assert [s.kernel for s in report.sparse_sites] == [GATHER, GATHER]
    assert GATHER in str(report)


def test_dynamic_tokens_fall_back_with_reason():
    """Dynamic T that is not provably a multiple of V: the reference op, and the report says why."""
    model = Stack().to(DEVICE)
    compiled = torch.compile(model, backend="sparse", options={"activations": "16:2:8", "kernels": "triton"})
    x = torch.randn(2, 16, 32, device=DEVICE)
    torch._dynamo.mark_dynamic(x, 1)
    compiled(x)
    sites = compile_reports()[-1].sparse_sites
    assert sites and all(s.kernel.startswith("reference") for s in sites)
    assert all("not known to be a multiple of V=16" in s.record.reason for s in sites)


def test_dynamic_batch_keeps_gather():
    """Dynamic batch over a fixed sequence of 16: T = 16 * s0 is provably a multiple of V=16."""
    model = Stack().to(DEVICE)
    compiled = torch.compile(model, backend="sparse", options={"activations": "16:2:8", "kernels": "triton"})
    x = torch.randn(2, 16, 32, device=DEVICE)
    torch._dynamo.mark_dynamic(x, 0)
    compiled(x)
    compiled(torch.randn(3, 16, 32, device=DEVICE))
    assert [s.kernel for s in compile_reports()[-1].sparse_sites] == [GATHER, GATHER]


@pytest.mark.parametrize(
    "config, dtype, tokens, kernel, why",
    [
        (SparsityConfig(activations="64:2:8"), torch.bfloat16, 128, "reference", ""),
        (SparsityConfig(activations="64:2:8", kernels="reference"), torch.bfloat16, 128, "reference", ""),
        (SparsityConfig(activations="2:4", kernels="triton"), torch.float16, 128, "reference", "2:4 activations"),
        (SparsityConfig(weights="2:4", kernels="triton"), torch.float16, 128, W24, ""),
        (
            SparsityConfig(weights="2:4", weight_grad="tokens:16:2:8", kernels="triton"),
            torch.float16,
            128,
            "reference",
            "2:4 weights alone with the token-dim",
        ),
        (SparsityConfig(activations="8:2:8", kernels="triton"), torch.float16, 128, "reference", "V=8"),
        (SparsityConfig(activations="64:2:8", kernels="triton"), torch.float16, 96, "reference", "T=96"),
        (SparsityConfig(activations="64:2:8", kernels="triton"), torch.float32, 128, GATHER, ""),
    ],
)
def test_plan_on_cpu(config, dtype, tokens, kernel, why, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # kernels="triton" on CPU tensors needs the interpreter
    plan = plan_kernels(torch.device("cpu"), dtype, tokens, config)
    assert plan.kernel == kernel and plan.gather == (kernel == GATHER) and why in plan.why
    assert plan.op == {GATHER: "sqrelu_ffn_vnm", W24: "linear_24"}.get(kernel, "sqrelu_ffn")


def test_triton_on_cpu_needs_interpreter(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        plan_kernels(torch.device("cpu"), torch.float16, 128, SparsityConfig(activations="64:2:8", kernels="triton"))


def test_kernels_option_is_validated():
    with pytest.raises(ValueError, match="kernels='fast'"):
        SparsityConfig(activations="64:2:8", kernels="fast")
    assert sparse_compile.SparsityConfig(activations="64:2:8", kernels="triton").kernels == "triton"
