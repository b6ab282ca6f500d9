"""The custom ops the FFN pass rewrites into, one file per op with its fake and autograd.

| op (torch.ops.sparse_compile.*)       | file                | computes on                          |
|---------------------------------------|---------------------|--------------------------------------|
| sparsify_weight                       | sparsify_weight.py  | kernels/weight_mask*.py              |
| sqrelu_ffn, sqrelu_ffn_backward       | ffn_reference.py    | kernels/ffn_reference.py (reference) |
| sqrelu_ffn_vnm, sqrelu_ffn_vnm_backward | ffn_vnm.py        | kernels/ffn_gather.py (V:N:M)        |
| sqrelu_ffn_24, sqrelu_ffn_24_backward | ffn_24.py           | kernels/ffn_act24_cslt.py (2:4 activations) |
| linear_24                             | linear_24.py        | kernels/cslt_linear.py (2:4 weights alone) |
| sqrelu_ffn_routed, _backward            | ffn_routed.py       | kernels/ffn_routed.py (routed tokens) |
| sqrelu_ffn_grouped, _backward           | ffn_grouped.py      | kernels/ffn_grouped.py (per-token chunks) |

The spec string every FFN op receives, the preamble every op shares (forward_operands, backward_operands:
input checks, casts, reshapes, permutation) and the autograd glue are in spec.py.
Which op a site gets is decided by sparse_compile/planning/plan.py; importing this package registers all.
"""

from sparse_compile.ops import ffn_24, ffn_grouped, ffn_reference, ffn_routed, ffn_vnm, linear_24, sparsify_weight
from sparse_compile.ops.spec import FLOAT_DTYPES, OpSpec, parse_spec

__all__ = [
    "FLOAT_DTYPES",
    "OpSpec",
    "ffn_24",
    "ffn_grouped",
    "ffn_reference",
    "ffn_routed",
    "ffn_vnm",
    "linear_24",
    "parse_spec",
    "sparsify_weight",
]
