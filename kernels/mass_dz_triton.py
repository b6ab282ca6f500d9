"""The scored mass loss's dZ on the scoring rows in one Triton kernel (kernels/scored_mass_loss.py has the math).

mass_dz(zs, ids, V, S, seq, lambda) -> dZ_s [n, h] in zs' dtype, n = T/V x S + T/seq rows in scoring_rows' order:
  R = relu(Z_s);  S_t = sum_u R_tu^2 (float32);  dZ_s[t, u] = (lambda / n) 2 R_tu / S_t where row t's own block
  (its last S rows: block t // S; a sequence's first token: that sequence's first block) drops unit u, else 0
  (0 where S_t = 0). One program per row: a pass over the row for S_t, a second that writes dZ_s.
Bytes per element: Z_s read twice (2 x 2 B in bf16), dZ_s written once (2 B), the kept mask [T/V, h] (1 B, 1/S of
the rows' reads, cached). The reference (scored_mass_loss.mass_dz_ref, torch) makes about five float32 passes.
"""

import torch
import triton
import triton.language as tl


@triton.jit
def _mass_dz_kernel(zs_ptr, kept_ptr, out_ptr, h, stride_z, stride_k, stride_o, coef, NB, S, SEQ_BLOCKS,
                    BLOCK: tl.constexpr):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    first = row - NB * S  # >= 0: the first token of sequence `first`
    blk = tl.where(first < 0, row // S, first * SEQ_BLOCKS)
    z_row = zs_ptr + row * stride_z
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for c0 in range(0, h, BLOCK):
        cols = c0 + tl.arange(0, BLOCK)
        r = tl.maximum(tl.load(z_row + cols, mask=cols < h, other=0.0).to(tl.float32), 0.0)
        acc += r * r
    mass = tl.sum(acc, axis=0)
    scale = tl.where(mass > 0, coef / tl.where(mass > 0, mass, 1.0), 0.0)
    for c0 in range(0, h, BLOCK):
        cols = c0 + tl.arange(0, BLOCK)
        ok = cols < h
        r = tl.maximum(tl.load(z_row + cols, mask=ok, other=0.0).to(tl.float32), 0.0)
        kept = tl.load(kept_ptr + blk * stride_k + cols, mask=ok, other=1)
        dz = tl.where(kept != 0, 0.0, r * scale)
        tl.store(out_ptr + row * stride_o + cols, dz.to(out_ptr.dtype.element_ty), mask=ok)


def mass_dz(zs: torch.Tensor, ids: torch.Tensor, v: int, score_rows: int, seq: int, lam: float) -> torch.Tensor:
    """zs [n, h] (Z on the scoring rows, scoring_row_index's order), ids [T/V, Kc] (each block's kept units) ->
    dZ_s [n, h] in zs' dtype: (lambda / n) 2 R / S_t on the units each row's block drops (mass_dz_ref's)."""
    n, h = zs.shape
    blocks = ids.shape[0]
    if n != blocks * score_rows + blocks * v // seq or zs.stride(1) != 1 or seq % v or (blocks * v) % seq:
        raise ValueError(
            f"mass_dz: zs {tuple(zs.shape)} (strides {zs.stride()}); expected "
            f"{blocks * score_rows + blocks * v // seq} rows, unit stride, for {blocks} blocks of {v}, "
            f"score_rows={score_rows}, seq={seq}"
        )
    kept = torch.zeros(blocks, h, dtype=torch.uint8, device=zs.device).scatter_(1, ids.long(), 1)
    out = torch.empty_like(zs, memory_format=torch.contiguous_format)
    block = min(1024, triton.next_power_of_2(h))
    # Triton's own launch: FastLaunch's direct path is checked on a GPU only for kernels without float arguments
    _mass_dz_kernel[(n,)](
        zs, kept, out, h, zs.stride(0), kept.stride(0), out.stride(0), 2.0 * lam / n, blocks, score_rows, seq // v,
        BLOCK=block, num_warps=4,
    )  # fmt: skip
    return out
