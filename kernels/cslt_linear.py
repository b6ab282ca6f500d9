"""y = x w~^T + b on cuSPARSELt for a weight w~ [n, k] that is 2:4 along k (sm90).

The weight is made row-major (kernels/transpose_triton.row_major: a transposed view such as a
linear's backward w~.t() is copied) and compressed each call by the sm90 compressor
(kernels/cslt_compress_triton.py); x [T, k] is the dense operand.
Reference: F.linear(x, w~, b) (the same products; tests/gpu/test_linear_24_gpu.py).
"""

import torch

from sparse_compile.kernels.cslt_compress_triton import cslt_compress
from sparse_compile.kernels.transpose_triton import row_major


def cslt_linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, alg: int) -> torch.Tensor:
    """x [T, k] (T a multiple of 64), w [n, k] 2:4 along k, b [n] or None -> [T, n]; cuSPARSELt algorithm ``alg``."""
    return torch._cslt_sparse_mm(cslt_compress(row_major(w)), x.t(), bias=b, transpose_result=True, alg_id=alg)
