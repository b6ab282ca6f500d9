"""One-off: gather_n (persistent, default) at GROUP_M 8/16/32/64 with its tuned tile."""
import sys

import torch
import triton.testing

from sparse_compile.kernels import gather_gemm_triton as new
from sparse_compile.kernels.activation_select_triton import vnm_select_compact
from sparse_compile.kernels.gather_reference import gather_n_mm_ref
from sparse_compile.measure import max_rel_err


def ms(fn):
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


k = new._gather_n_kernel
for t, d, h in [tuple(map(int, s.split(","))) for s in sys.argv[1].split(";")]:
    v, n, m = 128, 2, 16
    g = torch.Generator(device="cuda").manual_seed(0)
    z = torch.randn(t, h, device="cuda", dtype=torch.bfloat16, generator=g)
    w2t = (torch.randn(h, d, device="cuda", generator=g) * h**-0.5).to(torch.bfloat16)
    dy = torch.randn(t, d, device="cuda", dtype=torch.bfloat16, generator=g)
    h_c, r_c, ids = vnm_select_compact(z, None, v, n, m)
    want = gather_n_mm_ref(dy, w2t, ids, v, r_c)
    w2t_k = w2t[: h_c.shape[1]].contiguous()
    print(f"{t}x{d}x{h} ceiling {ms(lambda: dy @ w2t_k.t()):.4f}", flush=True)
    fn = lambda: new.gather_n_mm(dy, w2t, ids, v, r_c)
    print(f"{t}x{d}x{h} default {ms(fn):.4f} err {max_rel_err(fn(), want):.1e}", flush=True)
    best = k.best_config
    for gm in (8, 16, 32, 64):
        k.configs = [type(best)(dict(best.kwargs, GROUP_M=gm), num_stages=best.num_stages, num_warps=best.num_warps, pre_hook=best.pre_hook)]
        k.cache.clear()
        print(f"{t}x{d}x{h} GROUP_M={gm:3d} {ms(fn):.4f} err {max_rel_err(fn(), want):.1e} {best.kwargs} s{best.num_stages} w{best.num_warps}", flush=True)
    k.configs = new._configs(new._TILES)
    k.cache.clear()
