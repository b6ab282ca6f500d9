"""One-off: selection kernel with / without L2 eviction hints, a few tilings, 16384 x 16384 bf16."""
import torch
import triton.testing

from sparse_compile.kernels.activation_select_triton import vnm_select_compact


def ms(fn):
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


z = torch.randn(16384, 16384, device="cuda", dtype=torch.bfloat16)
for p, tilings in [((128, 2, 16), [(None, None, 4), (8, 8, 2), (4, 8, 4)]), ((128, 2, 8), [(None, None, 4), (8, 16, 4), (16, 8, 4)]), ((128, 4, 8), [(None, None, 4)])]:
    m = p[2]
    nbytes = 16384 * 16384 * 2 + 2 * 16384 * 16384 * 4 // m * 2
    for bg, rows, w in tilings:
        res = {}
        for ev in (False, True):
            out = vnm_select_compact(z, None, *p, block_g=bg, rows=rows, num_warps=w, evict=ev)
            res[ev] = (ms(lambda: vnm_select_compact(z, None, *p, block_g=bg, rows=rows, num_warps=w, evict=ev)), out)
        same = all(torch.equal(a, b) for a, b in zip(res[False][1], res[True][1]))
        print(f"{p} block_g={bg} rows={rows} w={w}: plain {res[False][0]:.3f} ms, evict hints {res[True][0]:.3f} ms "
              f"({nbytes / res[True][0] / 1e6 / 2999:.2f} of copy), same output {same}", flush=True)
