"""Squared-ReLU FFN with V:N:M activations on the compact operand (Triton kernels + cuBLAS).

Same math as kernels/ffn_reference.py, GEMM by GEMM (the notation of docs/design.md, "Semantics"):
  F1  Z = X W1^T + b1                   cuBLAS (W1 arrives already 2:4-masked if configured), or
                                        cuSPARSELt on the compressed W~1 when given an algorithm id
      h_c, r_c, ids = select(Z)         one memory pass (activation_select_triton.py)
      or, causal in chunks scored on S < V rows (N = 4, cuBLAS F1): Z on the scoring rows only,
      then R~ on the kept chunks by the gather-N GEMM (chunk_score_triton.py): no [T, h] Z
  F2  Y = h_c @ W2^T[ids] + b2          gather-K GEMM, K = h*4/M
  B1  dZ_c = (dY @ W2^T[ids]^T) * 2 r_c gather-N GEMM with the dZ epilogue
  B3  dX = dZ_c @ W1[ids]               gather-K GEMM
  B2  dW2 = dY^T scatter(r_c^2)         exact, cuBLAS on the dense scattered operand (or the
  B4  dW1 = scatter(dZ_c)^T X           token-dim approximation, kernels/weight_grad_gather.py)
      db1 = scatter(dZ_c).sum(0)        from the compact dZ in one launch (compact_scatter_triton.vnm_colsum)
With neuron chunks (``chunk`` c >= 16) the selection keeps whole chunks (chunk_select_triton.py)
and B2, B4 run block-sparse along tokens on the compact operands (chunk_wgrad_triton.py; db1 from
chunk_wgrad_triton.chunk_colsum over the row-tile column sums that B1's epilogue wrote, B2 on the
H~ = round(r_c^2) it wrote [T, Kc], freed before B4): no scatter, no [T, h] tensor, keep-fraction x
the dense work;
F2 and B1 read W2 in place (its kept columns are runs of c units): no transposed copy of W2.
Between forward and backward only r_c [T, h*4/M] and ids [T/V, h*4/M] are kept (not Z or H); with the
mass loss on the scoring rows (F1 on those rows alone) also its dZ_s [T/V x S + T/seq, h] (mass_dz_triton.py),
which the backward adds through two GEMMs of S/V of F1's size (kernels/scored_mass_loss.py).
``dense`` names the GEMMs of F2, B1, B3 that run on cuBLAS instead (sparse_compile/planning/gather_choice.py
measures which are faster): F2 on the scattered H, B1 as dH = dY W2 then the kept entries
(compact_dz), B3 on the scattered dZ. Same products, rounded in the same places.
"""

import torch
import torch.nn.functional as F

from sparse_compile.kernels.activation_select_triton import vnm_select_compact
from sparse_compile.kernels.chunk_score_triton import f1_scored_chunks
from sparse_compile.kernels.chunk_select_triton import chunk_supports, vnm_select_chunks
from sparse_compile.kernels.chunk_wgrad_triton import (
    chunk_colsum,
    chunk_plan,
    chunk_wgrad,
    chunk_wgrad_supports,
)
from sparse_compile.kernels.compact_scatter_triton import vnm_colsum, vnm_scatter
from sparse_compile.kernels.cslt_linear import cslt_linear
from sparse_compile.kernels.ffn_reference import weight_grads
from sparse_compile.kernels.gather_gemm_triton import gather_k_mm, gather_n_mm
from sparse_compile.kernels.mass_dz_triton import mass_dz
from sparse_compile.kernels.scored_mass_loss import add_mass_grads
from sparse_compile.kernels.transpose_triton import transpose_copy
from sparse_compile.kernels.weight_grad_gather import gather_supports, token_vnm_grad_gather


def chunk_path_supports(v: int, m: int, c: int) -> bool:
    """Whether this path runs V:N:M in chunks of c (> 1): both chunk kernels take the shape
    (c a power of two >= 16, M*c a power of two, V a multiple of 16)."""
    return chunk_supports(v, m, c) and chunk_wgrad_supports(v, c)


def f1_on_scoring_rows(v: int, n: int, chunk: int, causal: bool, score_rows: int | None, f1_alg: int | None) -> bool:
    """Whether the forward computes F1 only on the scoring rows and the kept chunks (chunk_score_triton.py)
    instead of in full: causal chunks scored on fewer than V rows, N = 4, F1 on cuBLAS."""
    return chunk > 1 and causal and score_rows is not None and score_rows < v and n == 4 and f1_alg is None


