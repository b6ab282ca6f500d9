"""Per-token chunks on grouped GEMMs on a real GPU: the op at 1.3B's FFN shape in bf16 against the masked
dense reference in float32 on the op's own choice (outputs poisoned first), the choice against the
reference's mask, an empty chunk's gradients, and a compiled GPT that trains on it like on the reference
kernels. Run by hand on H100/H200."""

import pytest
import torch

from sparse_compile.kernels import sqrelu_ffn_backward_ref, vnm_mask
from sparse_compile.kernels.ffn_grouped import choice_mask, chunk_choice, grouped_ffn_backward, grouped_ffn_forward
from sparse_compile.planning.plan import GROUPED

from .test_cuda_reference import _rel, assert_trains_like_reference, train_gpt
from .test_gather_gpu import _poison

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (the CPU path is in tests/)")


@pytest.mark.parametrize(("c", "r"), [(512, 16), (256, 32), (512, None)])
def test_grouped_ffn_matches_the_masked_reference_at_full_size(c, r):
    t, d, h, m = 16384, 2048, 8192, 16
    g = torch.Generator(device="cuda").manual_seed(c + (r or 0))
    rnd = lambda *s, scale=1.0: (torch.randn(*s, generator=g, device="cuda") * scale).to(torch.bfloat16)  # noqa: E731
    x, w1, b1, w2, b2 = rnd(t, d), rnd(h, d, scale=0.03), rnd(h, scale=0.1), rnd(d, h, scale=0.02), rnd(d)
    b1[c : 2 * c] = -100.0  # chunk 1 scores 0 for every token: an empty group, whose gradients must be zero
    choice = chunk_choice(x, w1, b1, m, c, r)
    assert not (choice == 1).any()
    h_ref = torch.relu(torch.nn.functional.linear(x, w1, b1)) ** 2
    keep = choice_mask(choice, h, c)
    # the same choice as the reference's mask, up to near-ties that the bf16 rounding of a different GEMM flips
    assert (keep == vnm_mask(h_ref, 1, 4, m, c, score_units=r)).all(1).float().mean() > 0.999
    _poison()
    y, rp, src, offs, inv = grouped_ffn_forward(x, w1, b1, w2, b2, choice, c)
    leaves = [a.float().requires_grad_(True) for a in (x, w1, b1, w2, b2)]
    rr = torch.relu(torch.nn.functional.linear(leaves[0], leaves[1], leaves[2])) * keep
    y_ref = torch.nn.functional.linear(rr * rr, leaves[3], leaves[4])
    assert torch.isfinite(y).all() and _rel(y, y_ref) < 1e-2
    dy = rnd(t, d)
    y_ref.backward(dy.float())
    _poison()
    grads = grouped_ffn_backward(dy, x, w1, w2, rp, src, offs, inv, c)
    for name, a, leaf in zip(("dx", "dw1", "db1", "dw2", "db2"), grads, leaves, strict=True):
        assert torch.isfinite(a).all() and _rel(a, leaf.grad) < 2e-2, name
    assert grads[1][c : 2 * c].abs().max() == 0 and grads[3][:, c : 2 * c].abs().max() == 0
    # the bf16 path's backward against the reference kernel on the same saved activations
    r_masked = torch.zeros(t, h, dtype=torch.bfloat16, device="cuda")
    r_masked[keep] = torch.relu(torch.nn.functional.linear(x, w1, b1))[keep]
    ref = sqrelu_ffn_backward_ref(dy, x, w1, w2, r_masked)
    for name, a, b in zip(("dx", "dw1", "db1", "dw2", "db2"), grads, ref, strict=True):
        assert _rel(a, b) < 2e-2, name


def test_gpt_trains_on_grouped_gemms_like_on_reference_kernels():
    """50 steps of the 4-block GPT (hidden 1024: 16 chunks of 64, 4 kept, ranked on 8 units), forced onto
    the grouped path (its chunks are narrower than auto's bound), against the reference kernels."""
    options = {"activations": "1:4:16", "chunk": 64, "score_units": 8}
    fast, kernels, _ = train_gpt({**options, "kernels": "triton"})
    assert kernels == {GROUPED}
    assert_trains_like_reference(fast, options)
