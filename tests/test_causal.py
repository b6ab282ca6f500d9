"""Causal V:N:M patterns (SparsityConfig.causal): each block's columns come from earlier tokens.

The block scores against a loop written from the definition, the mask's causality (later tokens
never change earlier rows; the non-causal pattern does), the Triton selection kernel under the
interpreter against the reference, the compiled model's outputs (early tokens blind to later ones),
config errors and the legality rule."""

import dataclasses

import pytest
import torch
from torch import nn

from sparse_compile import SparsityConfig, compile_reports
from sparse_compile.kernels.activation_mask import block_scores, vnm_compact_ref, vnm_mask
from sparse_compile.options import BackendOptions

from .oracle import oracle_ffn
from .test_gather_op import _inputs, _run_vnm
from .test_op import assert_same_function


def _scores_loop(h, v, m, seq):
    """Per block, group and column: the L1 norm the block ranks columns by, from the definition."""
    t, f = h.shape
    out = torch.zeros(t // v, f // m, m)
    for b in range(t // v):
        start = b * v
        rows = h[start : start + 1] if start % seq == 0 else h[start - v : start]
        out[b] = rows.double().sum(0).reshape(f // m, m).float()
    return out


@pytest.mark.parametrize("v, m, seq", [(16, 8, 64), (32, 16, 32), (8, 4, 128)])
def test_block_scores_follow_the_definition(v, m, seq):
    g = torch.Generator().manual_seed(v + m)
    h = torch.rand(128, 64, generator=g) ** 3
    torch.testing.assert_close(block_scores(h, v, m, seq=seq), _scores_loop(h, v, m, seq))
    own = block_scores(h, v, m)
    torch.testing.assert_close(own[1], h[v : 2 * v].sum(0).reshape(-1, m))


@pytest.mark.parametrize("n", [1, 2, 4])
def test_causal_mask_never_looks_ahead(n):
    g = torch.Generator().manual_seed(n)
    h = torch.rand(128, 64, generator=g) ** 4
    later = h.clone()
    later[40:] = torch.rand(88, 64, generator=g) ** 4  # token 40 sits inside block 2 (V=16)
    causal = vnm_mask(h, 16, n, 8, seq=64)
    assert torch.equal(causal[:40], vnm_mask(later, 16, n, 8, seq=64)[:40])
    # the plain pattern of block 2 (tokens 32..47) changes with tokens 40..47: it looks ahead
    assert not torch.equal(vnm_mask(h, 16, n, 8)[32:40], vnm_mask(later, 16, n, 8)[32:40])
    assert (causal.reshape(128, 8, 8).sum(-1) <= n).all()  # N of M per row, as ever


def test_bad_sequence_length_names_the_values():
    with pytest.raises(ValueError, match="sequences of 24 tokens: needs a multiple of V=16"):
        vnm_mask(torch.rand(48, 16), 16, 2, 8, seq=24)


@pytest.mark.parametrize("v, n, m, seq", [(16, 2, 8, 64), (32, 2, 16, 64), (16, 1, 8, 16), (16, 4, 8, 128)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("bias", [False, True])
def test_triton_selection_equals_reference(v, n, m, seq, dtype, bias):
    from sparse_compile.kernels.activation_select_triton import vnm_select_compact

    device = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator().manual_seed(v * n + m)
    z = torch.randn(128, 128, generator=g).to(device, dtype)
    b = (torch.randn(128, generator=g) * 0.1).to(device, dtype) if bias else None
    got = vnm_select_compact(z, b, v, n, m, seq=seq)
    for name, a, r in zip(("h_c", "r_c", "ids"), got, vnm_compact_ref(z, b, v, n, m, seq=seq), strict=True):
        assert torch.equal(a, r), name
    with pytest.raises(ValueError, match="no causal variant"):
        vnm_select_compact(z, b, v, n, m, onchip=True, seq=seq)


def test_gather_op_matches_oracle():
    config = SparsityConfig(activations="16:2:8", kernels="triton", causal=True)
    args = _inputs((2, 32), bias=True)
    y, _, _, leaves = _run_vnm(*args, config)
    y_ref, ref = oracle_ffn(*args, config)
    assert_same_function(y, leaves, y_ref, ref, rtol=1e-4, atol=1e-4)
    y_plain, _, _, _ = _run_vnm(*args, dataclasses.replace(config, causal=False))
    assert not torch.allclose(y, y_plain)  # the causal choice differs


class _FFN(nn.Module):
    def __init__(self, d=32, h=128):
        super().__init__()
        torch.manual_seed(0)
        self.fc, self.proj = nn.Linear(d, h), nn.Linear(h, d)

    def forward(self, x):
        return self.proj(torch.relu(self.fc(x)).square())


def outputs_up_to(options: dict, t: int = 40) -> tuple[bool, bool]:
    """Causality by perturbation: _FFN compiled with ``options`` on [2, 64, 32] inputs whose tokens after
    position ``t`` change; (outputs up to t bit-identical, outputs after t identical)."""
    compiled = torch.compile(_FFN(), backend="sparse", options=options)
    x = torch.randn(2, 64, 32)
    later = x.clone()
    later[:, t:] = torch.randn(2, 64 - t, 32)
    with torch.no_grad():
        a, b = compiled(x), compiled(later)
    return torch.equal(a[:, :t], b[:, :t]), torch.equal(a[:, t:], b[:, t:])


@pytest.mark.parametrize("causal", [True, False])
def test_compiled_model_outputs_ignore_later_tokens(causal):
    same, _ = outputs_up_to({"activations": "16:2:8", "causal": causal})
    assert same == causal
    report = compile_reports()[-1]
    assert len(report.sparse_sites) == 1
    assert ("16:2:8 causal" in str(report)) == causal


def test_sequence_not_a_multiple_of_v_stays_dense_with_reason():
    compiled = torch.compile(_FFN(), backend="sparse", options={"activations": "16:2:8", "causal": True})
    x = torch.randn(2, 24, 32)  # T = 48 = 3 blocks of 16, but each sequence is 24 tokens
    torch.testing.assert_close(compiled(x), _FFN()(x))
    report = compile_reports()[-1]
    assert not report.sparse_sites
    assert "need the sequence length (x's second-to-last dim) to be a multiple of V=16" in str(report)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"activations": "2:4", "causal": True}, "V > 1"),
        ({"weights": "2:4", "causal": True}, "V > 1"),
        ({"activations": "64:2:8", "causal": 1}, "expected True or False"),
    ],
)
def test_config_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SparsityConfig(**kwargs)


def test_op_spec_round_trip():
    from sparse_compile.ops.spec import parse_spec

    config = SparsityConfig(activations="64:2:8", causal=True)
    assert config.op_spec().endswith(";causal=1") and parse_spec(config.op_spec()).causal
    assert not parse_spec(SparsityConfig(activations="64:2:8").op_spec()).causal
    assert BackendOptions.parse({"activations": "64:2:8", "causal": True}).config.causal
