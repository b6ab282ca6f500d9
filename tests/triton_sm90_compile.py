"""Compile every Triton kernel of the package for sm90 (H100) on a machine without a GPU.

The CPU interpreter runs kernels as Python, so it accepts constructs the compiler rejects (starred
unpacking, for one). This script goes through Triton's real front end, optimizer and ptxas.
Run in a fresh process (no TRITON_INTERPRET): python -m tests.triton_sm90_compile ["chunk wgrad" ...]
(arguments: only the kernels whose label starts with one of them).
The GPU machines run Triton 3.6; CI gets the newest Triton, whose compiler accepts some things 3.6
does not (an fp64 dot on 16-bit loads). Before a GPU run, also check against 3.6:
pip install --target /tmp/t36 --no-deps triton==3.6.0; PYTHONPATH=/tmp/t36 python -m tests.triton_sm90_compile

Each kernel is compiled twice: as written (any argument values), and with every pointer and int
argument marked divisible by 16, which is how Triton specializes a launch on our usual shapes and
strides. The second compile's PTX shows the real memory instructions; the kernels in VECTORIZED
must not load or store 16-bit elements one at a time (ld/st.global.b16): scalar accesses make a
memory-bound kernel several times slower, and nothing else catches them on a CPU.

Where Triton ships cuobjdump, each line also gives the sm90 SASS: registers per thread, instructions
and barriers (for a kernel without loops the instruction count is what every thread executes), at
Triton's default 4 warps, not each kernel's launch setting (the fused 2:4 kernels run at 8 warps; at
4 they spill). Such counts can find a kernel's slow spots before any GPU time.
"""

import multiprocessing
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter

os.environ.pop("TRITON_INTERPRET", None)

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from sparse_compile.kernels import activation_select_24_triton as act24  # noqa: E402
from sparse_compile.kernels import activation_select_triton as select  # noqa: E402
from sparse_compile.kernels import chunk_score_triton  # noqa: E402
from sparse_compile.kernels import chunk_select_triton as chunk_select  # noqa: E402
from sparse_compile.kernels import chunk_wgrad_triton as chunk_wgrad  # noqa: E402
from sparse_compile.kernels import compact_scatter_triton as scatter  # noqa: E402
from sparse_compile.kernels import cslt_compress_triton as cslt  # noqa: E402
from sparse_compile.kernels import gather_gemm_triton as gemm  # noqa: E402
from sparse_compile.kernels import mass_dz_triton as mass_dz_k  # noqa: E402
from sparse_compile.kernels import sqrelu_24_compress_triton as act24_cslt  # noqa: E402
from sparse_compile.kernels import transpose_triton as transpose  # noqa: E402
from sparse_compile.kernels import weight_mask_pairs_triton as wpairs  # noqa: E402
from sparse_compile.kernels import weight_mask_triton as wmask  # noqa: E402


def _sig(names: str, constexprs: dict, types: dict) -> dict:
    return {n: "constexpr" if n in constexprs else types.get(n, "i32") for n in names.split()}


