"""SparsityConfig.mass_loss: the gradient of lambda * mean_t(dropped mass / whole mass) added in the backward.

The reference kernels' gradients against autograd of the written-out loss, the forward unchanged, the
compiled model against an eager model with the loss, the plan and report, and the config errors."""

import copy

import pytest
import torch
import torch.nn.functional as F

import sparse_compile
from sparse_compile import SparsityConfig, compile_reports
from sparse_compile.kernels import vnm_mask
from sparse_compile.kernels.ffn_reference import mass_loss_grad, sqrelu_ffn_backward_ref, sqrelu_ffn_forward_ref
from sparse_compile.ops.spec import parse_spec
from sparse_compile.planning.plan import plan_kernels

from .oracle import oracle_keep
from .test_backend import Stack, grads
from .test_causal import _FFN

# (pattern, chunk, causal sequence length, score_units): per-token chunks, a causal block pattern, scored chunks
PATTERNS = [((1, 4, 16), 4, None, None), ((16, 2, 8), 1, 32, None), ((1, 4, 8), 8, None, 3), ((1, 2, 4), 1, None, None)]


def mass_term(h: torch.Tensor, keep: torch.Tensor, lam: float) -> torch.Tensor:
    """lambda * mean over tokens of sum_dropped H / sum H, the whole mass held constant (its definition)."""
    whole = h.sum(1).detach()
    dropped = (h * ~keep).sum(1)
    return lam * torch.where(whole > 0, dropped / torch.where(whole > 0, whole, 1.0), 0.0).mean()


@pytest.mark.parametrize(
    ("pattern", "chunk", "seq", "units"), PATTERNS, ids=["tokens", "causal-blocks", "scored", "2:4"]
)
@pytest.mark.parametrize("lam", [0.05, 3.0])
def test_backward_is_the_gradient_of_the_loss_plus_the_mass_term(pattern, chunk, seq, units, lam):
    g = torch.Generator().manual_seed(int(lam * 100) + chunk)
    t, d, h = 64, 24, 256
    x, dy = torch.randn(t, d, generator=g, dtype=torch.float64), torch.randn(t, 20, generator=g, dtype=torch.float64)
    w1 = torch.randn(h, d, generator=g, dtype=torch.float64) / 5
    b1 = torch.randn(h, generator=g, dtype=torch.float64) / 5
    w2 = torch.randn(20, h, generator=g, dtype=torch.float64) / 16
    y, signed = sqrelu_ffn_forward_ref(x, w1, b1, w2, None, pattern, chunk, seq, None, 0, units, signed=True)
    dx, dw1, db1, dw2, _ = sqrelu_ffn_backward_ref(dy, x, w1, w2, signed, mass_loss=lam)

    leaves = [p.clone().requires_grad_(True) for p in (x, w1, b1, w2)]
    xl, w1l, b1l, w2l = leaves
    hh = torch.relu(F.linear(xl, w1l, b1l)) ** 2
    keep = vnm_mask(hh.detach(), *pattern, chunk, seq, score_units=units)
    y_ref = F.linear(hh * keep, w2l)
    ((y_ref * dy).sum() + mass_term(hh, keep, lam)).backward()
    torch.testing.assert_close(y, y_ref.detach(), rtol=1e-12, atol=1e-12)
    for got, ref in zip((dx, dw1, db1, dw2), leaves, strict=True):
        torch.testing.assert_close(got, ref.grad, rtol=1e-6, atol=1e-6)  # dZ's product runs in float32

    _, plain = sqrelu_ffn_forward_ref(x, w1, b1, w2, None, pattern, chunk, seq, None, 0, units)
    assert torch.equal(signed.clamp_min(0), plain) and (signed < 0).any()  # R~, and the dropped R negated
    without = sqrelu_ffn_backward_ref(dy, x, w1, w2, plain)
    assert (without[1] - dw1).abs().max() > 1e-3 * lam  # the term moves W1's gradient
    assert torch.equal(without[3], dw2)  # and only through dZ: W2 sees the kept H alone


