"""python -m bench.cslt_probe OUT.npz: what torch._cslt_compress writes, probed with known inputs.

cuSPARSELt does not document its compressed 2:4 layout (values + metadata), and it differs between
GPU generations. This writes, for a few small shapes (m, k) of a bf16 2:4 matrix A (2 kept per
group of 4 along k), the compressed buffer (as int16) for inputs that expose it:
  val_rc    every group keeps positions {0, 1}; value bits 0x0080 + (row * k/2 + kept index):
            where each kept value lands (labels are distinct, finite, normal bf16 numbers)
  val_rand  random patterns, values labelled the same way (does placement depend on the pattern?)
  uni_P     every group has pattern P (one of the 6 pairs), values 1.0: the metadata code of P
  bit_S_j   group g = row * k/4 + col has pattern S[0] if bit j of g is 0 else S[1] (two pairs
            S = (01, 23) and (02, 13)): which metadata bits belong to which group
  deg_*     64 x 64, group g has nonzero set g % 16 (all 16 subsets, so also groups with fewer or
            more than 2 nonzeros): zeros +0.0 (deg_pos) or -0.0 (deg_negzero), nonzeros 1.0, or
            magnitudes rising (deg_up) or falling (deg_down) with the position: which 2 are stored
and the compressed numel for larger shapes (padding). Decoded in kernels/cslt_compress_triton.py.
"""

import itertools
import sys

import numpy as np
import torch

PAIRS = list(itertools.combinations(range(4), 2))  # the 6 patterns, index = position in this list
PROBE_SHAPES = [(32, 64), (64, 64), (64, 128), (128, 64), (128, 128), (128, 256), (256, 128), (64, 256), (96, 128)]
SIZE_SHAPES = [(16, 16), (16, 32), (32, 32), (32, 128), (48, 64), (64, 96), (96, 64), (128, 192), (1024, 1024),
               (2048, 8192), (8192, 2048), (4096, 16384), (16384, 4096), (16384, 8192)]  # fmt: skip


def dense_from(patterns: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """A [m, k] bf16 from per-group pattern ids [m, k/4] and kept values [m, k/2] (bf16 bits as int16)."""
    m, g = patterns.shape
    pairs = torch.tensor(PAIRS)[patterns]  # [m, g, 2]
    bits = torch.zeros(m, g, 4, dtype=torch.int16)
    bits.scatter_(2, pairs, values.reshape(m, g, 2))
    return bits.reshape(m, 4 * g).view(torch.bfloat16)


def probes(m: int, k: int) -> dict[str, torch.Tensor]:
    g = k // 4
    labels = (0x0080 + torch.arange(m * k // 2)).to(torch.int16).reshape(m, k // 2)
    if m * k // 2 > 0x7E00:
        raise ValueError(f"{m}x{k} has too many kept values to label uniquely")
    one = torch.full((m, k // 2), 0x3F80, dtype=torch.int16)
    gen = torch.Generator().manual_seed(0)
    out = {
        "val_rc": dense_from(torch.zeros(m, g, dtype=torch.long), labels),
        "val_rand": dense_from(torch.randint(0, 6, (m, g), generator=gen), labels),
        "rand_patterns": torch.randint(0, 6, (m, g), generator=torch.Generator().manual_seed(0)),
    }
    for p in range(6):
        out[f"uni_{p}"] = dense_from(torch.full((m, g), p, dtype=torch.long), one)
    gid = torch.arange(m * g).reshape(m, g)
    splits = [(PAIRS.index((0, 1)), PAIRS.index((2, 3))), (PAIRS.index((0, 2)), PAIRS.index((1, 3)))]
    for s, (a, b) in enumerate(splits):
        for j in range(int(m * g - 1).bit_length()):
            out[f"bit_{s}_{j}"] = dense_from(torch.where((gid >> j) & 1 == 1, b, a), one)
    return out


def degenerate_probes() -> dict[str, torch.Tensor]:
    """64 x 64 inputs whose group g has nonzero set g % 16 (bit p = position p nonzero)."""
    g = torch.arange(64 * 16).reshape(64, 16, 1)
    nonzero = ((g % 16) >> torch.arange(4)) & 1 == 1  # [64, 16, 4]
    pos = torch.arange(4).expand(64, 16, 4)
    bits = {
        "deg_pos": (torch.full_like(pos, 0x3F80), 0),
        "deg_negzero": (torch.full_like(pos, 0x3F80), -0x8000),
        "deg_up": (0x3F80 + (pos << 7), 0),  # 1, 2, 4, 8
        "deg_down": (0x3F80 + ((3 - pos) << 7), 0),  # 8, 4, 2, 1
    }
    return {
        k: torch.where(nonzero, v, z).to(torch.int16).reshape(64, 64).view(torch.bfloat16) for k, (v, z) in bits.items()
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or not torch.cuda.is_available():
        print("usage: python -m bench.cslt_probe OUT.npz (on a CUDA GPU)", file=sys.stderr)
        return 2
    arrays: dict[str, np.ndarray] = {}
    for m, k in PROBE_SHAPES:
        for name, a in probes(m, k).items():
            if a.dtype == torch.bfloat16:
                c = torch._cslt_compress(a.cuda()).cpu()
                arrays[f"{m}x{k}/{name}"] = c.view(torch.int16).numpy()
            else:
                arrays[f"{m}x{k}/{name}"] = a.numpy()
    for name, a in degenerate_probes().items():
        arrays[f"64x64/{name}"] = torch._cslt_compress(a.cuda()).cpu().view(torch.int16).numpy()
    for m, k in SIZE_SHAPES + PROBE_SHAPES:
        try:
            c = torch._cslt_compress(torch.ones(m, k, dtype=torch.bfloat16, device="cuda"))
            arrays[f"size/{m}x{k}"] = np.array([c.numel(), c.element_size()])
        except RuntimeError as e:
            arrays[f"size/{m}x{k}"] = np.array([-1, 0])
            print(f"{m}x{k}: {e}".splitlines()[0])
    np.savez_compressed(argv[0], **arrays)
    print(f"wrote {len(arrays)} arrays to {argv[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