def kernels() -> list[tuple[str, object, dict, dict, dict]]:
    ptr = {"z_ptr": "*bf16", "b_ptr": "*bf16", "hc_ptr": "*bf16", "rc_ptr": "*bf16", "ids_ptr": "*i32"}
    cases = []
    for v, n, m, causal in [(128, 2, 16, False), (64, 2, 8, False), (128, 4, 8, False), (1, 2, 4, False),
                            (3, 1, 12, False), (64, 2, 8, True), (128, 2, 16, True)]:  # fmt: skip
        m_p = triton.next_power_of_2(m)
        ce = {"V": v, "N": n, "M": m, "M_P": m_p, "ROWS": min(16, triton.next_power_of_2(v)), "BLOCK_G": 256 // m_p}
        ce |= {"HAS_BIAS": True, "ABS": False, "KEEP": "evict_last", "DROP": "evict_first", "CAUSAL": causal}
        names = "z_ptr b_ptr hc_ptr rc_ptr ids_ptr G stride_z stride_c stride_ids V N M M_P ROWS BLOCK_G HAS_BIAS ABS "
        names += "KEEP DROP CAUSAL SEQ_BLOCKS"
        label = f"select {v}:{n}:{m}" + (" causal" if causal else "")
        cases.append((label, select._vnm_select_kernel, _sig(names, ce, ptr), ce))
    for (v, m), block_g in select.ONCHIP_DEFAULT.items():
        for dt, asm, bias in (("bf16", True, True), ("bf16", False, True), ("fp16", True, True), ("bf16", True, False)):
            ce = {"V": v, "N": 2, "M": m, "BLOCK_G": block_g, "HAS_BIAS": bias, "ASM": asm}
            names = "z_ptr b_ptr hc_ptr rc_ptr ids_ptr G stride_z stride_c stride_ids V N M BLOCK_G HAS_BIAS ASM"
            types = {k: f"*{dt}" for k in ("z_ptr", "b_ptr", "hc_ptr", "rc_ptr")} | {"ids_ptr": "*i32"}
            kernel = select._vnm_select_onchip_kernel
            label = f"select onchip {v}:2:{m} {dt} asm={asm} bias={bias}"
            cases.append((label, kernel, _sig(names, ce, types), ce))
    ce = {"ROWS": 16, "BLOCK_G": 64, "HAS_BIAS": True, "MASKED": True}
    names = (
        "z_ptr b_ptr val_ptr meta_ptr mask_out_ptr T G stride_z stride_v stride_m stride_o ROWS BLOCK_G HAS_BIAS MASKED"
    )
    types = {"z_ptr": "*bf16", "b_ptr": "*bf16", "val_ptr": "*bf16", "meta_ptr": "*u8", "mask_out_ptr": "*bf16"}
    cases.append(("activation 2:4", act24._act24_kernel, _sig(names, ce, types), ce))
    for dt in ("bf16", "fp16"):
        ce = {"TILES": 8}
        types = {"a_ptr": f"*{dt}", "out_ptr": f"*{dt}", "meta_ptr": "*i16"}
        cases.append(
            (
                f"cuSPARSELt compress {dt}",
                cslt._cslt_kernel,
                _sig("a_ptr out_ptr meta_ptr K TILES", ce, types),
                ce,
            )
        )
        types = {n: f"*{dt}" for n in ("z_ptr", "h_ptr", "r_ptr")} | {"hmeta_ptr": "*i16", "rmeta_ptr": "*i16"}
        names = "z_ptr h_ptr r_ptr hmeta_ptr rmeta_ptr K TILES DENSE_H"
        for dense_h in (False, True):
            ce = {"TILES": 8, "DENSE_H": dense_h}
            label = f"cuSPARSELt 2:4 sqrelu fwd {dt}" + (" dense H" if dense_h else "")
            cases.append((label, act24_cslt._fwd_kernel, _sig(names, ce, types), ce))
        ce = {"TILES": 8}
        types = {n: f"*{dt}" for n in ("dh_ptr", "r_ptr", "dzb_ptr", "dz_ptr", "h_ptr")}
        types |= {"rmeta_ptr": "*i16", "dzmeta_ptr": "*i16"}
        names = "dh_ptr r_ptr rmeta_ptr dzb_ptr dzmeta_ptr dz_ptr h_ptr K TILES"
        cases.append((f"cuSPARSELt 2:4 sqrelu bwd {dt}", act24_cslt._bwd_kernel, _sig(names, ce, types), ce))
    ce = {"M": 16, "M_P": 16, "ROWS": 16, "BLOCK_G": 16, "SQUARE": True}
    names = "c_ptr ids_ptr out_ptr G V stride_c stride_ids stride_out M M_P ROWS BLOCK_G SQUARE"
    types = {"c_ptr": "*bf16", "ids_ptr": "*i32", "out_ptr": "*bf16"}
    cases.append(("scatter", scatter._scatter_kernel, _sig(names, ce, types), ce))
    ce = {"M": 16, "M_P": 16, "G": 4, "ROWS": 128, "BLK": 4}
    types = {"c_ptr": "*bf16", "ids_ptr": "*i32", "out_ptr": "*bf16"}
    names = "c_ptr ids_ptr out_ptr NB V stride_c stride_ids M M_P G ROWS BLK"
    cases.append(("colsum", scatter._colsum_kernel, _sig(names, ce, types), ce))
    for gather in (False, True):
        ce = {"BLOCK": transpose.BLOCK, "GATHER": gather}
        types = {"a_ptr": "*bf16", "rows_ptr": "*i64", "out_ptr": "*bf16"}
        names = "a_ptr rows_ptr out_ptr R C stride_a stride_o BLOCK GATHER"
        label = "transpose" + (" gathered rows" if gather else "")
        cases.append((label, transpose._transpose_kernel, _sig(names, ce, types), ce))
    for dt in ("fp32", "bf16"):
        ce = {"TILES": 64, "P": 128, "NUM_PATTERNS": 90, "WRITE_MASK": True}
        names = "s_ptr w_ptr out_ptr mask_ptr p_ptr bits_ptr TILE_ROWS TILE_COLS stride_s stride_w stride_o stride_m "
        names += "TILES P NUM_PATTERNS WRITE_MASK"
        types = {"s_ptr": "*fp32", "w_ptr": f"*{dt}", "out_ptr": f"*{dt}", "mask_ptr": "*i8", "p_ptr": "*fp64"}
        types["bits_ptr"] = "*i8"
        cases.append((f"transposable 2:4 {dt}", wmask._transposable_24_kernel, _sig(names, ce, types), ce))
    for dt in ("fp32", "bf16", "fp16"):
        ce = {"TILES": 128, "WRITE_MASK": True}
        names = "w_ptr out_ptr mask_ptr TILE_ROWS TILE_COLS stride_w stride_o stride_m TILES WRITE_MASK"
        types = {"w_ptr": f"*{dt}", "out_ptr": f"*{dt}", "mask_ptr": "*i8"}
        cases.append((f"transposable 2:4 pairs {dt}", wpairs._transposable_24_pairs_kernel, _sig(names, ce, types), ce))
    # the language is the same in every config; three tile shapes, compiled with their configs' warps
    # and stages, as the autotuner compiles them (gather_k's stages: _GATHER_K_TILES)
    for cfg, k_cfg in zip(gemm._configs(gemm._TILES[:3]), gemm._configs(gemm._GATHER_K_TILES[:3]), strict=True):
        bm, bn, bk = cfg.kwargs["BLOCK_M"], cfg.kwargs["BLOCK_N"], cfg.kwargs["BLOCK_K"]
        assert k_cfg.kwargs == cfg.kwargs
        launch = {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages}
        launch_k = {"num_warps": k_cfg.num_warps, "num_stages": k_cfg.num_stages}
        # the contiguous operand through pointers or a TMA descriptor; one program per tile or persistent
        # b_t: W2 read in place along runs of 64 chunk ids (the chunk path), else rows of a contiguous W2^T;
        # run 128: chunks of 128, the weight's runs copied as slabs through its descriptor (W2 in place
        # for F2 and B1, W1's rows for B3) where the id tile divides 128 (gather_n: BLOCK_N 128 only)
        for tma, persistent, b_t, run in ((False, False, False, 1), (True, False, False, 1), (True, True, False, 1),
                                          (True, False, True, 1), (True, True, True, 1), (True, False, True, 128),
                                          (True, False, False, 128), (True, True, True, 128),
                                          (True, True, False, 128)):  # fmt: skip
            a_desc = f"tensordesc<bf16[{bm},{bk}]>" if tma else "*bf16"
            suffix = (" TMA" if tma else "") + (" persistent" if persistent else "") + (" chunk W^T" if b_t else "")
            suffix += " slabs" if run > 1 else ""
            chunk = {"B_T": b_t, "CHUNK": 64 if b_t or run > 1 else 1, "RUN": run}
            if not persistent:
                k_desc = f"tensordesc<bf16[{bn},{bk}]>" if b_t else f"tensordesc<bf16[{bk},{bn}]>"
                ce = dict(cfg.kwargs, HAS_BIAS=True, IEEE=False, USE_TMA=tma, B_I32=tma, **chunk)
                names = "c_ptr a_desc ids_ptr b_ptr b_desc bias_ptr out_ptr T N KC V stride_c stride_ids stride_b "
                names += "stride_out HAS_BIAS IEEE USE_TMA B_I32 B_T CHUNK RUN BLOCK_M BLOCK_N BLOCK_K GROUP_M"
                types = {"c_ptr": "*bf16", "a_desc": a_desc, "ids_ptr": "*i32", "b_ptr": "*bf16", "bias_ptr": "*bf16"}
                types |= {"out_ptr": "*bf16", "b_desc": k_desc if run > 1 else "*bf16"}
                label = f"gather_k{suffix} {cfg.kwargs}"
                cases.append((label, gemm._gather_k_kernel.fn, _sig(names, ce, types), ce, launch_k))
            if run > 1 and run % bn:  # the slabs need BLOCK_N | 128
                continue
            # the chunk path's B1 (W2 in place) also writes its row tiles' column sums (db1's first step)
            # and H~ for B2; F1 on the kept chunks (W1's rows as slabs, run 128, not b_t) the activation
            # epilogue: R~ = relu(round(X W1[ids]^T + b1[ids])) and H~
            act = run > 1 and not b_t
            ce = dict(cfg.kwargs, HAS_R=not act, IEEE=False, USE_TMA=tma, PERSISTENT=persistent, SUMS=b_t)
            ce |= chunk | {"SQ": b_t or act, "ACT": act, "HAS_BIAS": act}
            names = "a_ptr a_desc bt_ptr b_desc ids_ptr r_ptr out_ptr sums_ptr sq_ptr bias_ptr T KC K V stride_a "
            names += "stride_bt stride_ids stride_r stride_out HAS_R IEEE USE_TMA PERSISTENT B_T CHUNK RUN SUMS SQ "
            names += "ACT HAS_BIAS BLOCK_M BLOCK_N BLOCK_K GROUP_M"
            types = {"a_ptr": "*bf16", "a_desc": a_desc, "bt_ptr": "*bf16", "ids_ptr": "*i32", "r_ptr": "*bf16"}
            types |= {"out_ptr": "*bf16", "sums_ptr": "*fp32", "sq_ptr": "*bf16", "bias_ptr": "*bf16"}
            if run > 1:
                types["b_desc"] = f"tensordesc<bf16[{bk},{bn}]>" if b_t else f"tensordesc<bf16[{bn},{bk}]>"
            else:
                types["b_desc"] = "*bf16"
            what = " sums H~" if b_t else " F1 relu H~" if act else ""
            label = f"gather_n{suffix}{what} {cfg.kwargs}"
            cases.append((label, gemm._gather_n_kernel.fn, _sig(names, ce, types), ce, launch))
    # N = 2 ranks the kept chunks' entries; N = 4 keeps them all (the causal 128:4:16 and 128:4:8 of bench.e2e)
    selects = [(16, 32, 2, False), (8, 64, 2, False), (16, 16, 2, False), (16, 64, 4, True), (8, 64, 4, True)]
    selects += [(16, 128, 4, True)]  # the default: causal 128:4:16 in chunks of 128
    for m, c, n, causal in selects:
        rows, rows2, warps = chunk_select.select_tiling(m, c)
        ce = {"M": m, "C": c, "N": n, "ROWS": rows, "ROWS2": rows2, "HAS_BIAS": False, "CAUSAL": causal}
        names = "z_ptr bias_ptr hc_ptr rc_ptr ids_ptr V stride_z stride_c stride_ids SEQ_BLOCKS S M C N ROWS ROWS2 "
        names += "HAS_BIAS CAUSAL"
        types = {k: "*bf16" for k in ("z_ptr", "bias_ptr", "hc_ptr", "rc_ptr")} | {"ids_ptr": "*i32"}
        label = f"chunk select M={m} c={c} N={n}" + (" causal" if causal else "")
        cases.append((label, chunk_select._chunk_select_kernel, _sig(names, ce, types), ce, {"num_warps": warps}))
    # the chunk choice from the scoring rows (score_rows): the selection's pass 1 alone, 128:4:16 c = 128
    ce = {"M": 16, "C": 128, "ROWS": 4}
    names = "zs_ptr ids_ptr stride_z stride_ids NB S SEQ_BLOCKS M C ROWS"
    types = {"zs_ptr": "*bf16", "ids_ptr": "*i32"}
    cases.append(
        ("chunk score M=16 c=128", chunk_score_triton._chunk_score_kernel, _sig(names, ce, types), ce, {"num_warps": 8})
    )
    # the scored mass loss's dZ on the scoring rows: one program per row, tiles of 1024 units
    ce = {"BLOCK": 1024}
    names = "zs_ptr kept_ptr out_ptr h stride_z stride_k stride_o coef NB S SEQ_BLOCKS BLOCK"
    types = {"zs_ptr": "*bf16", "kept_ptr": "*u8", "out_ptr": "*bf16", "coef": "fp32"}
    cases.append(("mass dz", mass_dz_k._mass_dz_kernel, _sig(names, ce, types), ce, {"num_warps": 4}))
    # (c, square, split, units_m, BLOCK_D, warps): the default B2/B4 tiles and B4's units-along-M one
    wgrad = [(32, True, 1, False, 128, 4), (64, False, 1, False, 128, 4), (16, False, 1, False, 128, 4)]
    wgrad += [(64, False, 4, False, 128, 4), (64, True, 1, False, 256, 8)]
    wgrad += [(64, False, 1, True, 256, 4)]  # B2 (square) with units_m: 64 scalar 16-bit loads of A, not built
    wgrad = [(*case, False) for case in wgrad]
    # through TMA descriptors: c = 64 at its default tile, c = 128 at its default (TMA, [256, 128], 5
    # stages) and at [128, 128], and units along M
    wgrad += [(64, False, 1, False, 256, 8, True), (64, True, 1, False, 256, 8, True)]
    wgrad += [(128, False, 1, False, 256, 8, True), (128, True, 1, False, 256, 8, True)]
    wgrad += [(128, False, 1, False, 128, 4, True)]
    wgrad += [(64, False, 1, True, 256, 4, True), (128, False, 1, True, 256, 8, True)]  # B2 units x d: no TMA
    wgrad = [(*case, 0) for case in wgrad]
    # the default: TAIL 1 (the grid less the tail's tiles) and 2 (the tail's pieces)
    wgrad += [(128, square, 1, False, 256, 8, True, stage) for stage in (1, 2) for square in (False, True)]
    for c, square, split, units_m, block_d, warps, tma, tail in wgrad:
        ce = {
            "C": c,
            "BLOCK_D": block_d,
            "BLOCK_K": 64,
            "SQUARE": square,
            "TRANSPOSE": square,
            "EVEN_D": True,
            "I64": False,
            "IEEE": False,
            "SPLIT": split,
            "UNITS_M": units_m,
            "USE_TMA": tma,
            "GROUP_D": 12,
            "ORDERED": c >= 128,
            "TAIL": tail,
            "NCP": 128,
            "MOST": 8,
        }
        names = "a_ptr b_ptr out_ptr offsets_ptr blocks_ptr cols_ptr order_ptr ws_ptr D H V stride_a stride_b P "
        names += "C BLOCK_D BLOCK_K SQUARE TRANSPOSE EVEN_D I64 IEEE SPLIT UNITS_M USE_TMA GROUP_D ORDERED "
        names += "TAIL NCP MOST"
        types = (
            {"a_ptr": f"tensordesc<bf16[64,{c}]>", "b_ptr": f"tensordesc<bf16[64,{block_d}]>"}
            if tma
            else {"a_ptr": "*bf16", "b_ptr": "*bf16"}
        )
        types["out_ptr"] = "*bf16" if split == 1 else "*fp32"
        types |= {k: "*i32" for k in ("offsets_ptr", "blocks_ptr", "cols_ptr", "order_ptr")} | {"ws_ptr": "*fp32"}
        label = f"chunk wgrad c={c}" + (f" split {split}" if split > 1 else "") + (f" tail {tail}" if tail else "")
        label += f" {'B2' if square else 'B4'} {'units x ' if units_m else ''}{block_d} w{warps}{' TMA' if tma else ''}"
        stages = 5 if c >= 128 and block_d == 256 and not units_m else 3  # chunk_wgrad's defaults
        label += f" s{stages}"
        launch = {"num_warps": warps, "num_stages": stages}
        cases.append((label, chunk_wgrad._chunk_wgrad_kernel, _sig(names, ce, types), ce, launch))
    ce = {"C": 128, "BLOCK_D": 256, "ROWS": 32, "TRANSPOSE": True, "GROUP_D": 4, "NCP": 128, "MOST": 8}
    types = {"ws_ptr": "*fp32", "out_ptr": "*bf16", "offsets_ptr": "*i32", "order_ptr": "*i32"}
    names = "ws_ptr out_ptr offsets_ptr order_ptr D H P C BLOCK_D ROWS TRANSPOSE GROUP_D NCP MOST"
    cases.append(("chunk wgrad tail sum", chunk_wgrad._tail_sum_kernel, _sig(names, ce, types), ce))
    ce = {"C": 64, "ENT": 32}
    types = {"part_ptr": "*fp32", "db_ptr": "*bf16"} | {k: "*i32" for k in ("offsets_ptr", "blocks_ptr", "cols_ptr")}
    names = "part_ptr db_ptr offsets_ptr blocks_ptr cols_ptr KC R C ENT"
    cases.append(("chunk colsum", chunk_wgrad._chunk_colsum_kernel, _sig(names, ce, types), ce))
    types = {k: "*i32" for k in ("ids_ptr", "offsets_ptr", "blocks_ptr", "cols_ptr", "order_ptr")}
    names = "ids_ptr offsets_ptr blocks_ptr cols_ptr order_ptr E stride_ids PER_BLOCK C BLOCK_E ORDER NCP"
    for ordered in (False, True):  # the c = 128 tile's csr also ranks the chunks (128 bins: 2.7B's 96 chunks)
        ce = {"PER_BLOCK": 16, "C": 128 if ordered else 64, "BLOCK_E": 1024, "ORDER": ordered, "NCP": 128}
        label = "chunk csr" + (" + order" if ordered else "")
        cases.append((label, chunk_wgrad._chunk_csr_kernel, _sig(names, ce, types), ce))
    ce = {"SPLIT": 4, "BLOCK": 2048}
    types = {"part_ptr": "*fp32", "out_ptr": "*bf16"}
    sig = _sig("part_ptr out_ptr n SPLIT BLOCK", ce, types)
    cases.append(("sum partials", chunk_wgrad._sum_partials_kernel, sig, ce))
    return [case if len(case) == 5 else (*case, {}) for case in cases]  # the rest: default warps and stages


VECTORIZED = (
    "chunk wgrad",
    "chunk select",
    "chunk score",
    "select 128:2:16",
    "select 64:2:8",
    "activation 2:4",
    "cuSPARSELt",
    "transposable 2:4 pairs",
    "gather",
    "transpose",
    "sum partials",
    "chunk colsum",
    "mass dz",
)
# The selection kernel's second pass reads only the 4 kept columns of each M-group (a gather at the
# ids, 4 scalar loads per group and row, all inside the group's 32-byte sector).
GATHERED_LOADS = ("select",)
# The gathers that read W2 in place along runs of chunk ids: every async copy of the gathered weight
# tile a full 16-byte vector, as on a contiguous W2^T; the hint on the ids is what makes it so.
WIDE_COPIES = ("gather_k TMA chunk", "gather_n TMA chunk", "gather_n TMA persistent chunk")
# gather_k's bias row at 8 warps: BLOCK_N = 256 values over 256 threads, one each: a single scalar
# 16-bit load per thread by its shape (at 4 warps it was two per thread, one vector)
ONE_PER_THREAD = ("gather_k",)
# One program stores its C column sums (64 values over 128-256 threads): scalar stores by design; its loads are checked.
SUMMED_STORES = ("chunk colsum",)


def memory_ops(ptx: str) -> Counter:
    """Global load/store instructions of a PTX text by kind, cache hints included, e.g.
    {'ld.global.v4.b32': 8, 'ld.global.L1::evict_last.L2::cache_hint.v4.b32': 4}."""
    return Counter(re.findall(r"(?:ld|st)\.global(?:\.(?:\w|::)+)*", ptx))


def single_buffered_async_dots(ttgir: str) -> list[str]:
    """The one-slot shared tiles (memdesc<1xRxC> of a float type) of a kernel whose wgmmas run
    asynchronously (pendings >= 1). Triton 3.6 single-buffers a pipelined tile that is read both by a
    dot and from registers, then refills that slot with the next step's async copy while the
    previous wgmma may still read it: wrong results (chunk wgrad's db1 from tl.sum, 1-4% off dW1)."""
    if not re.search(r"warp_group_dot_wait[^\n]*pendings = [1-9]", ttgir):
        return []
    return re.findall(r"local_alloc : \(\) -> !ttg\.memdesc<1x\d+x\d+x(?:bf16|f16|f32)", ttgir)


def narrow_half_copies(ttgir: str) -> list[str]:
    """The async copies of 16-bit tiles (bf16/f16) whose contiguity is under 8 elements (16 bytes),
    from the TTGIR: a gathered weight tile read in pieces. (The ids' int32 copies may be 4 bytes.)"""
    narrow = []
    for line in ttgir.splitlines():
        if "async_copy_global_to_local" in line and re.search(r"ptr<(?:bf16|f16)>", line):
            found = re.search(r"contiguity = (\d+)", line)
            if found is None or int(found.group(1)) < 8:
                narrow.append(found.group(0) if found else "no contiguity")
    return narrow


def sass_counts(cubin: bytes) -> str:
    """A cubin's registers per thread, SASS instructions and barriers as text ("" without cuobjdump)."""
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    if not os.path.exists(tool):
        return ""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        sass = subprocess.run([tool, "-sass", f.name], capture_output=True, text=True).stdout
        usage = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True).stdout
    lines = [line for line in sass.splitlines() if re.match(r"\s+/\*[0-9a-f]{4,}\*/", line)]
    regs = re.search(r"REG:(\d+)", usage)
    barriers = sum("BAR.SYNC" in line for line in lines)
    return f"regs {regs.group(1) if regs else '?'}, SASS {len(lines)} instructions, {barriers} barriers; "


