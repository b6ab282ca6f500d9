"""python -m bench.chunk_kernels: the neuron-chunk kernels against their ceilings (CUDA).

Per (T, d, h), pattern and chunk size, medians of triton.testing.do_bench:
  select       kernels/chunk_select_triton.py vs copy bandwidth (bytes: Z read once, h_c and r_c
               written, ids), beside the plain selection kernel (chunk 1) on the same Z; with --seq S
               also the causal form (sequences of S tokens) beside the non-causal chunked kernel; with
               --select-sweep the tilings of SELECT_SWEEP (rows per step of each pass, warps) beside
               the default one
  B2, B4       kernels/chunk_wgrad_triton.py vs cuBLAS on the dense product (dY^T H~ [d, T] x [T, h],
               dZ~^T X) and vs the ceiling: cuBLAS on the same product with K = T * 4/M (the work
               left at keep 4/M); with --sweep also the B2 and B4 kernels' tilings, split-K
               factors, tile orientations (units_m: the chunk's units along the MMA's M) and loads
               (TMA descriptors or pointer tiles); "B2/B4 pointers": the default tile through pointers;
               for c >= 128 "one program per tile": without the TAIL schedule (tail=False)
  scatter path what the chunk kernels replace: two scatters to [T, h] plus the two dense GEMMs
  db1 (colsum) B4's bias gradient from the compact dZ~ (kernels/chunk_wgrad_triton.chunk_colsum) vs
               copy bandwidth (bytes: dZ~ read once), beside the dense path's dZ.sum(0)
  F2, B1 in place  the gather GEMMs reading W2 [d, h] as w2.t() along the chunk runs, vs the same GEMM
               on a contiguous W2^T with the transpose copy (the baseline) and without it (ceiling ms); the
               check is the relative difference of the two (autotuned separately: tiles may differ)
  F2, B1, B3 slabs  the gathers with each chunk run's weight slab copied through a TMA descriptor
               (where the id tile divides c) vs the same kernels on gathered rows (baseline ms) and
               vs cuBLAS on the dense shape at the compact width (ceiling ms); check: the two's difference
  B1 + db1     B1 with its epilogue's row-tile column sums, then db1 from them, against B1 and then
               db1 from dZ~ (one more read of dZ~); the check: the two dZ~'s and db1's relative differences
  B1 + B2      B1's epilogue also writing H~ = round(r_c^2), then B2 on it (the op's path), against B1
               and then B2 squaring r_c on its way to the MMA; and B1 with and without the H~ write
               and the row-tile sums
  F1 kept      (N = 4) F1 on the kept chunks, the gather-N GEMM with the activation epilogue (score_rows'
               forward), against B1 on the same shape and cuBLAS on the compact width (ceiling ms)
  csr          building the per-chunk block lists (once per step, shared by B2 and B4): the one-launch
               kernel against the torch version
Every row checks its output first (selection bit-exact against vnm_compact_ref; B2/B4 against
the dense product, relative error). --skew makes some chunks popular (kept by most blocks), which
bounds the one-wave B2/B4 kernels at small shapes: the case split-K is for; at --skew 5 every block
keeps the same chunks, as in bench.e2e's steps ("chunks kept", the chunks any block keeps, is then
Kc/c; "max / mean kept" the most-kept chunk's blocks over the mean). --csv writes the rows
with device, versions and revision.
"""

import argparse
import sys

import torch
import triton.testing
from tabulate import tabulate

from bench.env import write_csv
from bench.gpu_timing import start_gpu_bench
from sparse_compile.kernels import gather_gemm_triton
from sparse_compile.kernels.activation_mask import vnm_compact_ref
from sparse_compile.kernels.activation_select_triton import vnm_select_compact
from sparse_compile.kernels.chunk_select_triton import vnm_select_chunks
from sparse_compile.kernels.chunk_wgrad_triton import chunk_colsum, chunk_csr, chunk_csr_ref, chunk_wgrad
from sparse_compile.kernels.compact_scatter_triton import vnm_scatter
from sparse_compile.kernels.gather_gemm_triton import gather_k_mm, gather_n_mm
from sparse_compile.kernels.gather_reference import vnm_scatter_ref
from sparse_compile.kernels.transpose_triton import transpose_copy


def _ms(fn) -> float:
    return triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