def test_the_term_per_token_zero_kept_and_tiny_mass():
    """Zero-mass tokens and all-kept tokens get nothing; a token with tiny mass gets (lambda / T) 2 R / S_t, large
    but finite (the definition, not clipped)."""
    signed = torch.zeros(4, 32, dtype=torch.float64)
    signed[1, :8] = -torch.rand(8, dtype=torch.float64) - 0.1  # a token whose mass is all dropped
    signed[2, 8:16] = torch.rand(8, dtype=torch.float64) + 0.1  # one whose mass is all kept
    signed[3, 20] = -1e-4  # one whose only, dropped, unit is tiny
    kept, dz = mass_loss_grad(signed, 1.0)
    assert torch.equal(kept, signed.clamp_min(0)) and torch.isfinite(dz).all()
    assert dz[[0, 2]].abs().sum() == 0 and (dz[1, :8] > 0).all()
    torch.testing.assert_close(dz[1, :8], 2 * signed[1, :8].abs() / (signed[1] ** 2).sum() / 4)
    assert dz[3, 20].item() == pytest.approx(2 / 1e-4 / 4) and dz[3].count_nonzero() == 1


def test_on_sampled_rows_the_term_is_their_mean():
    """rows: (lambda / n) 2 R / S_t on the n sampled rows, 0 elsewhere; autograd of lambda * their mean dropped
    share."""
    g = torch.Generator().manual_seed(9)
    r = torch.relu(torch.randn(48, 64, generator=g, dtype=torch.float64))
    keep = vnm_mask(r * r, 16, 4, 16, 4, 48, 8)  # causal blocks of 16 in chunks of 4, scored on 8 rows
    rows = torch.arange(48) % 16 >= 8
    _, dz = mass_loss_grad(torch.where(keep, r, -r), 0.7, rows)
    z = r.clone().requires_grad_(True)
    h = torch.relu(z) ** 2
    mass_term(h[rows], keep[rows], 0.7).backward()
    torch.testing.assert_close(dz, z.grad, rtol=1e-12, atol=1e-12)
    assert dz[~rows].abs().sum() == 0 and dz[rows].abs().sum() > 0


@pytest.mark.parametrize("kernels", ["auto", "triton"], ids=["reference", "gather"])
def test_compiled_model_on_scoring_rows_matches_eager_math(kernels, monkeypatch):
    """mass_loss_rows='scoring': the compiled Stack against eager math with each site's term over the last
    score_rows rows of every block and each sequence's first token; on the reference kernels (auto on CPU) and on
    the chunked gather path (triton, interpreted: dZ on the scoring rows from the forward's Z, added by its own
    GEMMs in the backward, kernels/scored_mass_loss.py)."""
    from sparse_compile.planning.plan import GATHER

    if kernels == "triton":
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    options = {"activations": "16:4:8", "chunk": 16, "causal": True, "score_rows": 4, "mass_loss": 0.5,
               "mass_loss_rows": "scoring", "kernels": kernels}  # fmt: skip
    config = SparsityConfig(**options)
    model, ref, plain = Stack(), Stack(), Stack()
    g = torch.Generator().manual_seed(5)
    x, gy = torch.randn(2, 32, 32, generator=g), torch.randn(2, 32, 32, generator=g)
    out = torch.compile(model, backend="sparse", options=options)(x)
    (out * gy).sum().backward()
    rows = (torch.arange(64) % 16 >= 12) | (torch.arange(64) % 32 == 0)  # the scoring rows, each sequence's first
    h_in, term = x, 0.0
    for b in ref.blocks:
        hh = torch.relu(b.fc(h_in)) ** 2
        h2 = hh.reshape(-1, hh.shape[-1])
        keep = oracle_keep(h2.detach(), config, 32)
        term = term + mass_term(h2[rows], keep[rows], config.mass_loss)
        h_in = h_in + b.proj((h2 * keep).reshape(hh.shape))
    ((h_in * gy).sum() + term).backward()
    torch.testing.assert_close(out, h_in, rtol=1e-5, atol=1e-5)
    for k, want in grads(ref).items():
        torch.testing.assert_close(grads(model)[k], want, rtol=1e-4, atol=1e-5, msg=k)
    without = torch.compile(plain, backend="sparse", options=options | {"mass_loss": 0.0, "mass_loss_rows": "all"})
    (without(x) * gy).sum().backward()
    moved = grads(plain)["blocks.0.fc.weight"] - grads(model)["blocks.0.fc.weight"]
    assert moved.abs().max() > 1e-3  # the term reaches W1's gradient
    report = compile_reports()[-2]
    assert "mass_loss=0.5 on scoring rows" in str(report)
    assert [s.kernel for s in report.sparse_sites] == ([GATHER] * 2 if kernels == "triton" else ["reference"] * 2)
    spec = "weights=none;activations=16:4:8;kernels=auto;weight_grad=dense;dense_frac=0.02;mass_loss_rows=scoring"
    with pytest.raises(ValueError, match="mass_loss_rows='scoring'; allowed: 'all', or 'scoring' with score_rows"):
        parse_spec(spec)


