"""Masked squared-ReLU FFN, forward and backward: pure-torch reference.

Notation (docs/design.md, "Semantics"): X [T, d], Z = X W1^T + b1 [T, h], R = relu(Z),
H = R^2, A = activation mask of H, R~ = R * A, H~ = R~^2, Y = H~ W2^T + b2 [T, d_out].
Weights arrive already masked (W~); the activation mask is chosen here.

Backward, with the masks held constant:
  dH~ = dY W2 (B1); dZ = dH~ * 2 R~ (zero where A or relu drops); dW2 = dY^T H~ (B2);
  dX = dZ W1 (B3); dW1 = dZ^T X (B4); db1 = sum_T dZ; db2 = sum_T dY.
Only R~ is saved between the two (H~ = R~^2 and 2 R~ both come from it).

Mass loss (SparsityConfig.mass_loss, lambda > 0): the gradient of L = (lambda / T) sum_t D_t / sg(S_t)
is added to dZ, with D_t = sum over the units the pattern drops of R_tu^2 (the token's dropped mass) and
S_t = sum_u R_tu^2 (its whole mass, held constant): dZ_tu += (lambda / T) 2 R_tu / S_t on dropped units,
0 on kept ones. It pushes each token's mass into what its pattern keeps. The push grows as a token's
mass shrinks (up to (lambda / T) 2 / sqrt(S_t) on a unit that holds all of it), and it is added to dZ
as it is: a loss scale on dY (GradScaler's s, a loss divided over k accumulation steps) scales the
rest of dZ and not this term, so the effective lambda becomes lambda / s or k lambda. The forward
then saves R (2A - 1) in place of R~: dropped units carry -R, so R~ and the dropped R both come back.
On a sample of rows (``mass_rows``, n of the T) the term is (lambda / n) sum over the sample instead,
a mean over those rows (lambda on the same scale; each sampled row's push T / n times as strong):
what the chunked fast path, with H in full on its scoring rows alone, adds (kernels/scored_mass_loss.py).
"""

import torch
import torch.nn.functional as F

from sparse_compile.kernels.activation_mask import vnm_mask, with_token_extra
from sparse_compile.kernels.weight_grad_approx import token_vnm_grad


def sqrelu_ffn_forward_ref(
    x: torch.Tensor,
    w1: torch.Tensor,
    b1: torch.Tensor | None,
    w2: torch.Tensor,
    b2: torch.Tensor | None,
    pattern: tuple[int, int, int] | None,
    chunk: int = 1,
    seq: int | None = None,
    score_rows: int | None = None,
    token_extra: int = 0,
    score_units: int | None = None,
    signed: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, d] -> (y [T, d_out], r_masked [T, h]) (with ``signed``, R (2A - 1) in place of r_masked:
    what the mass loss's backward needs); ``pattern`` is (V, N, M) or None (dense H), kept
    in chunks of ``chunk`` hidden units, causal over sequences of ``seq`` tokens when given (scored
    on the last ``score_rows`` rows of the previous block when given), and each token's own
    ``token_extra`` largest units outside that kept as well (activation_mask.with_token_extra); chunks
    ranked on their first ``score_units`` units when given."""
    r = torch.relu(F.linear(x, w1, b1))
    h = r * r
    if pattern is not None:
        keep = with_token_extra(h, vnm_mask(h, *pattern, chunk, seq, score_rows, score_units), token_extra)
        h = h * keep
        r = torch.where(keep, r, -r) if signed else r * keep
    return F.linear(h, w2, b2), r


def sqrelu_ffn_backward_ref(
    dy: torch.Tensor,
    x: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    r_masked: torch.Tensor,
    weight_grad: tuple[int, int, int] | None = None,
    dense_frac: float = 0.0,
    mass_loss: float = 0.0,
    mass_rows: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients (dx [T, d], dw1 [h, d], db1 [h], dw2 [d_out, h], db2 [d_out]) of the forward above;
    with ``weight_grad`` (V, N, M), dw1 and dw2 are the token-dim approximation (weight_grad_approx.py);
    with ``mass_loss`` lambda > 0, ``r_masked`` is the forward's signed R and dZ gains the mass loss's
    gradient (module docstring), on the rows of ``mass_rows`` (bool [T]) alone when given."""
    aux = None
    if mass_loss:
        r_masked, aux = mass_loss_grad(r_masked, mass_loss, mass_rows)
    h = r_masked * r_masked
    dh = dy @ w2
    dz = dh.float() * (2.0 * r_masked.float())  # d/dz relu(z)^2 = 2 relu(z)
    dz = (dz if aux is None else dz + aux).to(dy.dtype)
    dw1, dw2 = weight_grads(dy, x, h, dz, weight_grad, dense_frac)
    return dz @ w1, dw1, dz.sum(0), dw2, dy.sum(0)


def mass_loss_grad(
    r_signed: torch.Tensor, lam: float, rows: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """r_signed = R (2A - 1) [T, h] -> (R~ [T, h], the mass loss's dZ [T, h] in float32 or wider):
    (lambda / T) 2 R / S_t on the dropped units (r_signed < 0), S_t = sum_u R_tu^2; 0 where S_t is 0.
    With ``rows`` (bool [T], n of them true): (lambda / n) 2 R / S_t on those rows, 0 on the others."""
    r = r_signed.to(torch.promote_types(r_signed.dtype, torch.float32))
    dropped = (-r).clamp_min(0.0)
    mass = (r * r).sum(1, keepdim=True)
    mass = torch.where(mass > 0, mass, torch.ones_like(mass))  # a token without mass has no dropped R either
    if rows is None:
        scale = (2.0 * lam / max(r.shape[0], 1)) / mass
    else:  # n as a tensor: no wait on the host
        n = rows.sum(dtype=r.dtype).clamp_min(1.0)
        scale = (2.0 * lam) * rows[:, None].to(r.dtype) / (n * mass)
    return r_signed.clamp_min(0), dropped * scale


def weight_grads(
    dy: torch.Tensor,
    x: torch.Tensor,
    h: torch.Tensor,
    dz: torch.Tensor,
    weight_grad: tuple[int, int, int] | None,
    dense_frac: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(dW1 = dZ^T X, dW2 = dY^T H~): exact, or the token-dim approximation of both."""
    if weight_grad is None:
        return dz.t() @ x, dy.t() @ h
    dw2 = token_vnm_grad(h, dy, weight_grad, dense_frac).t().contiguous()  # the op promises contiguous grads
    return token_vnm_grad(dz, x, weight_grad, dense_frac), dw2