# the selection's (rows per step of pass 1, of pass 2, warps): [rows, M*c] and [rows2, 4c] tiles; (2, 2, 4)
# and (8, 8, 4) the former defaults at M*c = 2048 and 512
SELECT_SWEEP = [(2, 2, 4), (2, 8, 4), (4, 4, 8), (4, 16, 8), (8, 8, 4), (8, 8, 8), (8, 16, 8), (8, 16, 16)]
SELECT_SWEEP += [(16, 16, 16)]

# (BLOCK_D, BLOCK_K, warps, stages, split, units_m, tma, group_d): units_m puts the chunk's c units
# along the MMA's M; tma loads both operands through TMA descriptors (sm90), else through pointer
# tiles; group_d: D tiles per chunk back to back (None: the default, all of them)
SWEEP = [
    (256, 64, 8, 3, 1, False, False, None),
    (256, 64, 8, 3, 2, False, False, None),
    (256, 64, 8, 3, 4, False, False, None),
    (128, 64, 4, 3, 1, False, False, None),
    (128, 64, 4, 3, 2, False, False, None),
    (128, 128, 8, 3, 1, False, False, None),
    (64, 128, 4, 4, 1, False, False, None),
    (256, 64, 4, 3, 1, True, False, None),
    (128, 64, 4, 3, 1, True, False, None),
    (256, 64, 8, 3, 1, False, True, None),
    (256, 64, 8, 4, 1, False, True, None),
    (256, 64, 8, 2, 1, False, True, None),
    (128, 64, 4, 4, 1, False, True, None),
    # Triton 3.6, sm90 build with 16-divisible shapes: at 4 stages the 128 x 128 tile keeps 2 buffers of
    # its A and B tiles (65.6 KB: 3 programs per SM by shared memory, 154 registers), at 5-6 stages 3
    # (98.4 KB: 2 per SM), at 7-8 stages 4 (131 KB: 1 per SM); the [256, 128] tile keeps 3 at 5 stages
    # (144 KB: 1 per SM)
    (128, 64, 4, 5, 1, False, True, None),
    (128, 64, 4, 7, 1, False, True, None),
    (128, 128, 4, 4, 1, False, True, None),
    (128, 128, 4, 5, 1, False, True, None),
    (256, 64, 8, 5, 1, False, True, None),
    (256, 64, 8, 5, 1, False, True, 1),
    (256, 64, 8, 5, 1, False, True, 2),
    (256, 64, 8, 5, 1, False, True, 4),
    (256, 64, 8, 6, 1, False, True, None),
    (128, 64, 8, 4, 1, False, True, None),
    (128, 128, 8, 3, 1, False, True, None),
    # the [256, 128] tile with BLOCK_K 128 (one kept block per K step; 2 buffers of 96 KB, 192 KB): in the
    # Triton 3.6 sm90 build its loop runs 181 instructions and 4 barriers per 128 tokens (16 HGMMA per
    # warpgroup) where the default's runs 160 and 4 per 64 tokens (B2: 227 against 194); not yet timed
    (256, 128, 8, 3, 1, False, True, 4),
    (256, 128, 8, 3, 1, False, True, None),
    (256, 64, 4, 3, 1, True, True, None),
    (256, 64, 4, 4, 1, True, True, None),
    (256, 64, 8, 3, 1, True, True, None),
    (128, 64, 4, 4, 1, True, True, None),
]


