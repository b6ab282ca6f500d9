"""bench.grouped_chunks: the per-token chunk FFN on torch._grouped_mm equals the masked dense math."""

import pytest
import torch

from bench.grouped_chunks import chunk_weights, grouped_ffn, masked_ffn, random_choice, routing


@pytest.mark.parametrize("c", [4, 8])
def test_grouped_chunk_ffn_matches_the_masked_reference(c):
    torch.manual_seed(c)
    t, d, h = 40, 16, 64
    e, k = h // c, h // (4 * c)
    x, dy = torch.randn(t, d), torch.randn(t, d)
    w1, w2 = torch.randn(h, d) / d**0.5, torch.randn(d, h) / h**0.5
    choice = random_choice(t, e, k, x.device)
    assert (choice.sort(1).values.diff(dim=1) > 0).all()  # k distinct chunks per token
    src, offs, inv = routing(choice, e)
    assert torch.equal(src[inv].view(t, k), torch.arange(t)[:, None].expand(t, k))  # inv undoes the sort
    got = grouped_ffn(x, *chunk_weights(w1, w2, e), dy, src, offs, inv, k)
    want = masked_ffn(x, w1, w2, dy, choice, e)
    for name, g, w in zip(("Y", "dX", "dW1", "dW2"), got, want, strict=True):
        assert g.shape == w.shape, name
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4, msg=name)
    # the mask matters: the dense FFN differs from the reference
    assert not torch.allclose(grouped_ffn(x, *chunk_weights(w1, w2, e), dy, src, offs, inv, k)[0],
                              (torch.relu(x @ w1.t()).square() @ w2.t()), atol=1e-3)  # fmt: skip