def w2t_for_gather(w2: torch.Tensor, chunk: int) -> torch.Tensor:
    """W2^T [h, d] for the gathers: with chunks (ids in runs of chunk units) the view w2.t(), read in
    place along the runs (no copy), when w2 has contiguous rows; else a contiguous copy."""
    return w2.t() if chunk > 1 and w2.stride(1) == 1 else transpose_copy(w2)


def compact_dz(dh: torch.Tensor, ids: torch.Tensor, r_c: torch.Tensor, v: int) -> torch.Tensor:
    """dZ_c [T, Kc] = dH [T, h] at the kept columns (ids [T/V, Kc]) * 2 r_c: the gather-N
    kernel's epilogue, on a dense dH (2 r_c is exact, so one rounding, as in the kernel)."""
    t, kc = r_c.shape
    cols = ids.long().unsqueeze(1).expand(t // v, v, kc)
    return dh.view(t // v, v, -1).gather(2, cols).reshape(t, kc) * (2 * r_c)


def sqrelu_ffn_forward_gather(
    x: torch.Tensor,
    w1: torch.Tensor,
    b1: torch.Tensor | None,
    w2: torch.Tensor,
    b2: torch.Tensor | None,
    v: int,
    n: int,
    m: int,
    f1_alg: int | None = None,
    dense: frozenset[str] = frozenset(),
    chunk: int = 1,
    seq: int | None = None,
    score_rows: int | None = None,
    mass_loss: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """x [T, d] -> (y [T, d_out], r_c [T, h*4/M], ids int32 [T/V, h*4/M], dz_s); ``f1_alg``: the
    cuSPARSELt algorithm of F1 (W1 2:4 along d), None for cuBLAS; "F2" in ``dense``: F2 on cuBLAS;
    ``chunk``: units per kept column (then F2 always gathers); ``seq``: the causal pattern over
    sequences of that many tokens; ``score_rows``: scored on the previous block's last that many rows
    (under V with chunks, N = 4 and cuBLAS F1: F1 on the scoring rows and the kept chunks only);
    ``mass_loss`` lambda > 0 (on that path only): dz_s [T/V x S + T/seq, h], the mass loss's dZ on the
    scoring rows (kernels/scored_mass_loss.py), else None."""
    _check_chunk(v, m, chunk, dense)
    scored = f1_on_scoring_rows(v, n, chunk, seq is not None, score_rows, f1_alg)
    if mass_loss and not scored:
        raise ValueError(
            f"ffn_gather: mass_loss={mass_loss} runs on the scoring rows of causal V:4:M chunks scored on fewer "
            f"than V rows with F1 on cuBLAS; got {v}:{n}:{m}, chunk={chunk}, seq={seq}, score_rows={score_rows}, "
            f"f1_alg={f1_alg}"
        )
    dz_s = None
    if scored:
        h_c, r_c, ids, z_s = f1_scored_chunks(x, w1, b1, v, m, chunk, seq, score_rows)
        dz_s = mass_dz(z_s, ids, v, score_rows, seq, mass_loss) if mass_loss else None
        del z_s
    else:
        z = F.linear(x, w1, b1) if f1_alg is None else cslt_linear(x, w1, b1, f1_alg)
        if chunk > 1:
            h_c, r_c, ids = vnm_select_chunks(z, None, v, n, m, chunk, seq, score_rows=score_rows)
        else:
            h_c, r_c, ids = vnm_select_compact(z, None, v, n, m, seq=seq)
        del z
    if "F2" in dense:
        y = F.linear(vnm_scatter(h_c, ids, v, m), w2, b2)
    else:
        y = gather_k_mm(h_c, ids, w2t_for_gather(w2, chunk), v, b2, chunk=chunk)
    return y, r_c, ids, dz_s


def sqrelu_ffn_backward_gather(
    dy: torch.Tensor,
    x: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    r_c: torch.Tensor,
    ids: torch.Tensor,
    v: int,
    m: int,
    weight_grad: tuple[int, int, int] | None = None,
    dense_frac: float = 0.0,
    dense: frozenset[str] = frozenset(),
    chunk: int = 1,
    db2_rows: torch.Tensor | None = None,
    mass: tuple[torch.Tensor, int, int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dx [T, d], dw1 [h, d], db1 [h], dw2 [d_out, h], db2 [d_out]) of the forward above;
    "B1" / "B3" in ``dense``: those on cuBLAS. db2 sums the rows of ``db2_rows`` (default dy: a caller
    whose dy holds copied rows passes the rows it copied them from). ``mass`` (dz_s, score_rows, seq):
    the forward's dz_s, added to dX, dW1 and db1 (kernels/scored_mass_loss.py; chunks only).

    With ``weight_grad`` (V, N, M), dw1/dw2 are the token-dim approximation: on the gather-K GEMM
    (kernels/weight_grad_gather.py) when V is a multiple of 16, else the reference's masked dense math.
    With ``chunk`` >= 16 (exact weight gradients only), B2 and B4 run block-sparse on H~ = round(r_c^2)
    (written by B1's epilogue) and dZ_c."""
    _check_chunk(v, m, chunk, dense, weight_grad)
    db2 = (dy if db2_rows is None else db2_rows).sum(0)
    if chunk > 1:  # B1 also writes its row tiles' column sums (db1's first step) and H~ = R~^2 for B2
        h_c = torch.empty_like(r_c, memory_format=torch.contiguous_format)
        w2t = w2t_for_gather(w2, chunk)
        dz_c, tile_sums = gather_n_mm(dy, w2t, ids, v, r_c, chunk=chunk, tile_sums=True, square_out=h_c)
        hidden = w1.shape[0]
        csr, order = chunk_plan(ids, chunk, hidden)  # B2's and B4's lists and program order, built once
        dw2 = chunk_wgrad(h_c, ids, dy, v, chunk, hidden, transpose=True, csr=csr, order=order)
        del h_c
        dw1 = chunk_wgrad(dz_c, ids, x, v, chunk, hidden, csr=csr, order=order)
        dx = gather_k_mm(dz_c, ids, w1.contiguous(), v, chunk=chunk)
        db1 = chunk_colsum(dz_c, ids, v, chunk, hidden, csr, tile_sums)
        if mass is not None:
            add_mass_grads(dx, dw1, db1, mass[0], x, w1, v, mass[1], mass[2])
        return dx, dw1, db1, dw2, db2
    if mass is not None:
        raise ValueError(f"ffn_gather: the mass loss's dz_s runs with chunks (chunk={chunk})")
    if "B1" in dense:
        dz_c = compact_dz(dy @ w2, ids, r_c, v)
    else:
        dz_c = gather_n_mm(dy, w2t_for_gather(w2, chunk), ids, v, r_c)
    h = vnm_scatter(r_c, ids, v, m, square=True)
    if weight_grad is None:
        dw2 = dy.t() @ h
        del h  # one dense [T, h] operand alive at a time
        dz = vnm_scatter(dz_c, ids, v, m)
        dw1 = dz.t() @ x
    elif gather_supports(weight_grad):  # the approximation on the gather-K GEMM, one operand at a time
        dw2 = token_vnm_grad_gather(h, dy, weight_grad, dense_frac).t().contiguous()
        del h
        dz = vnm_scatter(dz_c, ids, v, m)
        dw1 = token_vnm_grad_gather(dz, x, weight_grad, dense_frac)
    else:
        dz = vnm_scatter(dz_c, ids, v, m)
        dw1, dw2 = weight_grads(dy, x, h, dz, weight_grad, dense_frac)
        del h
    dx = dz @ w1 if "B3" in dense else gather_k_mm(dz_c, ids, w1.contiguous(), v)
    del dz
    return dx, dw1, vnm_colsum(dz_c, ids, v, m), dw2, db2


def _check_chunk(
    v: int, m: int, chunk: int, dense: frozenset[str], weight_grad: tuple[int, int, int] | None = None
) -> None:
    if chunk > 1 and (dense or weight_grad is not None or not chunk_path_supports(v, m, chunk)):
        raise ValueError(
            f"ffn_gather: chunk={chunk} runs with every GEMM gathered (dense={sorted(dense)}), exact weight "
            f"gradients (weight_grad={weight_grad}), chunk a power of two >= 16 and M*chunk a power of two (M={m})"
        )
