"""bench.grouped_chunks: the per-token chunk FFN it times (the library's grouped path) equals the masked
dense math, on random and on score_units choices."""

import pytest
import torch

from bench.grouped_chunks import grouped_ffn, main, masked_ffn, random_choice, scored_grouped_ffn
from sparse_compile.kernels import vnm_mask
from sparse_compile.kernels.ffn_grouped import choice_mask, chunk_choice


@pytest.mark.parametrize("c", [4, 8])
def test_grouped_chunk_ffn_matches_the_masked_reference(c):
    torch.manual_seed(c)
    t, d, h = 40, 16, 64
    e, k = h // c, h // (4 * c)
    x, dy = torch.randn(t, d), torch.randn(t, d)
    w1, w2 = torch.randn(h, d) / d**0.5, torch.randn(d, h) / h**0.5
    choice = random_choice(t, e, k, x.device)
    assert (choice.sort(1).values.diff(dim=1) > 0).all()  # k distinct chunks per token
    got = grouped_ffn(x, w1, w2, dy, choice, c)
    want = masked_ffn(x, w1, w2, dy, choice, e)
    for name, g, w in zip(("Y", "dX", "dW1", "dW2"), got, want, strict=True):
        assert g.shape == w.shape, name
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4, msg=name)
    # the mask matters: the dense FFN differs from the reference
    assert not torch.allclose(got[0], torch.relu(x @ w1.t()).square() @ w2.t(), atol=1e-3)


@pytest.mark.parametrize(("c", "r"), [(4, 1), (8, 3)])
def test_scored_choice_is_score_units_choice_and_runs_grouped(c, r):
    """The timed call keeps the chunks SparsityConfig.score_units' mask keeps (4 of every 16, ranked on each
    chunk's first r units), and equals the masked dense math on them."""
    torch.manual_seed(c + r)
    t, d, h = 48, 16, 32 * c  # 32 chunks: two groups of 16
    e = h // c
    x, dy = torch.randn(t, d), torch.randn(t, d)
    w1, w2 = torch.randn(h, d) / d**0.5, torch.randn(d, h) / h**0.5
    choice = chunk_choice(x, w1, None, 16, c, r)
    keep = choice_mask(choice, h, c)
    mask = vnm_mask(torch.relu(x @ w1.t()).square(), 1, 4, 16, c, score_units=r)
    assert torch.equal(keep, mask)
    assert not torch.equal(mask, vnm_mask(torch.relu(x @ w1.t()).square(), 1, 4, 16, c))  # r units choose otherwise
    for name, g, w in zip(("Y", "dX", "dW1", "dW2"), scored_grouped_ffn(x, w1, w2, dy, 16, c, r),
                          masked_ffn(x, w1, w2, dy, choice, e), strict=True):  # fmt: skip
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4, msg=name)


def test_score_units_flag_names_what_it_needs(capsys):
    with pytest.raises(SystemExit):
        main(["--chunks", "512", "--hidden", "4096", "--score-units", "16"])  # 8 chunks, not a multiple of 16
    assert "--score-units 16 with chunks of 512: needs hidden 4096 a multiple of 16 chunks" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--chunks", "32", "--score-units", "32"])  # R must be below the chunk
    assert "R in [1, 31]" in capsys.readouterr().err
