"""SparsityConfig.score_units: per-token chunks ranked on each chunk's first r units, not all of them.

The mask against the token-by-token definition, the kept mass it gives up, causality by perturbation
through torch.compile, the compiled model against the oracle, the chunk fallback, the report and the
config errors."""

import pytest
import torch

from sparse_compile import SparsityConfig, compile_reports
from sparse_compile.clustering import kept_mass
from sparse_compile.kernels import vnm_mask
from sparse_compile.passes.legality import fitted_units

from .oracle import oracle_keep, score_units_loop
from .test_backend import assert_compiled_matches_oracle
from .test_causal import _FFN, outputs_up_to


@pytest.mark.parametrize(("m", "c", "r"), [(8, 8, 1), (8, 8, 3), (16, 4, 2), (8, 16, 5)])
def test_mask_is_each_tokens_chunks_by_their_first_units(m, c, r):
    g = torch.Generator().manual_seed(m * 100 + c * 10 + r)
    h = torch.relu(torch.randn(48, 2 * m * c, generator=g)) ** 2  # two groups of M chunks per token
    keep = vnm_mask(h, 1, 4, m, c, score_units=r)
    assert torch.equal(keep, score_units_loop(h, m, c, r))
    assert torch.equal(keep.reshape(48, -1, c).sum(-1) % c, torch.zeros(48, 2 * m, dtype=torch.long))  # whole chunks
    assert torch.equal(keep.sum(1), torch.full((48,), 2 * 4 * c))  # 4 chunks per group
    full = vnm_mask(h, 1, 4, m, c)  # every unit scores: the token's own best chunks
    assert not torch.equal(keep, full)  # a few units rank some tokens' chunks otherwise
    assert torch.equal(vnm_mask(h, 1, 4, m, c, score_units=c), full)


def test_ties_go_to_the_lower_chunk():
    g = torch.Generator().manual_seed(3)
    h = torch.randint(0, 3, (32, 128), generator=g).float()  # many equal chunk scores
    for r in (1, 2, 7):
        assert torch.equal(vnm_mask(h, 1, 4, 16, 8, score_units=r), score_units_loop(h, 16, 8, r))


def test_kept_mass_is_at_most_the_whole_h_choice():
    """With N = 4 a token keeps whole chunks, so ranking them on all their units keeps the most of its H."""
    g = torch.Generator().manual_seed(5)
    h = torch.relu(torch.randn(64, 256, generator=g)) ** 2
    full = kept_mass([h], (1, 4, 16), 16)
    for r in (1, 4, 8):
        part = kept_mass([h], (1, 4, 16), 16, units=r)
        keep = score_units_loop(h, 16, 16, r)
        assert part == pytest.approx(((h * keep).sum() / h.sum()).item())
        assert part < full


def test_compiled_outputs_ignore_later_tokens():
    """Causality by perturbation: tokens after position 40 changed, outputs up to 40 bit-identical."""
    assert outputs_up_to({"activations": "1:4:8", "chunk": 4, "score_units": 2}) == (True, False)


def test_compiled_model_matches_the_oracle_on_the_reference():
    from .test_backend import Stack

    config = SparsityConfig(activations="1:4:8", chunk=4, score_units=1)
    x = torch.randn(2, 32, 32, generator=torch.Generator().manual_seed(11))
    fc = Stack().blocks[0].fc  # the first site's weights, as the compiled model has them
    with torch.no_grad():
        h = (torch.relu(fc(x)) ** 2).reshape(64, -1)
    # on the first site's own H the choice differs from the whole-H one, so a site that ignored score_units fails
    assert not torch.equal(oracle_keep(h, config, None), vnm_mask(h, 1, 4, 8, 4))
    report = assert_compiled_matches_oracle(config, x, 1e-4)
    assert [s.kernel for s in report.sparse_sites] == ["reference", "reference"]
    assert report.sparse_sites[0].patterns["F2"] == "A1:4:8c4 u1"
    assert "score_units=1" in str(report)


