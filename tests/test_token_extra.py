"""SparsityConfig.token_extra: a block's choice plus each token's own largest units outside it.

The mask against the row-by-row definition, the kept mass it adds, causality by perturbation
through torch.compile, the compiled model against the oracle, the report and the config errors."""

import pytest
import torch

from sparse_compile import SparsityConfig, compile_reports
from sparse_compile.clustering import kept_mass
from sparse_compile.kernels import vnm_mask, with_token_extra

from .oracle import token_extra_loop
from .test_backend import assert_compiled_matches_oracle
from .test_causal import _FFN, outputs_up_to


@pytest.mark.parametrize("r", [0, 1, 5, 40])
def test_extra_units_are_each_rows_largest_outside_the_block_choice(r):
    g = torch.Generator().manual_seed(r)
    h = torch.relu(torch.randn(64, 48, generator=g)) ** 2  # about half of H exactly zero, as relu^2 gives
    keep = vnm_mask(h, 16, 4, 16, 1, 32)  # causal blocks of 16 keep 4 of every 16 units
    out = with_token_extra(h, keep, r)
    assert torch.equal(out, token_extra_loop(h, keep, r))
    assert torch.equal(out & keep, keep)  # the block's choice stays
    added = (out & ~keep).sum(1)
    outside = ((h > 0) & ~keep).sum(1)
    assert torch.equal(added, outside.clamp(max=r))  # r per row, or every positive unit left
    if r:
        assert (h * out).sum() > (h * keep).sum()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_ties_go_to_the_lower_index(dtype):
    """Integer-valued H (many equal entries) and bf16 H: the row-by-row definition, ties included."""
    g = torch.Generator().manual_seed(7)
    h = torch.randint(0, 4, (64, 48), generator=g).to(dtype)
    keep = vnm_mask(h.float(), 16, 4, 16, 1, 32)
    for r in (3, 8):
        assert torch.equal(with_token_extra(h, keep, r), token_extra_loop(h, keep, r))
    hb = (torch.relu(torch.randn(64, 256, generator=g)) ** 2).to(dtype)
    keep = vnm_mask(hb.float(), 16, 4, 16, 1, 32)
    assert torch.equal(with_token_extra(hb, keep, 16), token_extra_loop(hb, keep, 16))


def test_kept_mass_counts_the_extra_units():
    g = torch.Generator().manual_seed(1)
    h = torch.relu(torch.randn(64, 64, generator=g)) ** 2
    base = kept_mass([h], (16, 4, 16), 1, seq=32)
    more = kept_mass([h], (16, 4, 16), 1, seq=32, extra=4)
    keep = token_extra_loop(h, vnm_mask(h, 16, 4, 16, 1, 32), 4)
    assert more == pytest.approx(((h * keep).sum() / h.sum()).item())
    assert more > base


def test_compiled_outputs_ignore_later_tokens():
    """Causality by perturbation: tokens after position 40 changed, outputs up to 40 bit-identical."""
    assert outputs_up_to({"activations": "16:2:8", "causal": True, "token_extra": 3}) == (True, False)


@pytest.mark.parametrize(
    "config",
    [
        SparsityConfig(activations="16:2:8", causal=True, token_extra=4),
        SparsityConfig(activations="16:4:8", chunk=16, causal=True, score_rows=4, token_extra=8),
    ],
    ids=["units", "chunks"],
)
def test_compiled_model_matches_the_oracle_on_the_reference(config):
    report = assert_compiled_matches_oracle(config, torch.randn(2, 32, 32), 1e-4)
    assert [s.kernel for s in report.sparse_sites] == ["reference", "reference"]
    assert report.sparse_sites[0].patterns["F2"].endswith(f"+{config.token_extra}/token")
    assert f"token_extra={config.token_extra}" in str(report)


def test_the_gather_path_is_not_taken(interpreter):
    from sparse_compile.planning.plan import plan_kernels

    config = SparsityConfig(activations="16:4:8", chunk=16, causal=True, token_extra=2, kernels="triton")
    plan = plan_kernels(torch.device("cpu"), torch.float16, 256, config)
    assert plan.kernel == "reference" and plan.why.startswith("token_extra=2: no fast kernel")
    torch.compile(_FFN(), backend="sparse", options={"activations": "16:2:8", "token_extra": 2})(torch.randn(64, 32))
    assert "token_extra=2" in str(compile_reports()[-1])


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"activations": "16:2:8", "token_extra": -1}, r"token_extra=-1: expected an int >= 0"),
        ({"activations": "16:2:8", "token_extra": "8"}, r"token_extra='8': expected an int >= 0"),
        ({"activations": "16:2:8", "token_extra": True}, r"token_extra=True: expected an int >= 0"),
        ({"activations": "2:4", "token_extra": 8}, r"token_extra=8 needs V:N:M activations with V > 1.*'2:4'"),
        ({"activations": "1:4:8", "chunk": 16, "token_extra": 8}, r"token_extra=8 needs .*'1:4:8'"),
        ({"activations": "16:4:8", "chunk": 16, "routes": 4, "token_extra": 8}, r"routes=4"),
    ],
)
def test_config_errors_name_the_value(fields, match):
    with pytest.raises(ValueError, match=match):
        SparsityConfig(**fields)