def measure(
    t: int,
    d: int,
    h: int,
    v: int,
    n: int,
    m: int,
    c: int,
    copy: float,
    sweep: bool = False,
    seq: int | None = None,
    skew: float = 0.0,
    select_sweep: bool = False,
) -> list[dict]:
    g = torch.Generator(device="cuda").manual_seed(0)
    z = torch.randn(t, h, device="cuda", generator=g)
    if skew:  # log-normal scale per chunk: some chunks kept by most blocks, as in a trained model
        scale = torch.exp(skew * torch.randn(h // c, device="cuda", generator=g)).repeat_interleave(c)
        z = z * scale
    z = z.bfloat16()
    x = torch.randn(t, d, device="cuda", generator=g).bfloat16()
    dy = torch.randn(t, d, device="cuda", generator=g).bfloat16()
    label = {"T": t, "d": d, "h": h, "pattern": f"{v}:{n}:{m}", "chunk": c, "skew": skew}
    rows = []

    h_c, r_c, ids = vnm_select_chunks(z, None, v, n, m, c)
    exact = all(torch.equal(a, b) for a, b in zip((h_c, r_c, ids), vnm_compact_ref(z, None, v, n, m, c), strict=True))
    nbytes = 2 * z.numel() + 2 * 2 * h_c.numel() + 4 * ids.numel()
    ms = _ms(lambda: vnm_select_chunks(z, None, v, n, m, c))
    plain = _ms(lambda: vnm_select_compact(z, None, v, n, m))
    rows.append({**label, "kernel": "select", "ms": ms, "of ceiling": nbytes / ms / 1e6 / copy, "check": exact,
                 "baseline": "chunk 1", "baseline ms": plain})  # fmt: skip
    for tiling in SELECT_SWEEP if select_sweep else ():  # (rows of pass 1, of pass 2, warps), on this row's form
        got = vnm_select_chunks(z, None, v, n, m, c, seq, tiling=tiling)
        exact = all(torch.equal(a, b) for a, b in zip(got, vnm_compact_ref(z, None, v, n, m, c, seq), strict=True))
        tiled = _ms(lambda tiling=tiling: vnm_select_chunks(z, None, v, n, m, c, seq, tiling=tiling))
        rows.append({**label, "kernel": f"select{' causal' if seq else ''} tiling {tiling}", "ms": tiled,
                     "check": exact, "of ceiling": nbytes / tiled / 1e6 / copy, "baseline": "default tiling",
                     "baseline ms": _ms(lambda: vnm_select_chunks(z, None, v, n, m, c, seq))})  # fmt: skip
    if seq:
        got = vnm_select_chunks(z, None, v, n, m, c, seq)
        exact = all(torch.equal(a, b) for a, b in zip(got, vnm_compact_ref(z, None, v, n, m, c, seq), strict=True))
        causal = _ms(lambda: vnm_select_chunks(z, None, v, n, m, c, seq))
        rows.append({**label, "kernel": f"select causal, seq {seq}", "ms": causal, "check": exact,
                     "of ceiling": nbytes / causal / 1e6 / copy, "baseline": "not causal",
                     "baseline ms": ms})  # fmt: skip

    kc = h_c.shape[1]
    keep = kc / h
    csr = chunk_csr(ids, c, h)
    kept = csr[0].diff().float()  # blocks keeping each chunk: the longest B2/B4 program over the mean
    label["max / mean kept"] = round((kept.max() / kept.mean()).item(), 2)
    label["chunks kept"] = int((kept > 0).sum())  # by any block: Kc/c when every block keeps the same ones
    same = all(torch.equal(a, b) for a, b in zip(csr, chunk_csr_ref(ids, c, h), strict=True))
    rows.append({**label, "kernel": "csr", "ms": _ms(lambda: chunk_csr(ids, c, h)), "check": same,
                 "baseline": "torch (~10 launches)", "baseline ms": _ms(lambda: chunk_csr_ref(ids, c, h))})  # fmt: skip
    dz_c = (r_c * 0.5).contiguous()  # stands in for dZ~: same sparsity, any values
    # B2 and B4 as the op runs them (B2 on H~ = round(r_c^2), which B1's epilogue writes: h_c here),
    # through pointer tiles (tma=False), and B2 squaring r_c on the way (its former form)
    # and, for the c >= 128 tile, one program per output tile (tail=False: no split of a last wave)
    wgrads = [("B2", h_c, dy, False, True, None, None), ("B4", dz_c, x, False, False, None, None)]
    wgrads += [("B2 pointers", h_c, dy, False, True, False, None), ("B4 pointers", dz_c, x, False, False, False, None)]
    wgrads += [("B2 squaring r_c", r_c, dy, True, True, None, None)]
    if c >= 128:
        wgrads += [("B2 one program per tile", h_c, dy, False, True, None, False)]
        wgrads += [("B4 one program per tile", dz_c, x, False, False, None, False)]
    for name, a, b, square, transpose, tma, tail in wgrads:
        kw = dict(square=square, transpose=transpose, csr=csr, tma=tma, tail=tail)
        got = chunk_wgrad(a, ids, b, v, c, h, **kw)
        dense_a = vnm_scatter_ref(a * a if square else a, ids, v, h)
        want = dense_a.t() @ b
        err = _rel(got.t() if transpose else got, want)
        ms = _ms(lambda a=a, b=b, kw=kw: chunk_wgrad(a, ids, b, v, c, h, **kw))
        dense_ms = _ms(lambda a=dense_a, b=b: a.t() @ b)
        kred = int(t * keep)
        ceiling = _ms(lambda a=dense_a[:kred], b=b[:kred]: a.t() @ b)
        rows.append({**label, "kernel": name, "ms": ms, "of ceiling": ceiling / ms, "check": f"rel {err:.1e}",
                     "baseline": "cuBLAS dense", "baseline ms": dense_ms, "ceiling ms": ceiling})  # fmt: skip
    db = chunk_colsum(dz_c, ids, v, c, h, csr)
    err = _rel(db, vnm_scatter_ref(dz_c, ids, v, h).float().sum(0))
    ms = _ms(lambda: chunk_colsum(dz_c, ids, v, c, h, csr))
    dense_dz = vnm_scatter_ref(dz_c, ids, v, h)
    rows.append({**label, "kernel": "db1 (colsum)", "ms": ms, "of ceiling": 2 * dz_c.numel() / ms / 1e6 / copy,
                 "check": f"rel {err:.1e}", "baseline": "dense dZ.sum(0)",
                 "baseline ms": _ms(lambda: dense_dz.sum(0))})  # fmt: skip
    if sweep:  # tilings of the B2 and B4 kernels (SWEEP); the check: relative error against the dense product
        for name, a, b, square, transpose in (("B2", h_c, dy, False, True), ("B4", dz_c, x, False, False)):
            want = vnm_scatter_ref(a * a if square else a, ids, v, h).t() @ b
            for bd, bk, w, st, sp, um, tma, gd in SWEEP:
                kw = dict(square=square, transpose=transpose, csr=csr, block_d=bd, block_k=bk, num_warps=w)
                kw.update(num_stages=st, split=sp, units_m=um, tma=tma, group_d=gd)
                try:
                    got = chunk_wgrad(a, ids, b, v, c, h, **kw)
                    check = f"rel {_rel(got.t() if transpose else got, want):.1e}"
                    ms = _ms(lambda a=a, b=b, kw=kw: chunk_wgrad(a, ids, b, v, c, h, **kw))
                except Exception as e:  # noqa: BLE001 - a tiling that does not compile (shared memory) is a row too
                    check, ms = f"{type(e).__name__}", float("nan")
                tile = f"{name} tiling {'units x ' if um else ''}{bd}x{bk} w{w} s{st} split {sp}{' TMA' if tma else ''}"
                tile += f" group {gd}" if gd else ""
                rows.append({**label, "kernel": tile, "ms": ms, "check": check})
            # the default tile with the chunks in id order (no longest-first), D tiles outer or inner
            ident = torch.arange(h // c, device="cuda", dtype=torch.int32)
            for gd, what in ((1, "D tiles outer"), (None, "default D grouping")):
                kw = dict(square=square, transpose=transpose, csr=csr, order=ident, group_d=gd, tail=False)
                got = chunk_wgrad(a, ids, b, v, c, h, **kw)
                ms = _ms(lambda a=a, b=b, kw=kw: chunk_wgrad(a, ids, b, v, c, h, **kw))
                check = f"rel {_rel(got.t() if transpose else got, want):.1e}"
                rows.append({**label, "kernel": f"{name} chunk-id order, {what}", "ms": ms, "check": check})
    # F2 and B1 read W2 [d, h] in place along the chunk runs (w2.t()): against the same GEMM on a
    # contiguous W2^T, copy included (what the chunk path ran before); check: relative difference
    w2 = (torch.randn(d, h, device="cuda", generator=g) * d**-0.5).bfloat16()
    w2t = transpose_copy(w2)
    for name, fn in (
        ("F2 W2 in place", lambda w: gather_k_mm(h_c, ids, w, v, chunk=c)),
        ("B1 W2 in place", lambda w: gather_n_mm(dy, w, ids, v, r_c, chunk=c)),
    ):
        err = _rel(fn(w2.t()), fn(w2t))
        rows.append({**label, "kernel": name, "ms": _ms(lambda fn=fn: fn(w2.t())), "check": f"rel {err:.1e}",
                     "baseline": "transpose_copy + GEMM", "baseline ms": _ms(lambda fn=fn: fn(transpose_copy(w2))),
                     "ceiling ms": _ms(lambda fn=fn: fn(w2t))})  # fmt: skip

    # F2, B1 (with its epilogue, as the op runs it) and B3 with each chunk run's weight slab copied
    # whole through a TMA descriptor (where the id tile divides c) against gathered rows
    # (SLABS_DEFAULT off, tuned apart); ceiling: cuBLAS on the same dense shape at K (resp. N) = Kc.
    # Check: relative difference of the two
    w1 = (torch.randn(h, d, device="cuda", generator=g) * d**-0.5).bfloat16()
    sq = torch.empty_like(r_c)
    slab_gemms = (
        ("F2 slabs", lambda: gather_k_mm(h_c, ids, w2.t(), v, chunk=c), lambda: h_c @ w2t[:kc]),
        ("B1 slabs", lambda: gather_n_mm(dy, w2.t(), ids, v, r_c, chunk=c, tile_sums=True, square_out=sq)[0],
         lambda: dy @ w2t[:kc].t()),
        ("B3 slabs", lambda: gather_k_mm(dz_c, ids, w1, v, chunk=c), lambda: dz_c @ w1[:kc]),
    )  # fmt: skip
    for name, fn, dense in slab_gemms:
        got, slab_ms = fn(), _ms(fn)
        gather_gemm_triton.SLABS_DEFAULT = False
        try:
            rows_out, rows_ms = fn(), _ms(fn)
        finally:
            gather_gemm_triton.SLABS_DEFAULT = True
        ceiling = _ms(dense)
        rows.append({**label, "kernel": name, "ms": slab_ms, "of ceiling": ceiling / slab_ms,
                     "baseline": "gathered rows", "baseline ms": rows_ms, "ceiling ms": ceiling,
                     "check": f"rel {_rel(got, rows_out):.1e}"})  # fmt: skip

    # B1 + db1 as the op runs them: B1's epilogue writes its row tiles' column sums, db1 adds them up
    # over the csr; baseline: B1, then db1 from dZ~ (a torch reduction over dZ~, then the same sum)
    def b1_db1(sums: bool):
        if sums:
            dz, tile_sums = gather_n_mm(dy, w2.t(), ids, v, r_c, chunk=c, tile_sums=True)
            return dz, chunk_colsum(dz, ids, v, c, h, csr, tile_sums)
        dz = gather_n_mm(dy, w2.t(), ids, v, r_c, chunk=c)
        return dz, chunk_colsum(dz, ids, v, c, h, csr)

    (dz_a, db_a), (dz_b, db_b) = b1_db1(True), b1_db1(False)
    check = f"dZ~ rel {_rel(dz_a, dz_b):.1e}, db1 rel {_rel(db_a, db_b):.1e}"  # tuned apart: tiles may differ
    rows.append({**label, "kernel": "B1 + db1, sums in B1's epilogue", "ms": _ms(lambda: b1_db1(True)), "check": check,
                 "baseline": "B1, then db1 from dZ~", "baseline ms": _ms(lambda: b1_db1(False))})  # fmt: skip

    # B1 + B2 as the op runs them: B1's epilogue also writes H~ = round(r_c^2), B2 reads it; against
    # B1, then B2 squaring r_c on the way. Check: dW2's relative difference, H~ against the selection's h_c
    def b1(**kw):
        return gather_n_mm(dy, w2.t(), ids, v, r_c, chunk=c, tile_sums=True, **kw)

    def b1_b2(h_out: bool):
        if h_out:
            sq = torch.empty_like(r_c)
            b1(square_out=sq)
            return sq, chunk_wgrad(sq, ids, dy, v, c, h, transpose=True, csr=csr)
        b1()
        return None, chunk_wgrad(r_c, ids, dy, v, c, h, square=True, transpose=True, csr=csr)

    (sq, dw2_a), (_, dw2_b) = b1_b2(True), b1_b2(False)
    check = f"H~ exact {torch.equal(sq, h_c)}, dW2 rel {_rel(dw2_a, dw2_b):.1e}"
    rows.append({**label, "kernel": "B1 + B2, H~ from B1's epilogue", "ms": _ms(lambda: b1_b2(True)), "check": check,
                 "baseline": "B1, then B2 squaring r_c", "baseline ms": _ms(lambda: b1_b2(False))})  # fmt: skip
    b1_ms = _ms(b1)  # the baseline of the next rows, timed once
    rows.append({**label, "kernel": "B1 writing H~", "ms": _ms(lambda: b1(square_out=sq)), "check": True,
                 "baseline": "B1", "baseline ms": b1_ms})  # fmt: skip

    def b1_plain():  # the dZ epilogue alone
        return gather_n_mm(dy, w2.t(), ids, v, r_c, chunk=c)

    rows.append({**label, "kernel": "B1 without the row-tile sums", "ms": _ms(b1_plain), "check": True,
                 "baseline": "B1", "baseline ms": b1_ms})  # fmt: skip
    if n == 4:  # F1 on the kept chunks (score_rows): the same GEMM shape as B1, the activation epilogue
        b1_bias = (torch.randn(h, device="cuda", generator=g) * 0.1).bfloat16()
        sq_act = torch.empty_like(r_c)

        def f1_kept():
            return gather_n_mm(x, w1, ids, v, chunk=c, act=True, bias=b1_bias, square_out=sq_act)

        want = torch.relu(torch.nn.functional.linear(x, w1, b1_bias)).gather(1, ids.long().repeat_interleave(v, dim=0))
        ceiling = _ms(lambda: torch.nn.functional.linear(x, w1[:kc], b1_bias[:kc]))
        act_ms = _ms(f1_kept)
        rows.append({**label, "kernel": "F1 on the kept chunks (activation epilogue)", "ms": act_ms,
                     "of ceiling": ceiling / act_ms, "check": f"rel {_rel(f1_kept(), want):.1e}",
                     "baseline": "B1 (same shape, dZ epilogue)", "baseline ms": b1_ms,
                     "ceiling ms": ceiling})  # fmt: skip
    _, r1, ids1 = vnm_select_compact(z, None, v, n, m)

    def scatter_path():  # what chunk 1 runs for B2 + B4: scatter, dense GEMM, twice
        dw2 = dy.t() @ vnm_scatter(r1, ids1, v, m, square=True)
        return dw2, vnm_scatter(r1, ids1, v, m).t() @ x

    rows.append({**label, "chunk": 1, "kernel": "B2+B4 scatter path", "ms": _ms(scatter_path), "check": True})
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.chunk_kernels", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--shapes", default="16384,2048,8192;16384,4096,16384", help="T,d,h;...")
    p.add_argument("--patterns", default="128:2:16", help="V:N:M,...")
    p.add_argument("--chunks", default="32,64", help="chunk sizes, comma-separated")
    p.add_argument("--csv", help="write the rows here")
    p.add_argument("--sweep", action="store_true", help="also time tilings of the B2 and B4 kernels")
    p.add_argument("--seq", type=int, help="also the causal selection over sequences of this many tokens")
    p.add_argument("--select-sweep", action="store_true", help="also time the selection's tilings (causal with --seq)")
    p.add_argument(
        "--skew",
        type=float,
        default=0.0,
        help="scale each chunk of Z by exp(skew x N(0, 1)): uneven chunk popularity, as in a trained model "
        "(0: i.i.d. Z, every chunk kept by about as many blocks)",
    )
    args = p.parse_args(argv)
    env, copy = start_gpu_bench(p, "python -m bench.chunk_kernels", argv)
    rows = []
    for shape in args.shapes.split(";"):
        t, d, h = (int(s) for s in shape.split(","))
        for pat in args.patterns.split(","):
            v, n, m = (int(s) for s in pat.split(":"))
            for c in (int(s) for s in args.chunks.split(",")):
                rows += measure(t, d, h, v, n, m, c, copy, args.sweep, args.seq, args.skew, args.select_sweep)
                print(f"{shape} {pat} chunk {c} done", flush=True)
    keys = ["T", "d", "h", "pattern", "chunk", "skew", "max / mean kept", "chunks kept", "kernel", "ms"]
    keys += ["of ceiling", "baseline", "baseline ms", "check"]
    print(tabulate([[r.get(k, "") for k in keys] for r in rows], headers=keys, floatfmt=".3f"))
    if args.csv:
        write_csv(args.csv, [{**r, **env} for r in rows])
    return 0


if __name__ == "__main__":
    sys.exit(main())
