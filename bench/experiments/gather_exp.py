"""One-off: gather_k ids prefetch / persistent, gather_n persistent, vs HEAD kernels and the cuBLAS ceiling."""
import importlib.util
import sys

import torch
import triton.testing

from bench.gather_kernels import _tuned
from sparse_compile.kernels import gather_gemm_triton as new
from sparse_compile.kernels.activation_select_triton import vnm_select_compact
from sparse_compile.kernels.gather_reference import gather_k_mm_ref, gather_n_mm_ref
from sparse_compile.measure import max_rel_err

spec = importlib.util.spec_from_file_location("gather_old", "bench/experiments/gather_old.py")
old = importlib.util.module_from_spec(spec)
spec.loader.exec_module(old)


def ms(fn):
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


shapes = [tuple(map(int, s.split(","))) for s in sys.argv[1].split(";")]
for t, d, h in shapes:
    v, n, m = 128, 2, 16
    g = torch.Generator(device="cuda").manual_seed(0)
    bf = torch.bfloat16
    z = torch.randn(t, h, device="cuda", dtype=bf, generator=g)
    w2t = (torch.randn(h, d, device="cuda", generator=g) * h**-0.5).to(bf)
    dy = torch.randn(t, d, device="cuda", dtype=bf, generator=g)
    h_c, r_c, ids = vnm_select_compact(z, None, v, n, m)
    kc = h_c.shape[1]
    w2t_k = w2t[:kc].contiguous()
    want_k, want_n = gather_k_mm_ref(h_c, ids, w2t, v), gather_n_mm_ref(dy, w2t, ids, v, r_c)
    rows = [("ceiling k", lambda: h_c @ w2t_k, None, None), ("ceiling n", lambda: dy @ w2t_k.t(), None, None)]
    rows += [
        ("k HEAD", lambda: old.gather_k_mm(h_c, ids, w2t, v), want_k, old._gather_k_kernel),
        ("k ids-ahead", lambda: new.gather_k_mm(h_c, ids, w2t, v, persistent=False), want_k, new._gather_k_kernel),
        ("k ids-ahead persistent", lambda: new.gather_k_mm(h_c, ids, w2t, v, persistent=True), want_k, new._gather_k_kernel),
        ("n HEAD", lambda: old.gather_n_mm(dy, w2t, ids, v, r_c), want_n, old._gather_n_kernel),
        ("n", lambda: new.gather_n_mm(dy, w2t, ids, v, r_c, persistent=False), want_n, new._gather_n_kernel),
        ("n persistent", lambda: new.gather_n_mm(dy, w2t, ids, v, r_c, persistent=True), want_n, new._gather_n_kernel),
    ]
    for name, fn, want, kern in rows:
        err = max_rel_err(fn(), want) if want is not None else 0.0
        t_ms = ms(fn)
        cfg = _tuned(kern) if kern is not None else ""
        print(f"{t}x{d}x{h} 128:2:16 {name:26s} {t_ms:.4f} ms  err {err:.2e}  {cfg}", flush=True)