def test_scored_dz_is_the_reference_term_on_the_scoring_rows():
    """kernels/scored_mass_loss.py: mass_dz_ref on Z's scoring rows equals mass_loss_grad's term on those rows (0 on
    the others), and add_mass_grads adds its products with W1 and x's rows to dX, dW1, db1."""
    from sparse_compile.kernels.scored_mass_loss import add_mass_grads, scoring_row_index
    from sparse_compile.kernels.scored_mass_loss import mass_dz_ref as mass_dz

    g = torch.Generator().manual_seed(11)
    t, d, h, v, c, seq, s = 96, 24, 64, 16, 4, 48, 3
    z = torch.randn(t, h, generator=g, dtype=torch.float64)
    z[5] = -1.0  # a row without mass (not a scoring row) and a scoring row without mass
    z[15] = -1.0
    r = torch.relu(z)
    keep = vnm_mask(r * r, v, 4, 8, c, seq, s)
    ids = torch.stack([keep[b * v].nonzero().squeeze(1) for b in range(t // v)]).int()
    rows = scoring_row_index(t, v, s, seq, z.device)
    assert rows.tolist() == [b * v + i for b in range(t // v) for i in range(v - s, v)] + [0, 48]
    mask = torch.zeros(t, dtype=torch.bool)
    mask[rows] = True
    _, want = mass_loss_grad(torch.where(keep, r, -r), 0.3, mask)
    got = mass_dz(z[rows], ids, v, s, seq, 0.3)
    assert got.dtype == z.dtype and got[(rows == 15).nonzero().item()].abs().sum() == 0
    torch.testing.assert_close(got, want[rows], rtol=1e-12, atol=1e-15)
    assert got.abs().sum() > 0 and torch.equal(got != 0, (~keep[rows]) & (r[rows] > 0))

    x, w1 = torch.randn(t, d, generator=g, dtype=torch.float64), torch.randn(h, d, generator=g, dtype=torch.float64)
    dx, dw1, db1 = (torch.randn(*shape, generator=g, dtype=torch.float64) for shape in ((t, d), (h, d), (h,)))
    full = torch.zeros(t, h, dtype=torch.float64)
    full[rows] = got
    wants = (dx + full @ w1, dw1 + full.t() @ x, db1 + full.sum(0))
    add_mass_grads(dx, dw1, db1, got, x, w1, v, s, seq)
    for a, b in zip((dx, dw1, db1), wants, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match=r"mass_dz_ref: zs \(19, 64\); expected 20 rows"):
        mass_dz(z[:19], ids, v, s, seq, 0.3)
    with pytest.raises(ValueError, match=r"add_mass_grads: dz_s \(5, 64\); expected \[20, 64\]"):
        add_mass_grads(dx, dw1, db1, got[:5], x, w1, v, s, seq)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_the_mass_dz_kernel_equals_its_reference(interpreter, dtype):
    """kernels/mass_dz_triton.py (interpreted) against mass_dz_ref on random Z_s: rows of blocks and each sequence's
    first token, a row without mass, h not a multiple of the kernel's tile; a wrong row -> block map fails."""
    from sparse_compile.kernels.mass_dz_triton import mass_dz
    from sparse_compile.kernels.scored_mass_loss import mass_dz_ref

    g = torch.Generator().manual_seed(13)
    t, h, v, c, seq, s = 96, 1536, 16, 64, 48, 3
    z = torch.randn(t, h, generator=g)
    keep = vnm_mask(torch.relu(z) ** 2, v, 4, 8, c, seq, s)
    ids = torch.stack([keep[b * v].nonzero().squeeze(1) for b in range(t // v)]).int()
    zs = torch.randn(t // v * s + t // seq, h, generator=g).to(dtype)
    zs[4] = -1.0  # no mass
    got, want = mass_dz(zs, ids, v, s, seq, 0.7), mass_dz_ref(zs, ids, v, s, seq, 0.7)
    assert got.dtype == dtype and got[4].abs().sum() == 0 and got.abs().sum() > 0
    torch.testing.assert_close(got, want, rtol=1e-5 if dtype == torch.float32 else 2e-3, atol=1e-9)
    assert torch.equal(got != 0, want != 0)
    padded = torch.zeros(zs.shape[0], h + 40, dtype=dtype)
    padded[:, 3 : 3 + h] = zs
    view = padded[:, 3 : 3 + h]  # a row stride other than h
    assert view.stride(0) == h + 40 and torch.equal(mass_dz(view, ids, v, s, seq, 0.7), got)
    with pytest.raises(ValueError, match=r"mass_dz: zs \(19, 1536\) .*expected 20 rows"):
        mass_dz(zs[:19], ids, v, s, seq, 0.7)
    with pytest.raises(ValueError, match=r"seq=40"):
        mass_dz(zs, ids, v, s, 40, 0.7)


@pytest.mark.parametrize("scored", [False, True], ids=["per-token-reference", "scored-gather"])
def test_a_permuted_site_drops_in_the_permuted_order_and_the_term_follows(scored, monkeypatch):
    """permute: after a re-clustering the site keeps chunks of its fitted permutation; the compiled model's gradients
    equal eager math with that permutation's mask (scattered back to the units' own order) plus the term. Per-token
    chunks on the reference; and the chunked gather path (interpreted) with the term on the scoring rows, whose dZ and
    adds run in the permuted order before dW1, db1 are unpermuted."""
    options = {"activations": "1:4:8", "chunk": 4, "permute": True, "mass_loss": 0.5}
    mask_args, rows, kernel = (1, 4, 8, 4), slice(None), "reference"
    if scored:
        monkeypatch.setenv("TRITON_INTERPRET", "1")
        options = options | {"activations": "16:4:8", "chunk": 16, "causal": True, "score_rows": 4,
                             "mass_loss_rows": "scoring", "kernels": "triton"}  # fmt: skip
        mask_args, kernel = (16, 4, 8, 16, 32, 4), "triton gather"
        rows = (torch.arange(64) % 16 >= 12) | (torch.arange(64) % 32 == 0)
    model = _FFN()
    ref = copy.deepcopy(model)
    compiled = torch.compile(model, backend="sparse", options=options)
    g = torch.Generator().manual_seed(7)
    x, gy = torch.randn(2, 32, 32, generator=g), torch.randn(2, 32, 32, generator=g)
    with sparse_compile.probe_units(), torch.no_grad():
        compiled(x)
    assert len(sparse_compile.recluster()) == 1
    (perm,) = sparse_compile.unit_permutations().values()
    assert not torch.equal(perm.cpu(), torch.arange(128))
    (compiled(x) * gy).sum().backward()
    assert compile_reports()[-1].sparse_sites[0].kernel == kernel
    h = (torch.relu(ref.fc(x)) ** 2).reshape(-1, 128)
    keep = torch.empty_like(h, dtype=torch.bool)
    keep[:, perm] = vnm_mask(h[:, perm].detach(), *mask_args)
    y = ref.proj((h * keep).reshape(2, 32, 128))
    ((y * gy).sum() + mass_term(h[rows], keep[rows], 0.5)).backward()
    for (name, a), b in zip(model.named_parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-5, msg=name)


def test_compiled_model_matches_an_eager_model_with_the_term():
    """Stack (two residual FFNs) compiled with mass_loss against eager masked math plus each site's term."""
    options = {"activations": "1:4:8", "chunk": 4, "score_units": 2, "mass_loss": 0.7}
    config = SparsityConfig(**options)
    model, ref = Stack(), Stack()
    x, gy = torch.randn(2, 32, 32), torch.randn(2, 32, 32)
    out = torch.compile(model, backend="sparse", options=options)(x)
    (out * gy).sum().backward()
    h_in, term = x, 0.0
    for b in ref.blocks:
        hh = torch.relu(b.fc(h_in)) ** 2
        h2 = hh.reshape(-1, hh.shape[-1])
        keep = oracle_keep(h2.detach(), config, None)
        term = term + mass_term(h2, keep, config.mass_loss)
        h_in = h_in + b.proj((h2 * keep).reshape(hh.shape))
    ((h_in * gy).sum() + term).backward()
    torch.testing.assert_close(out, h_in, rtol=1e-5, atol=1e-5)
    for k, g in grads(ref).items():
        torch.testing.assert_close(grads(model)[k], g, rtol=1e-4, atol=1e-5, msg=k)
    report = compile_reports()[-1]
    assert [s.kernel for s in report.sparse_sites] == ["reference", "reference"]
    assert "mass_loss=0.7" in str(report)


def test_the_gather_path_takes_the_scoring_rows_alone(interpreter):
    """The chunked gather path takes the term on the scoring rows where it has their H in full (causal chunks
    scored on fewer than V rows, N = 4); elsewhere the reference, and the plan says why."""
    from sparse_compile.planning.plan import GATHER

    base = {"activations": "16:4:8", "chunk": 16, "causal": True, "mass_loss": 0.1, "kernels": "triton"}
    for extra, kernel in (({"score_rows": 4, "mass_loss_rows": "scoring"}, GATHER), ({"score_rows": 4}, "reference")):
        assert plan_kernels(torch.device("cpu"), torch.float16, 256, SparsityConfig(**base, **extra)).kernel == kernel
    every = SparsityConfig(**base, score_rows=16, mass_loss_rows="scoring")
    plan = plan_kernels(torch.device("cpu"), torch.float16, 256, every)
    assert plan.kernel == "reference" and plan.why == (
        "mass_loss=0.1 on the scoring rows: the fast path has those rows' H in full only for causal V:4:M chunks "
        "scored on fewer than V rows with F1 on cuBLAS"
    )
    two = SparsityConfig(**(base | {"activations": "16:2:8"}), score_rows=4, mass_loss_rows="scoring")
    assert plan_kernels(torch.device("cpu"), torch.float16, 256, two).kernel == "reference"


def test_the_grouped_path_is_not_taken():
    config = SparsityConfig(activations="1:4:16", chunk=256, score_units=16, mass_loss=0.01, kernels="triton")
    plan = plan_kernels(torch.device("cpu"), torch.bfloat16, 4096, config, 1024, 4096, 1024)
    assert plan.kernel == "reference" and plan.why == "mass_loss=0.01: its gradient needs H in full (F1 dense)"
    both = SparsityConfig(activations="16:4:8", chunk=16, causal=True, token_extra=2, mass_loss=0.1, kernels="triton")
    why = plan_kernels(torch.device("cpu"), torch.float16, 256, both).why
    assert why == (
        "token_extra=2: no fast kernel takes per-token extra units; "
        "mass_loss=0.1: its gradient needs H in full (F1 dense)"
    )


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"activations": "16:2:8", "mass_loss": -0.1}, r"mass_loss=-0.1: expected a finite float >= 0"),
        ({"activations": "16:2:8", "mass_loss": float("inf")}, r"mass_loss=inf: expected a finite float >= 0"),
        ({"activations": "16:2:8", "mass_loss": float("nan")}, r"mass_loss=nan: expected a finite float >= 0"),
        ({"activations": "16:2:8", "mass_loss": "0.1"}, r"mass_loss='0.1': expected a finite float >= 0"),
        ({"activations": "16:2:8", "mass_loss": True}, r"mass_loss=True: expected a finite float >= 0"),
        ({"weights": "2:4", "mass_loss": 0.1}, r"mass_loss=0.1 needs an activation pattern .*activations=None"),
        ({"activations": "16:4:8", "chunk": 16, "routes": 4, "mass_loss": 0.1}, r"mass_loss=0.1 needs .*routes=4"),
        ({"activations": "16:2:8", "mass_loss": 0.1, "mass_loss_rows": "some"}, r"mass_loss_rows='some': expected"),
        ({"activations": "16:2:8", "causal": True, "mass_loss_rows": "scoring"}, r"needs mass_loss > 0 and score_rows"),
        ({"activations": "16:2:8", "mass_loss": 0.1, "mass_loss_rows": "scoring"}, r"score_rows=None"),
    ],
)
def test_config_errors_name_the_value(fields, match):
    with pytest.raises(ValueError, match=match):
        SparsityConfig(**fields)
