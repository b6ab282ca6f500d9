"""F2 and B3 with 2:4 activations: cuSPARSELt on the compressed activation, or not at all, measured.

With 2:4 activations the two GEMMs that reduce over h can take the activation as cuSPARSELt's sparse
operand: F2 = H~ W2^T and B3 = dZ~ W1, both [T, h] 2:4 along h times a dense [h, d]
(kernels/ffn_act24_cslt.py). Whether that beats cuBLAS depends on the GPU and the shape, so at
compile time, once per (GPU, dtype, T, d, h) in a process, every algorithm id cuSPARSELt offers is
run on a real 2:4 activation of the site's shape (kernels/sqrelu_24_compress_triton.py), checked against the
dense product (some ids are wrong), and the fastest timed against cuBLAS on the dense masked
operand. Slower than cuBLAS (under kernels="auto"): F2 and B3 run on cuBLAS over the dense masked
operand (the rest of the path stays: the fused 2:4 kernels), and the report says by how much.
"""

import functools
from dataclasses import dataclass

import torch
from torch._subclasses.fake_tensor import unset_fake_temporarily

from sparse_compile.planning.measure import fastest_cslt_alg, interleaved_ratio, one_call_ms


@dataclass(frozen=True)
class Act24Choice:
    alg: int | None  # the fastest correct cuSPARSELt algorithm id, None if none is usable
    ratio: float  # cuBLAS time / that algorithm's time (0.0 if none)
    why: str  # what the measurement says should run

    @property
    def pays(self) -> bool:
        return self.alg is not None and self.ratio >= 1


@functools.cache
def choose_act24(device_index: int, dtype: torch.dtype, tokens: int, d: int, h: int) -> Act24Choice:
    """Measure cuBLAS and every cuSPARSELt algorithm on [T, h] 2:4 x [h, d]; the fastest correct
    one (real tensors, also when called while a compile traces with fake ones)."""
    with unset_fake_temporarily(), torch.no_grad(), torch.autocast("cuda", enabled=False):
        return _measure(torch.device("cuda", device_index), dtype, tokens, d, h)


def _measure(device: torch.device, dtype: torch.dtype, tokens: int, d: int, h: int) -> Act24Choice:
    from sparse_compile.kernels.activation_select_24_triton import activation_24
    from sparse_compile.kernels.sqrelu_24_compress_triton import sqrelu_24_compress

    g = torch.Generator(device).manual_seed(0)
    z = torch.randn(tokens, h, device=device, generator=g).to(dtype)
    w = (torch.randn(h, d, device=device, generator=g) * h**-0.5).to(dtype)
    h_buf, _ = sqrelu_24_compress(z)
    masked = activation_24(z, masked=True)[2]  # the same H~, dense
    del z
    want = masked @ w  # cuBLAS, every row: an algorithm may go wrong in some row blocks only
    dense_ms = one_call_ms(lambda: masked @ w)
    alg, none_why = fastest_cslt_alg(
        lambda a: torch._cslt_sparse_mm(h_buf, w, alg_id=a),
        lambda a: torch._cslt_sparse_mm(h_buf, w, alg_id=a),
        want,
        dense_ms,
    )
    if alg is None:
        return Act24Choice(None, 0.0, f"F2, B3 on cuBLAS: {none_why}")
    ratio = interleaved_ratio(lambda: masked @ w, lambda: torch._cslt_sparse_mm(h_buf, w, alg_id=alg))
    if ratio >= 1:
        return Act24Choice(alg, ratio, f"F2, B3 on cuSPARSELt alg {alg}: {ratio:.2f}x cuBLAS measured at this shape")
    return Act24Choice(alg, ratio, f"F2, B3 on cuBLAS: cuSPARSELt alg {alg} measured {ratio:.2f}x cuBLAS at this shape")
