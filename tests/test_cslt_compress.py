"""cuSPARSELt's sm90 compressed 2:4 buffer: reference and Triton kernel vs what torch._cslt_compress
wrote on a GPU (tests/data/cslt_sm90_probe_*.npz, from bench/cslt_probe.py), bit for bit."""

from pathlib import Path

import numpy as np
import pytest
import torch

from bench.cslt_probe import PROBE_SHAPES, degenerate_probes, probes
from sparse_compile.kernels.cslt_compress_triton import cslt_compress_ref, cslt_compress_triton, meta_slots, random_24

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # the kernel writes the sm90 layout on any device
DATA = sorted((Path(__file__).parent / "data").glob("cslt_sm90_probe_*.npz"))
SHAPES = [(m, k) for m, k in PROBE_SHAPES if m % 64 == 0 and k % 64 == 0]


@pytest.fixture(scope="module", params=DATA, ids=lambda p: p.stem)
def recorded(request) -> dict[str, np.ndarray]:
    with np.load(request.param) as z:
        return {k: z[k] for k in z.files}


def _bits(t: torch.Tensor) -> np.ndarray:
    return t.view(torch.int16).cpu().numpy()


def _triton(a: torch.Tensor, **kw) -> torch.Tensor:
    """The kernel on DEVICE, fed fp16 holding A's bits (the interpreter's bf16 is not trusted, and
    the layout depends only on the element size)."""
    return cslt_compress_triton(a.view(torch.int16).view(torch.float16).to(DEVICE), **kw)


@pytest.mark.parametrize("m, k", SHAPES)
def test_reference_equals_cusparselt(recorded, m, k):
    inputs = probes(m, k)
    for name, a in inputs.items():
        if a.dtype != torch.bfloat16:
            continue
        want = recorded[f"{m}x{k}/{name}"]
        got = cslt_compress_ref(a)
        assert tuple(got.shape) == want.shape and np.array_equal(_bits(got), want), name
        size = recorded[f"size/{m}x{k}"]
        assert got.numel() == size[0] and got.element_size() == size[1]


def _decode(buf: torch.Tensor, m: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes [m, k/4], value bits [m, k/4, 2]) of a buffer, through the slot map."""
    flat = buf.reshape(-1).view(torch.int16)
    words = flat[m * k // 2 :].long() & 0xFFFF
    nibbles = ((words[:, None] >> torch.tensor([0, 4, 8, 12])) & 15).reshape(-1)
    return nibbles[meta_slots(m, k).reshape(-1)].reshape(m, k // 4), flat[: m * k // 2].reshape(m, k // 4, 2)


def test_reference_equals_cusparselt_on_groups_with_fewer_or_more_nonzeros(recorded):
    """All 16 nonzero sets of a group (fewer than 2 nonzeros, as relu^2 gives, and more than 2),
    with +0.0 and -0.0 zeros and with magnitudes rising or falling along the group: the codes
    match everywhere, the values wherever the group is 2:4 (at most 2 nonzeros)."""
    if "64x64/deg_pos" not in recorded:
        pytest.skip("this probe file predates the degenerate-group probes")
    nonzeros = torch.tensor([bin(s).count("1") for s in range(16)]).repeat(64, 1)  # group (r, c) has set c
    for name, a in degenerate_probes().items():
        want_code, want_vals = _decode(torch.from_numpy(recorded[f"64x64/{name}"]), 64, 64)
        got_code, got_vals = _decode(cslt_compress_ref(a), 64, 64)
        assert torch.equal(got_code, want_code), name
        is_24 = nonzeros <= 2
        assert torch.equal(got_vals[is_24], want_vals[is_24]), name
        assert not torch.equal(got_vals, want_vals)  # cuSPARSELt's values for 3-4 nonzeros are not ours


@pytest.mark.parametrize("m, k", [(64, 64), (128, 256)])
def test_triton_equals_cusparselt(recorded, m, k):
    for name in ("val_rc", "val_rand", "uni_3", "bit_0_1", "bit_1_4"):
        assert np.array_equal(_bits(_triton(probes(m, k)[name])), recorded[f"{m}x{k}/{name}"]), name


@pytest.mark.parametrize("m, k, tiles", [(128, 192, 8), (192, 128, 2), (64, 64, 4)])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_triton_equals_reference_with_zeros(m, k, tiles, dtype):
    """Random values with a 2:4 mask and extra zeros (kept zeros, -0.0, whole zero groups), k not a
    multiple of the program's tile count."""
    g = torch.Generator().manual_seed(m * k + tiles)
    a = random_24(m, k, g).reshape(m, k // 4, 4)
    a = torch.where(torch.rand(a.shape, generator=g) < 0.3, -0.0 * a.sign(), a).reshape(m, k)
    a = a.to(dtype)
    assert np.array_equal(_bits(_triton(a, tiles=tiles)), _bits(cslt_compress_ref(a)))


def test_reference_round_trips():
    """Decoding the buffer (values and codes read back through the slot map) gives A back."""
    m, k = 128, 128
    g = torch.Generator().manual_seed(0)
    keep = torch.rand(m, k // 4, 4, generator=g).argsort(-1).argsort(-1) < 2
    a = (torch.rand(m, k // 4, 4, generator=g) + 1).mul(keep).reshape(m, k).to(torch.bfloat16)
    code, values = _decode(cslt_compress_ref(a), m, k)
    back = torch.zeros(m, k // 4, 4, dtype=torch.int16)
    back.scatter_(2, torch.stack([code & 3, code >> 2], -1), values)
    assert torch.equal(back.view(torch.bfloat16).reshape(m, k), a)


@pytest.mark.parametrize(
    "a, match",
    [
        (torch.ones(64), "2-D"),
        (torch.ones(64, 64), "float32"),
        (torch.ones(64, 128, dtype=torch.float16).t(), "contiguous"),
        (torch.ones(96, 64, dtype=torch.float16), r"\(96, 64\).*multiples of 64"),
        (torch.ones(64, 96, dtype=torch.float16), r"\(64, 96\).*multiples of 64"),
    ],
)
def test_rejects_bad_input(a, match):
    for f in (cslt_compress_ref, cslt_compress_triton):
        with pytest.raises(ValueError, match=match):
            f(a)


def test_triton_keeps_what_the_table_keeps_for_all_16_nonzero_sets():
    """Groups with 0-4 nonzeros, +-0.0, rising and falling magnitudes: kernel equals reference."""
    for name, a in degenerate_probes().items():
        assert np.array_equal(_bits(_triton(a)), _bits(cslt_compress_ref(a))), name
