"""python -m bench.select_kernel: the fused V:N:M selection kernel on a GPU, exact and timed.

For each (T, h, pattern): checks vnm_select_compact == vnm_compact_ref bit for bit (bf16), then
times both (triton.testing.do_bench medians); with --seq S also the causal pattern of every V > 1
(sequences of S tokens: the two-read kernel scoring the previous block). Bytes counted: read Z
(T*h*2) + write h_c and r_c (2 * T*h*4/M*2) + ids ((T/V)*h*4/M*4). Then the same for the compressed 2:4 kernel
(activation_24 vs activation_24_ref): read Z, write values (T*h/2*2) + uint8 metadata (T*h/4), plus
the masked dense H~ (T*h*2) in the "+ masked" rows. Then the 2:4 activation path's fused cuSPARSELt
kernels (kernels/sqrelu_24_compress_triton.py), checked bit for bit against their references and h_buf
against torch._cslt_compress: forward reads Z, writes two sm90 buffers (2 * T*h*(1/2 + 1/16)*2);
backward reads dH and r_buf, writes dz_buf and the dense dZ~ and H~; the torch route each replaces
is relu^2 + the 2:4 mask (+ dZ~ = dH * 2 R~) + torch._cslt_compress per buffer.
The ceiling is the measured device-to-device copy rate (bytes read + written) of a 1 GiB buffer on
the same GPU.
"""

import argparse
import functools
import math
import sys

import torch
import triton.testing
from tabulate import tabulate

from bench.env import write_csv
from bench.gpu_timing import start_gpu_bench, sweep_tilings
from sparse_compile.kernels.activation_mask import vnm_compact_ref, vnm_mask
from sparse_compile.kernels.activation_select_24_triton import activation_24, activation_24_ref
from sparse_compile.kernels.activation_select_triton import vnm_select_compact
from sparse_compile.kernels.sqrelu_24_compress_triton import (
    sqrelu_24_backward,
    sqrelu_24_backward_ref,
    sqrelu_24_compress,
    sqrelu_24_compress_ref,
)

PATTERNS = [(1, 2, 4), (64, 2, 8), (128, 2, 8), (128, 4, 8), (128, 2, 16), (128, 4, 16)]