def check(index: int) -> tuple[bool, str]:
    """Compile kernels()[index] both ways and read its PTX/TTGIR: (failed, the report line)."""
    name, fn, signature, constexprs, options = kernels()[index]
    target = GPUTarget("cuda", 90, 32)
    try:
        triton.compile(ASTSource(fn=fn, signature=signature, constexprs=constexprs), target=target, options=options)
        div16 = {
            (i,): [["tt.divisibility", 16]]
            for i, n in enumerate(signature)
            if signature[n] != "constexpr" and not signature[n].startswith("tensordesc")
        }
        compiled = triton.compile(
            ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=div16), target=target, options=options
        )
    except Exception as e:  # noqa: BLE001 - report every kernel, then fail
        return True, f"FAILED  {name}: {type(e).__name__}: {str(e)[:2000]}"
    ptx, sass = compiled.asm["ptx"], sass_counts(compiled.asm["cubin"])
    sass += f"shared {compiled.metadata.shared / 1024:.1f} KB; "
    ops = memory_ops(ptx)
    copies = re.findall(r"cp\.async\.c[ag]\.shared\.global \[[^\]]*\], \[[^\]]*\], (0x[0-9a-f]+|\d+)", ptx)
    ops.update(f"cp.async {int(n, 0)}B" for n in copies)
    narrow = narrow_half_copies(compiled.asm["ttgir"])
    scalar16 = {k: v for k, v in ops.items() if k.endswith(".b16") and ".v" not in k}
    if name.startswith(GATHERED_LOADS):  # their gathered reads are scalar by design; stores must not be
        scalar16 = {k: v for k, v in scalar16.items() if k.startswith("st.")}
    if name.startswith(ONE_PER_THREAD) and scalar16 == {"ld.global.b16": 1}:
        scalar16 = {}
    if name.startswith(SUMMED_STORES):
        scalar16 = {k: v for k, v in scalar16.items() if k.startswith("ld.")}
    racy = single_buffered_async_dots(compiled.asm["ttgir"])
    if name.startswith(VECTORIZED) and scalar16:
        return True, f"FAILED  {name}: scalar 16-bit global accesses {scalar16} (all: {dict(ops)})"
    if name.startswith(WIDE_COPIES) and narrow:
        return True, f"FAILED  {name}: 16-bit tiles copied in pieces under 16 bytes {narrow} (all: {dict(ops)})"
    if racy:
        return True, f"FAILED  {name}: one-slot pipelined tiles under async wgmma: {racy}"
    return False, f"ok      {name}  {sass}{dict(ops)}"


def main(argv: list[str]) -> int:
    """Every kernel checked (with arguments: those whose label starts with one of them), one process
    per core (each compile is single-threaded); lines in kernels() order."""
    picked = [i for i, case in enumerate(kernels()) if not argv or case[0].startswith(tuple(argv))]
    with multiprocessing.get_context("spawn").Pool(min(os.cpu_count() or 1, 8)) as pool:
        results = pool.map(check, picked, chunksize=1)
    for _, line in results:
        print(line)
    return 1 if any(failed for failed, _ in results) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
