"""sparse_compile::sparsify_weight(w, pattern, decay) -> w~

w~ = w * M(w), M the transposable 2:4 mask (kernels/weight_mask.py; on CUDA the Triton kernel
kernels/weight_mask_triton.py, same answer). Backward: straight-through,
grad(w) = grad(w~) + decay * (w - w~)  (masked decay; w - w~ = (1 - M) * w).
"""

import torch

from sparse_compile.kernels import transposable_24_mask


@torch.library.custom_op("sparse_compile::sparsify_weight", mutates_args=())
def sparsify_weight(w: torch.Tensor, pattern: str, decay: float) -> torch.Tensor:
    if pattern != "2:4":
        raise ValueError(f"sparsify_weight: pattern={pattern!r}; expected '2:4'")
    if w.device.type == "cuda" and w.stride(-1) == 1:  # same answer as the reference (see its docstring)
        from sparse_compile.kernels.weight_mask_triton import sparsify_24_triton

        return sparsify_24_triton(w)
    return w * transposable_24_mask(w)


@sparsify_weight.register_fake
def _(w: torch.Tensor, pattern: str, decay: float) -> torch.Tensor:
    return torch.empty_like(w)


def _sparsify_weight_setup(ctx, inputs, output) -> None:
    w, _, decay = inputs
    ctx.decay = decay
    if decay:
        ctx.save_for_backward(w, output)


def _sparsify_weight_backward(ctx, grad):
    if not ctx.decay:
        return grad, None, None
    w, w_masked = ctx.saved_tensors
    return grad + ctx.decay * (w - w_masked), None, None


sparsify_weight.register_autograd(_sparsify_weight_backward, setup_context=_sparsify_weight_setup)
