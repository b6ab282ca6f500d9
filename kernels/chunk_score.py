"""F1 of a causal chunked pattern scored on S < V rows: Z in full on the scoring rows only.

With the causal pattern scored on the last S rows of the previous block (kernels/activation_mask.py,
``score``), the chunks block j keeps depend on S rows of H that come before it: block j - 1's last
S, or, for a sequence's first block, its first token's row. So F1 = X W1^T + b1 need not be
computed in full on every row:
  Z_s  = X[rows] W1^T + b1          cuBLAS on R = T/V x S + T/seq scoring rows (S/V of F1)
  ids  = the 4 chunks of largest L1 norm of round(relu(Z_s))^2 per (block, group), ranked as
         block_scores ranks them (float32 sums, ties to the lower chunk)
  R~   = relu(round(X W1[ids]^T + b1[ids])), H~ = round(R~^2)
                                    gather_n_mm's activation epilogue (1/4 of F1 at keep 1/4)
so F1 costs about (S/V + 4/M) of the dense GEMM, and Z [T, h] is never written. The N = 4
patterns only: every entry of a kept chunk stays (N < 4 ranks entries across the 4 chunks, which
lie in different column tiles of the gather GEMM). Reference: vnm_compact_ref(z, b1, V, 4, M, c,
seq, score) on the full Z (equal up to the rounding of cuBLAS against the gather GEMM).
"""

import torch
import torch.nn.functional as F

from sparse_compile.kernels.activation_mask import chosen_cols, kept_ids, top_k_mask
from sparse_compile.kernels.gather_gemm_triton import gather_n_mm


def scoring_rows(t: int, v: int, score: int, seq: int, device: torch.device) -> torch.Tensor:
    """int64 [T/V x S + T/seq]: the last ``score`` rows of every block of V, block by block, then the
    first row of every sequence of ``seq`` tokens (each sequence's last block's rows score nothing:
    kept to keep the layout one stride)."""
    if score < 1 or score > v or t % seq or seq % v:
        raise ValueError(f"scoring_rows: score={score} (1..V={v}), seq={seq} (a multiple of V dividing T={t})")
    blocks = torch.arange(t // v, device=device)[:, None] * v + (v - score) + torch.arange(score, device=device)
    return torch.cat([blocks.reshape(-1), torch.arange(t // seq, device=device) * seq])


def scored_ids(zs: torch.Tensor, t: int, v: int, m: int, c: int, seq: int, score: int) -> torch.Tensor:
    """int32 [T/V, F*4/M]: the kept units of every block from Z_s (the scoring rows' Z, in
    scoring_rows order), as vnm_compact_ref(z, ..., seq, score) chooses them from the full Z."""
    nb, f = t // v, zs.shape[1]
    r = torch.relu(zs)
    h = r * r  # rounded to Z's dtype, as the reference squares
    own = h[: nb * score].reshape(nb, score, f // (m * c), m, c).sum(dim=(1, 4), dtype=torch.float32)
    first = h[nb * score :].reshape(t // seq, f // (m * c), m, c).sum(dim=-1, dtype=torch.float32)
    starts = torch.arange(nb, device=zs.device) % (seq // v) == 0
    scores = torch.cat([own[:1], own[:-1]])  # block j scored by block j - 1 ...
    scores[starts] = first  # ... a sequence's first block by its first row
    return kept_ids(chosen_cols(top_k_mask(scores, 4)), m, c)


def f1_scored_chunks(
    x: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor | None, v: int, m: int, c: int, seq: int, score: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(h_c, r_c, ids) of the causal V:4:M pattern in chunks of c scored on ``score`` rows, for
    Z = x [T, d] w1 [h, d]^T + b1: as vnm_select_chunks(z, ...) returns them, without Z."""
    t = x.shape[0]
    rows = scoring_rows(t, v, score, seq, x.device)
    ids = scored_ids(F.linear(x.index_select(0, rows), w1, b1), t, v, m, c, seq, score)
    h_c = torch.empty(t, ids.shape[1], device=x.device, dtype=x.dtype)
    r_c = gather_n_mm(x, w1, ids, v, chunk=c, act=True, bias=b1, square_out=h_c)
    return h_c, r_c, ids
