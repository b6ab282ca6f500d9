"""Transposable 2:4 weight mask (Hu et al., ICML 2024): pure-torch reference.

For W (R x C), every 4x4 tile keeps exactly two entries per row and two per column:
of the 90 such 0/1 patterns, the one with the largest kept sum of |w|.
Scores are one matmul: |W| tiles [n_tiles, 16] @ patterns^T [16, 90], in float64.
Ties go to the first pattern in TRANSPOSABLE_24_PATTERNS order (torch.argmax returns
the first maximum); that order is lexicographic over the four rows, each row one of
the six 2-of-4 choices in lexicographic order (0011, 0101, 0110, 1001, 1010, 1100).
"""

import itertools

import torch


def _enumerate_patterns() -> torch.Tensor:
    rows = [r for r in itertools.product((0, 1), repeat=4) if sum(r) == 2]
    tiles = [t for t in itertools.product(rows, repeat=4) if all(sum(c) == 2 for c in zip(*t, strict=True))]
    return torch.tensor(tiles, dtype=torch.float64).reshape(len(tiles), 16)


TRANSPOSABLE_24_PATTERNS: torch.Tensor = _enumerate_patterns()  # [90, 16], row-major 4x4 tiles
assert TRANSPOSABLE_24_PATTERNS.shape == (90, 16)

# Tiles scored per chunk: the [chunk, 90] float64 score matrix stays under ~190 MB.
_TILE_CHUNK = 1 << 18


def transposable_24_mask(w: torch.Tensor) -> torch.Tensor:
    """Boolean mask [R, C] of the best transposable 2:4 pattern per 4x4 tile of ``w`` [R, C]."""
    if w.dim() != 2:
        raise ValueError(f"transposable_24_mask: expected a 2-D weight, got shape {tuple(w.shape)}")
    rows, cols = w.shape
    if rows % 4 or cols % 4:
        raise ValueError(f"transposable_24_mask: weight shape {tuple(w.shape)} must have both dims multiples of 4")
    tiles = w.detach().abs().to(torch.float64).reshape(rows // 4, 4, cols // 4, 4).permute(0, 2, 1, 3).reshape(-1, 16)
    patterns = TRANSPOSABLE_24_PATTERNS.to(w.device)
    best = torch.cat([(chunk @ patterns.T).argmax(dim=1) for chunk in tiles.split(_TILE_CHUNK)])
    mask = patterns[best].bool().reshape(rows // 4, cols // 4, 4, 4).permute(0, 2, 1, 3)
    return mask.reshape(rows, cols)