def id_mismatches(z, b, v: int, m: int, got_ids: torch.Tensor, want_ids: torch.Tensor) -> tuple[int, float]:
    """(V x M blocks whose 4 kept columns differ, the largest float64 gap between the 4th and 5th
    column norm among them, relative to the 4th). The kernel and the reference sum the float32
    column norms in different orders, so blocks whose 4th and 5th norm are equal to within float32
    rounding (gap ~1e-7) may pick differently; a larger gap is a bug."""
    differ = (got_ids != want_ids).reshape(want_ids.shape[0], -1, 4).any(-1)  # [T/V, F/M]
    if not differ.any():
        return 0, 0.0
    r = torch.relu(z if b is None else z + b)
    h = (r * r).double()
    norms = h.reshape(z.shape[0] // v, v, -1, m).sum(1)[differ]  # [blocks, M]
    top = norms.sort(-1, descending=True).values
    return int(differ.sum()), ((top[:, 3] - top[:, 4]) / top[:, 3].clamp_min(1e-300)).max().item()


def sweep(t: int, h: int, ceiling: float) -> list[dict]:
    """Time the tilings of the selection kernel (outputs checked exact against the default tiling)."""
    z = torch.randn(t, h, device="cuda", dtype=torch.bfloat16)
    out = []
    for v, n, m in [(128, 2, 16), (128, 2, 8)]:
        want = vnm_select_compact(z, None, v, n, m)
        nbytes = t * h * 2 + 2 * t * h * 4 // m * 2 + (t // v) * h * 4 // m * 4
        configs = [
            {"block_g": block_g, "rows": rows, "num_warps": warps}
            for block_g in (256 // m, 128 // m, 64 // m, 32 // m)
            for rows in (4, 8, 16, 32)
            for warps in (2, 4, 8)
            if block_g * m * rows <= 8192
        ]
        out += sweep_tilings(
            functools.partial(vnm_select_compact, z, None, v, n, m),
            configs,
            lambda got, want=want: all(torch.equal(a, b) for a, b in zip(got, want, strict=True)),
            nbytes,
            ceiling,
            pattern=f"{v}:{n}:{m}",
        )
    return out


def _bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(a.view(torch.int16), b.view(torch.int16))


def act24_cslt_rows(z: torch.Tensor, ceiling: float, git: str) -> list[dict]:
    """Forward and backward of the fused 2:4 -> cuSPARSELt kernels on Z (no bias: F1 adds it)."""
    t, h = z.shape
    r = torch.relu(z)
    keep = vnm_mask(r * r, 1, 2, 4)
    h_buf, r_buf = sqrelu_24_compress(z)
    exact = all(_bits_equal(a, b) for a, b in zip((h_buf, r_buf), sqrelu_24_compress_ref(z), strict=True))
    exact = exact and _bits_equal(h_buf, torch._cslt_compress(r * r * keep))

    def torch_fwd():
        rm = torch.relu(z) * vnm_mask(torch.relu(z).square(), 1, 2, 4)
        return torch._cslt_compress(rm * rm), torch._cslt_compress(rm)

    dh = torch.randn_like(z)
    got, want = sqrelu_24_backward(dh, r_buf), sqrelu_24_backward_ref(dh, r_buf)
    exact_bwd = _bits_equal(got[0], want[0]) and all(torch.equal(a, b) for a, b in zip(got[1:], want[1:], strict=True))
    r_masked = r * keep

    def torch_bwd():
        dz = (dh.float() * (2.0 * r_masked.float())).to(dh.dtype)
        return torch._cslt_compress(dz), dz, r_masked * r_masked

    buf = t * (h // 2 + h // 16) * 2
    rows = []
    for name, ok, fn, ref, nbytes in (
        ("2:4 -> cuSPARSELt fwd", exact, lambda: sqrelu_24_compress(z), torch_fwd, t * h * 2 + 2 * buf),
        ("2:4 -> cuSPARSELt bwd", exact_bwd, lambda: sqrelu_24_backward(dh, r_buf), torch_bwd,
         t * h * 2 + buf + buf + 2 * t * h * 2),
    ):  # fmt: skip
        ms = triton.testing.do_bench(fn, return_mode="median")
        ms_ref = triton.testing.do_bench(ref, return_mode="median")
        gbps = nbytes / ms / 1e6
        rows.append(
            {
                "T": t, "h": h, "pattern": name, "exact": ok, "ms": ms, "GB/s": gbps, "of copy": gbps / ceiling,
                "torch ms": ms_ref, "speedup": ms_ref / ms, "git": git,
            }
        )  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.select_kernel", description=__doc__)
    p.add_argument("--tokens", type=int, default=16384)
    p.add_argument("--hidden", default="8192,16384", help="comma-separated hidden sizes")
    p.add_argument("--csv", help="write the rows here")
    p.add_argument("--seq", type=int, help="also the causal patterns over sequences of this many tokens")
    p.add_argument("--sweep", action="store_true", help="also time tilings (block_g, rows, num_warps) at the largest h")
    args = p.parse_args(argv)
    env, ceiling = start_gpu_bench(p, "python -m bench.select_kernel", argv)
    rows = []
    t = args.tokens
    for h in (int(s) for s in args.hidden.split(",")):
        z = torch.randn(t, h, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(h, device="cuda", dtype=torch.bfloat16) * 0.1
        cases = [(v, n, m, None) for v, n, m in PATTERNS]
        cases += [(v, n, m, args.seq) for v, n, m in PATTERNS if args.seq and v > 1]
        for v, n, m, seq in cases:
            got = vnm_select_compact(z, b, v, n, m, seq=seq)
            want = vnm_compact_ref(z, b, v, n, m, seq=seq)
            exact = all(torch.equal(a, r) for a, r in zip(got, want, strict=True))
            again = vnm_select_compact(z, b, v, n, m, seq=seq)
            repeatable = all(torch.equal(a, r) for a, r in zip(got, again, strict=True))
            differ = [k for k, a, r in zip(("h_c", "r_c", "ids"), got, want, strict=True) if not torch.equal(a, r)]
            if seq is None:
                blocks, gap = id_mismatches(z, b, v, m, got[2], want[2])
            else:  # the norm-gap excuse is for the plain pattern's summation order only
                blocks, gap = int((got[2] != want[2]).any(-1).sum()), (math.inf if differ else 0.0)
            ms = triton.testing.do_bench(
                functools.partial(vnm_select_compact, z, b, v, n, m, seq=seq), return_mode="median"
            )
            ms_ref = triton.testing.do_bench(
                functools.partial(vnm_compact_ref, z, b, v, n, m, seq=seq), return_mode="median"
            )
            nbytes = t * h * 2 + 2 * t * h * 4 // m * 2 + (t // v) * h * 4 // m * 4
            gbps = nbytes / ms / 1e6
            rows.append(
                {
                    "T": t,
                    "h": h,
                    "pattern": f"{v}:{n}:{m}" + (f" causal, seq {seq}" if seq else ""),
                    "exact": exact,
                    "differ": "+".join(differ),
                    "repeatable": repeatable,
                    "blocks differing": blocks,
                    "max norm gap": gap,
                    "ms": ms,
                    "GB/s": gbps,
                    "of copy": gbps / ceiling,
                    "torch ms": ms_ref,
                    "speedup": ms_ref / ms,
                    "git": env["git"],
                }
            )
        for masked in (False, True):
            got = activation_24(z, b, masked)
            want = activation_24_ref(z, b, masked)
            exact = all(torch.equal(a, r) for a, r in zip(got, want, strict=True) if a is not None)
            call = (z, b, masked)
            ms = triton.testing.do_bench(lambda c=call: activation_24(*c), return_mode="median")
            ms_ref = triton.testing.do_bench(lambda c=call: activation_24_ref(*c), return_mode="median")
            nbytes = t * h * 2 + t * h + t * h // 4 + (t * h * 2 if masked else 0)
            gbps = nbytes / ms / 1e6
            rows.append(
                {
                    "T": t, "h": h, "pattern": "2:4 compressed" + (" + masked" if masked else ""),
                    "exact": exact, "ms": ms, "GB/s": gbps, "of copy": gbps / ceiling,
                    "torch ms": ms_ref, "speedup": ms_ref / ms, "git": env["git"],
                }
            )  # fmt: skip
        rows += act24_cslt_rows(z, ceiling, env["git"])
    print(tabulate(rows, headers="keys", floatfmt=".3f", tablefmt="github"))
    if args.sweep:
        print(tabulate(sweep(t, h, ceiling), headers="keys", floatfmt=".3f", tablefmt="github"))
    if args.csv:
        write_csv(args.csv, rows)
    ok = all((r["exact"] or r.get("max norm gap", 1.0) < 1e-6) and r.get("repeatable", True) for r in rows)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