def test_a_smaller_fallback_chunk_keeps_the_share_of_scoring_units():
    assert fitted_units(None, 128, 64) is None
    assert fitted_units(32, 128, 128) == 32
    assert fitted_units(32, 128, 64) == 16
    assert fitted_units(8, 256, 16) == 1  # at least one unit
    # hidden 384 with M = 8: chunks of 32 need 256 | h, so the site runs chunks of 16, ranked on 1 unit, not 2
    model = _FFN(h=384)
    x = torch.randn(64, 32, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        y = torch.compile(model, backend="sparse", options={"activations": "1:4:8", "chunk": 32, "score_units": 2})(x)
        h = torch.relu(model.fc(x)) ** 2
        want = model.proj(h * score_units_loop(h, 8, 16, 1))
    torch.testing.assert_close(y, want, rtol=1e-5, atol=1e-5)
    report = compile_reports()[-1]
    assert "chunks of 16, not 32" in str(report) and "ranked on its first 1 unit(s), not 2" in str(report)
    assert report.sparse_sites[0].patterns["F2"] == "A1:4:8c16 u1"
    # 20 of 32 units: 10 of the fallback's 16, not a failure; 1 of 32 stays 1 and adds no note
    torch.compile(_FFN(h=384), backend="sparse", options={"activations": "1:4:8", "chunk": 32, "score_units": 20})(x)
    assert compile_reports()[-1].sparse_sites[0].patterns["F2"] == "A1:4:8c16 u10"
    torch.compile(_FFN(h=384), backend="sparse", options={"activations": "1:4:8", "chunk": 32, "score_units": 1})(x)
    assert "unit(s), not" not in str(compile_reports()[-1])


def test_the_op_spec_carries_score_units():
    from sparse_compile.contract import op_spec
    from sparse_compile.ops.spec import parse_spec

    assert parse_spec(op_spec(SparsityConfig(activations="1:4:8", chunk=8, score_units=3))).score_units == 3
    assert parse_spec(op_spec(SparsityConfig(activations="1:4:8", chunk=8))).score_units is None


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"activations": "1:4:8", "chunk": 8, "score_units": 0}, r"score_units=0: expected None or an int >= 1"),
        ({"activations": "1:4:8", "chunk": 8, "score_units": "2"}, r"score_units='2': expected None or an int"),
        ({"activations": "1:4:8", "chunk": 8, "score_units": True}, r"score_units=True: expected None or an int"),
        ({"activations": "1:4:8", "chunk": 8, "score_units": 8}, r"score_units=8 needs .*\[1, chunk - 1\].*chunk=8"),
        ({"activations": "16:4:8", "chunk": 8, "score_units": 2}, r"score_units=2 needs per-token chunks.*'16:4:8'"),
        ({"activations": "1:4:8", "score_units": 2}, r"score_units=2 needs per-token chunks.*chunk=1"),
        ({"activations": "2:4", "score_units": 1}, r"score_units=1 needs per-token chunks.*'2:4'"),
    ],
)
def test_config_errors_name_the_value(fields, match):
    with pytest.raises(ValueError, match=match):
        SparsityConfig(**fields)


def test_recluster_puts_each_per_token_chunks_heaviest_units_first():
    """With permute, the units score_units reads are each co-firing chunk's heaviest in the refit's sample."""
    import sparse_compile

    options = {"activations": "1:4:8", "chunk": 4, "permute": True, "score_units": 1}
    model = _FFN()
    compiled = torch.compile(model, backend="sparse", options=options)
    x = torch.randn(64, 32)
    with sparse_compile.probe_units(), torch.no_grad():
        compiled(x)
    assert len(sparse_compile.recluster()) == 1  # the one site, refitted
    (perm,) = sparse_compile.unit_permutations().values()
    with torch.no_grad():
        mass = (torch.relu(model.fc(x)) ** 2).sum(0)  # each unit's mass over the sample (V = 1: per token)
    for chunk in perm.reshape(-1, 4).tolist():  # non-increasing mass, up to the sums' float order
        masses = mass[chunk]
        assert (masses[1:] <= masses[:-1] * (1 + 1e-5)).all(), chunk
    sparse_compile.reset_units()
