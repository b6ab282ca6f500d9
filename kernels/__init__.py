"""Kernels for sparse_compile: math only, no graph knowledge.

Each family lives in one file beside its pure-torch reference. The references
define the semantics (docs/design.md, "Semantics"); every fast kernel must match them.
"""

from sparse_compile.kernels.activation_mask import vnm_mask, vnm_select, with_token_extra
from sparse_compile.kernels.ffn_reference import sqrelu_ffn_backward_ref, sqrelu_ffn_forward_ref
from sparse_compile.kernels.weight_mask import TRANSPOSABLE_24_PATTERNS, transposable_24_mask

__all__ = [
    "TRANSPOSABLE_24_PATTERNS",
    "sqrelu_ffn_backward_ref",
    "sqrelu_ffn_forward_ref",
    "transposable_24_mask",
    "vnm_mask",
    "vnm_select",
    "with_token_extra",
]
