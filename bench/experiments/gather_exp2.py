"""One-off: gather_k with int32 row offsets and GROUP_M 8/16/32 vs HEAD (7177b9c) and the cuBLAS ceiling."""
import importlib.util
import sys

import torch
import triton.testing

from sparse_compile.kernels import gather_gemm_triton as new
from sparse_compile.kernels.activation_select_triton import vnm_select_compact
from sparse_compile.kernels.gather_reference import gather_k_mm_ref
from sparse_compile.measure import max_rel_err

spec = importlib.util.spec_from_file_location("gather_old", "bench/experiments/gather_old.py")
old = importlib.util.module_from_spec(spec)
spec.loader.exec_module(old)


def ms(fn):
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def tuned(k):
    c = k.best_config
    return f"{c.kwargs['BLOCK_M']}x{c.kwargs['BLOCK_N']}x{c.kwargs['BLOCK_K']} g{c.kwargs['GROUP_M']} s{c.num_stages} w{c.num_warps}"


for t, d, h in [tuple(map(int, s.split(","))) for s in sys.argv[1].split(";")]:
    v, n, m = 128, 2, 16
    g = torch.Generator(device="cuda").manual_seed(0)
    z = torch.randn(t, h, device="cuda", dtype=torch.bfloat16, generator=g)
    w2t = (torch.randn(h, d, device="cuda", generator=g) * h**-0.5).to(torch.bfloat16)
    h_c, r_c, ids = vnm_select_compact(z, None, v, n, m)
    want = gather_k_mm_ref(h_c, ids, w2t, v)
    w2t_k = w2t[: h_c.shape[1]].contiguous()
    print(f"{t}x{d}x{h} ceiling {ms(lambda: h_c @ w2t_k):.4f}", flush=True)
    for name, fn, k in [("HEAD", lambda: old.gather_k_mm(h_c, ids, w2t, v), old._gather_k_kernel),
                        ("i32+groups", lambda: new.gather_k_mm(h_c, ids, w2t, v), new._gather_k_kernel)]:
        err = max_rel_err(fn(), want)
        print(f"{t}x{d}x{h} {name:12s} {ms(fn):.4f} ms err {err:.1e} {tuned(k)}", flush=True)
    # the new kernel at each GROUP_M with the tuned tile
    best = new._gather_k_kernel.best_config
    for gm in (8, 16, 32, 64):
        cfg = dict(best.kwargs, GROUP_M=gm)
        new._gather_k_kernel.configs = [type(best)(cfg, num_stages=best.num_stages, num_warps=best.num_warps, pre_hook=best.pre_hook)]
        new._gather_k_kernel.cache.clear()
        fn = lambda: new.gather_k_mm(h_c, ids, w2t, v)
        err = max_rel_err(fn(), want)
        print(f"{t}x{d}x{h} GROUP_M={gm:3d}  {ms(fn):.4f} ms err {err:.1e}", flush=True)
    new._gather_k_kernel.configs = new._configs(new._GATHER_K_TILES, new._GATHER_K_GROUPS)
    new._gather_k_kernel.cache.clear()
