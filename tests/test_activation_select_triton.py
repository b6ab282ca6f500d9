"""The fused Triton V:N:M selection against its pure-torch reference (interpreter on CPU, fp16/fp32)."""

import pytest
import torch

from sparse_compile.kernels.activation_mask import vnm_compact_abs_ref, vnm_compact_ref
from sparse_compile.kernels.activation_select_triton import vnm_select_abs, vnm_select_compact

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float16, torch.float32] + ([torch.bfloat16] if DEVICE == "cuda" else [])


def _z(t, f, dtype, seed, ties=False):
    g = torch.Generator().manual_seed(seed)
    z = torch.randint(-2, 3, (t, f), generator=g).float() if ties else torch.randn(t, f, generator=g)
    return z.to(DEVICE, dtype)


@pytest.mark.parametrize(
    "v, n, m, groups, block_g, rows",
    [  # rows = V (the default up to V=16), rows < V (several steps per pass), rows > V (masked rows)
        (1, 2, 4, 8, None, None),
        (4, 2, 8, 4, None, None),
        (4, 2, 8, 5, 2, 2),
        (2, 1, 12, 3, 1, None),
        (8, 4, 16, 3, 2, 4),
        (3, 2, 8, 6, 4, 2),
        (3, 2, 8, 6, 2, 4),
        (16, 2, 8, 2, None, None),
        (16, 2, 16, 2, None, 4),
    ],
)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("ties", [False, True])
def test_equals_reference(v, n, m, groups, block_g, rows, dtype, bias, ties):
    t, f = 3 * v, groups * m
    z = _z(t, f, dtype, v * 7 + m, ties)
    b = _z(1, f, dtype, 99, ties)[0] if bias else None
    h_c, r_c, ids = vnm_select_compact(z, b, v, n, m, block_g=block_g, rows=rows)
    ref = vnm_compact_ref(z, b, v, n, m)
    for name, got, want in zip(("h_c", "r_c", "ids"), (h_c, r_c, ids), ref, strict=True):
        assert got.dtype == want.dtype and torch.equal(got, want), name
    # invariants, checked on the output itself: 4 distinct ascending columns per block and group,
    # inside the group; at most N kept per row and group
    grouped = ids.reshape(t // v, groups, 4).long()
    assert (grouped.diff(dim=-1) > 0).all()
    assert (grouped // m == torch.arange(groups, device=DEVICE)[None, :, None]).all()
    assert ((h_c.reshape(t, groups, 4) != 0).sum(-1) <= n).all()


@pytest.mark.parametrize(
    "v, n, m, groups, block_g",
    [  # None: the default call, which takes the one-read kernel at 128:x:8, 128:x:16, 64:x:8 (ONCHIP_DEFAULT)
        (128, 2, 8, 8, None),
        (128, 1, 16, 4, None),
        (64, 4, 8, 16, None),
        (128, 4, 8, 8, 8),
        (16, 1, 16, 4, 2),
        (4, 2, 4, 2, 1),
        (32, 2, 8, 3, 1),
    ],
)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("ties", [False, True])
def test_onchip_equals_reference(v, n, m, groups, block_g, dtype, bias, ties):
    """The one-read kernel (tile on chip, kept columns by tl.gather of Z), bit for bit; on CUDA in
    bf16/fp16 its norms come from the packed 16-bit PTX path."""
    t, f = 2 * v, groups * m
    z = _z(t, f, dtype, v + m + groups, ties)
    b = _z(1, f, dtype, 98, ties)[0] if bias else None
    onchip = None if block_g is None else True
    got = vnm_select_compact(z, b, v, n, m, block_g=block_g, onchip=onchip)
    for name, a, r in zip(("h_c", "r_c", "ids"), got, vnm_compact_ref(z, b, v, n, m), strict=True):
        assert a.dtype == r.dtype and torch.equal(a, r), name


@pytest.mark.parametrize(
    "v, m, groups, block_g, match",
    [(3, 8, 4, 1, "V=3 and M=8 must be powers of two"), (4, 12, 2, 1, "M=12"), (4, 8, 3, 2, "F/M=3 a multiple")],
)
def test_onchip_rejects_what_it_cannot_tile(v, m, groups, block_g, match):
    with pytest.raises(ValueError, match=match):
        vnm_select_compact(_z(v, groups * m, torch.float16, 0), None, v, 2, m, block_g=block_g, onchip=True)


@pytest.mark.parametrize("v, n, m, groups", [(16, 2, 8, 4), (32, 1, 16, 3), (3, 2, 12, 5), (16, 4, 8, 2)])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("ties", [False, True])
def test_abs_score_equals_reference(v, n, m, groups, dtype, ties):
    """Scored by |x| and keeping the signed x (the token-dim weight-gradient approximation's
    selection), bit for bit against vnm_compact_abs_ref; negative entries can win."""
    x = _z(2 * v, groups * m, dtype, v + m, ties)
    got = vnm_select_abs(x, v, n, m)
    want = vnm_compact_abs_ref(x, v, n, m)
    for name, a, b in zip(("x_c", "ids"), got, want, strict=True):
        assert a.dtype == b.dtype and torch.equal(a, b), name
    assert (got[0] < 0).any()


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: (torch.randn(6, 16), 4, 2, 8), "T=6 is not a multiple of V=4"),
        (lambda: (torch.randn(8, 12), 4, 2, 8), "F=12 is not a multiple of M=8"),
        (lambda: (torch.randn(8, 16).double(), 4, 2, 8), "z.dtype=torch.float64"),
        (lambda: (torch.randint(0, 3, (8, 16)), 4, 2, 8), "z.dtype=torch.int64"),
        (lambda: (torch.randn(16, 8).t(), 4, 2, 8), "contiguous"),
        (lambda: (torch.randn(8, 16), 4, 3, 8), "N in"),
    ],
)
def test_rejects_illegal_input(make, match):
    z, v, n, m = make()
    with pytest.raises(ValueError, match=match):
        vnm_select_compact(z.to(DEVICE), None, v, n, m)


def test_rejects_bad_bias():
    z = torch.randn(8, 16, device=DEVICE)
    with pytest.raises(ValueError, match="bias must be contiguous"):
        vnm_select_compact(z, torch.randn(8, device=DEVICE), 4, 2, 8)
