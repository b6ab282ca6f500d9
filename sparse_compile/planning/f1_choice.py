"""F1 = X W~1^T with 2:4 weights: cuSPARSELt or cuBLAS, decided by measuring on this GPU.

cuSPARSELt's 2:4 GEMM is not always faster: it gains at large shapes and loses at small ones,
where its fixed per-call cost dominates, and where the line falls depends on the GPU. So at compile
time, once per (GPU, dtype, T, d, h) in a process, every algorithm id cuSPARSELt offers is run on
random data of the site's shape, checked against the dense product (some ids are known to give
wrong results), and timed with the compression included (kernels/cslt_compress_triton.py, once per
step for a changing weight) against F.linear. The fastest correct choice wins; the report says
which and by how much.

Only sm90 (the compressor's layout was read off Hopper) and shapes cuSPARSELt takes unpadded (h and
d multiples of 64).
"""

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import unset_fake_temporarily

from sparse_compile.kernels.cslt_linear import cslt_linear
from sparse_compile.planning.measure import back_to_back_ms, fastest_cslt_alg, interleaved_ratio


@dataclass(frozen=True)
class F1Choice:
    alg: int | None  # cuSPARSELt algorithm id, or None for cuBLAS
    why: str


def cslt_unsupported(device: torch.device, dtype: torch.dtype, d: int, h: int) -> str:
    """Why a 2:4 GEMM whose sparse operand is compressed here (kernels/cslt_compress_triton.py) and
    whose dims are d and h cannot run on cuSPARSELt on this CUDA ``device`` ("" when it can)."""
    if torch.cuda.get_device_capability(device)[0] != 9:
        return "the cuSPARSELt compressor writes the sm90 layout only"
    if dtype not in (torch.bfloat16, torch.float16):
        return f"cuSPARSELt takes bf16/fp16, not {str(dtype).removeprefix('torch.')}"
    if d % 64 or h % 64:
        return f"d={d}, h={h} not multiples of 64 (cuSPARSELt pads them)"
    return ""


@functools.cache
def choose_f1(device_index: int, dtype: torch.dtype, tokens: int, d: int, h: int) -> F1Choice:
    """Measure cuBLAS and every cuSPARSELt algorithm on F1 of this shape; the fastest correct one
    (real tensors, also when called while a compile traces with fake ones)."""
    with unset_fake_temporarily(), torch.no_grad(), torch.autocast("cuda", enabled=False):
        return _measure(torch.device("cuda", device_index), dtype, tokens, d, h)


def _measure(device: torch.device, dtype: torch.dtype, tokens: int, d: int, h: int) -> F1Choice:
    from sparse_compile.kernels.cslt_compress_triton import cslt_compress, random_24

    g = torch.Generator(device).manual_seed(0)
    w = random_24(h, d, g, dtype)
    x = torch.randn(tokens, d, device=device, generator=g).to(dtype)
    b = torch.randn(h, device=device, generator=g).to(dtype)
    want = F.linear(x, w, b)  # cuBLAS, every row: an algorithm may go wrong in some row blocks only
    dense_ms = back_to_back_ms(lambda: F.linear(x, w, b))
    wc = cslt_compress(w)
    alg, none_why = fastest_cslt_alg(
        lambda a: torch._cslt_sparse_mm(wc, x.t(), bias=b, transpose_result=True, alg_id=a),
        lambda a: cslt_linear(x, w, b, a),  # compression included, as it runs
        want,
        dense_ms,
    )
    if alg is None:
        return F1Choice(None, f"F1 cuBLAS: {none_why}")
    ratio = interleaved_ratio(lambda: F.linear(x, w, b), lambda: cslt_linear(x, w, b, alg))
    if ratio >= 1:
        return F1Choice(alg, f"F1 cuSPARSELt alg {alg} ({ratio:.2f}x cuBLAS measured, compression included)")
    return F1Choice(None, f"F1 cuBLAS (cuSPARSELt best {ratio:.2f}x, measured)")
