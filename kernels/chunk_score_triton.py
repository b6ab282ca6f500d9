"""F1 of a causal chunked pattern scored on S < V rows: Z in full on the scoring rows only.

With the causal pattern scored on the last S rows of the previous block (kernels/activation_mask.py,
``score_rows``), the chunks block j keeps depend on S rows of H that come before it: block j - 1's last
S, or, for a sequence's first block, its first token's row. So F1 = X W1^T + b1 need not be
computed in full on every row:
  Z_s  = X[rows] W1^T + b1          cuBLAS on R = T/V x S + T/seq scoring rows (S/V of F1)
  ids  = the 4 chunks of largest L1 norm of round(relu(Z_s))^2 per (block, group), ranked as
         block_scores ranks them (float32 sums, ties to the lower chunk): the selection kernel's
         pass 1 (chunk_select_triton._choose_chunks), one launch, no host sync
  R~   = relu(round(X W1[ids]^T + b1[ids])), H~ = round(R~^2)
                                    gather_n_mm's activation epilogue (1/4 of F1 at keep 1/4)
so F1 costs about (S/V + 4/M) of the dense GEMM, and Z [T, h] is never written. The N = 4
patterns only: every entry of a kept chunk stays (N < 4 ranks entries across the 4 chunks, which
lie in different column tiles of the gather GEMM). Reference: vnm_compact_ref(z, b1, V, 4, M, c,
seq, score_rows) on the full Z (equal up to the rounding of cuBLAS against the gather GEMM).
"""

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from sparse_compile.kernels.chunk_select_triton import _choose_chunks, select_tiling
from sparse_compile.kernels.gather_gemm_triton import gather_n_mm
from sparse_compile.kernels.launch import FastLaunch


def scoring_rows(x: torch.Tensor, v: int, score_rows: int, seq: int) -> torch.Tensor:
    """x's scoring rows [T/V x S + T/seq, d]: the last ``score_rows`` rows of every block of V, block by
    block, then the first row of every sequence of ``seq`` tokens (each sequence's last block's rows
    score_rows nothing: kept to keep the layout one stride). One copy of S/V of x."""
    t, d = x.shape
    if score_rows < 1 or score_rows > v or t % seq or seq % v:
        raise ValueError(
            f"scoring_rows: score_rows={score_rows} (1..V={v}), seq={seq} (a multiple of V dividing T={t})"
        )
    return torch.cat([x.reshape(t // v, v, d)[:, v - score_rows :].reshape(-1, d), x.reshape(t // seq, seq, d)[:, 0]])


@triton.jit
def _chunk_score_kernel(
    zs_ptr, ids_ptr, stride_z, stride_ids, NB, S, SEQ_BLOCKS,
    M: tl.constexpr, C: tl.constexpr, ROWS: tl.constexpr,
):  # fmt: skip
    """Program (blk, g): block blk's 4 chunks of group g from Z_s (scoring_rows order): the S rows
    of block blk - 1, or a sequence's first block's first row (row NB * S + its sequence)."""
    blk = tl.program_id(0)
    starts = blk % SEQ_BLOCKS == 0
    src0 = tl.where(starts, NB * S + blk // SEQ_BLOCKS, (blk - 1) * S).to(tl.int64)
    scored = tl.where(starts, 1, S)
    _choose_chunks(zs_ptr, zs_ptr, ids_ptr, blk, tl.program_id(1), src0, scored, S, stride_z, stride_ids,
                   M, C, ROWS, False)  # fmt: skip


_SCORE = FastLaunch(_chunk_score_kernel)


def scored_ids(zs: torch.Tensor, t: int, v: int, m: int, c: int, seq: int, score_rows: int) -> torch.Tensor:
    """int32 [T/V, F*4/M]: the kept units of every block from Z_s (the scoring rows' Z, in
    scoring_rows order), as vnm_compact_ref(z, ..., seq, score_rows) chooses them from the full Z: one
    launch of pass 1 of the selection kernel (no host sync)."""
    nb, f = t // v, zs.shape[1]
    if zs.shape[0] != nb * score_rows + t // seq or f % (m * c) or zs.stride(1) != 1:
        raise ValueError(
            f"scored_ids: zs {tuple(zs.shape)}; expected [{nb * score_rows + t // seq}, a multiple of {m * c}]"
        )
    ids = torch.empty(nb, f * 4 // m, device=zs.device, dtype=torch.int32)
    rows, _, warps = select_tiling(m, c)
    _SCORE[(nb, f // (m * c))](
        zs, ids, zs.stride(0), ids.stride(0), nb, score_rows, seq // v, M=m, C=c, ROWS=rows, num_warps=warps
    )  # fmt: skip
    return ids


def f1_scored_chunks(
    x: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor | None, v: int, m: int, c: int, seq: int, score_rows: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(h_c, r_c, ids, z_s) of the causal V:4:M pattern in chunks of c scored on ``score_rows`` rows, for
    Z = x [T, d] w1 [h, d]^T + b1: (h_c, r_c, ids) as vnm_select_chunks(z, ...) returns them, without Z;
    z_s [T/V x S + T/seq, h]: Z on the scoring rows (scoring_rows' order; the scored mass loss reads it)."""
    t = x.shape[0]
    z_s = F.linear(scoring_rows(x, v, score_rows, seq), w1, b1)
    ids = scored_ids(z_s, t, v, m, c, seq, score_rows)
    h_c = torch.empty(t, ids.shape[1], device=x.device, dtype=x.dtype)
    r_c = gather_n_mm(x, w1, ids, v, chunk=c, act=True, bias=b1, square_out=h_c)
    return h_c, r_c, ids, z_s
