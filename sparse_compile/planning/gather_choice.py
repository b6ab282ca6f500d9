"""F2, B1, B3 of the gather path: the Triton gather kernel or cuBLAS on the dense operand, measured.

Each of the three GEMMs has two correct implementations (kernels/ffn_gather.py):
  F2  gather-K on the compact H       vs  scatter H, then cuBLAS  (the scatter counts against cuBLAS)
  B1  gather-N with the dZ epilogue   vs  cuBLAS dH = dY W2, then pick the kept entries, * 2 relu(Z)
  B3  gather-K on the compact dZ      vs  cuBLAS on the scattered dZ (scattered anyway for the exact dW1)
The gather kernels do M/4 times fewer FLOPs, but at small shapes a Triton launch and its
under-filled tiles can cost more than cuBLAS's dense GEMM. So at compile time, once per (GPU,
dtype, T, d, h, V:N:M) in a process, both are run on random data of the site's shape, compared with
each other, and timed back to back; the faster correct one wins, per GEMM, and the report says which
and by how much.
"""

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import unset_fake_temporarily

from sparse_compile.planning.measure import interleaved_ratio, max_rel_err


@dataclass(frozen=True)
class GatherChoice:
    dense: frozenset[str]  # of contract.GATHER_GEMMS: the ones cuBLAS runs
    why: str


@functools.cache
def choose_gathers(device_index: int, dtype: torch.dtype, tokens: int, d: int, h: int, v: int, n: int, m: int):
    """Measure gather kernel vs cuBLAS for F2, B1 and B3 of this site (real tensors, also when
    called while a compile traces with fake ones)."""
    with unset_fake_temporarily(), torch.no_grad(), torch.autocast("cuda", enabled=False):
        return _measure(torch.device("cuda", device_index), dtype, tokens, d, h, v, n, m)


def _measure(device, dtype, tokens, d, h, v, n, m) -> GatherChoice:
    from sparse_compile.kernels.activation_select_triton import vnm_select_compact
    from sparse_compile.kernels.compact_scatter_triton import vnm_scatter
    from sparse_compile.kernels.ffn_gather import compact_dz
    from sparse_compile.kernels.gather_gemm_triton import gather_k_mm, gather_n_mm

    g = torch.Generator(device).manual_seed(0)
    z = torch.randn(tokens, h, device=device, generator=g).to(dtype)
    w1 = (torch.randn(h, d, device=device, generator=g) * d**-0.5).to(dtype)
    w2 = (torch.randn(d, h, device=device, generator=g) * h**-0.5).to(dtype)
    dy = torch.randn(tokens, d, device=device, generator=g).to(dtype)
    h_c, r_c, ids = vnm_select_compact(z, None, v, n, m)
    del z
    w2t = w2.t().contiguous()
    dz_c = gather_n_mm(dy, w2t, ids, v, r_c)
    dz = vnm_scatter(dz_c, ids, v, m)
    candidates = {  # GEMM: (gather kernel, cuBLAS route)
        "F2": (lambda: gather_k_mm(h_c, ids, w2t, v), lambda: F.linear(vnm_scatter(h_c, ids, v, m), w2)),
        "B1": (lambda: gather_n_mm(dy, w2t, ids, v, r_c), lambda: compact_dz(dy @ w2, ids, r_c, v)),
        "B3": (lambda: gather_k_mm(dz_c, ids, w1, v), lambda: dz @ w1),
    }
    dense, notes = set(), []
    for name, (gather, cublas) in candidates.items():
        err = max_rel_err(gather(), cublas())
        if err > 2e-2:  # both compute the same product; bf16 rounding differs by ~4e-3
            dense.add(name)
            notes.append(f"{name} cuBLAS (gather kernel off by {err:.1e})")
            continue
        ratio = interleaved_ratio(cublas, gather)
        if ratio < 1:
            dense.add(name)
        notes.append(f"{name} {'gather' if ratio >= 1 else 'cuBLAS'} (gather {ratio:.2f}x cuBLAS measured)")
    return GatherChoice(frozenset(dense), ", ".join(notes))
