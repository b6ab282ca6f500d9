"""Which kernels compute a sparse FFN site, decided once per site at compile time.

  "reference"          pure torch, masked dense math (CPU; and CUDA under kernels="reference")
  "reference (cuda)"   the same on CUDA: masked dense cuBLAS GEMMs, no faster than dense
  "triton gather"      V:N:M activations on the compact operand (kernels/ffn_gather.py):
                       F2, B1, B3 on K reduced by M/4, exact B2/B4 on cuBLAS
The gather path needs V:N:M activations with V a multiple of 16, T a known multiple of V,
bf16/fp16 (fp32 would need IEEE-fp32 dots, slower than cuBLAS fp32), and sm80+. Anything else
runs the reference kernels, and the report says why. kernels="triton" forces the gather path
wherever the pattern allows (fp32 included; on CPU only under TRITON_INTERPRET=1, for tests).
With 2:4 weights on the gather path, F1 runs on cuSPARSELt where that measured faster than cuBLAS
on this GPU at the site's shape (sparse_compile/f1_choice.py); the plan carries the algorithm id.
Under kernels="auto" each of F2, B1, B3 runs on its gather kernel or on cuBLAS over the dense
operand, whichever measured faster at the site's shape (sparse_compile/gather_choice.py).
2:4 weight masks on CUDA always come from the Triton kernel (kernels/weight_mask_triton.py), which
gives the reference's answer, so it is not a choice here.
"""

import os
from dataclasses import dataclass

import torch
from torch.fx.experimental.symbolic_shapes import statically_known_true

from sparse_compile.config import SparsityConfig

DEVICES = ("cpu", "cuda")
GATHER = "triton gather"


@dataclass(frozen=True)
class KernelPlan:
    kernel: str
    gather: bool
    why: str = ""  # why the fast path is not taken ("" when it is, or when none was asked for)
    f1_alg: int | None = None  # cuSPARSELt algorithm of F1 (2:4 weights), None = cuBLAS
    f1_why: str = ""  # the F1 measurement, for the report
    dense_gemms: frozenset[str] = frozenset()  # of F2, B1, B3: on cuBLAS (measured faster)
    gemm_why: str = ""  # the F2/B1/B3 measurement, for the report

    @property
    def spec_suffix(self) -> str:
        """What the op's spec string adds for this plan."""
        f1 = "" if self.f1_alg is None else f";f1_alg={self.f1_alg}"
        return f1 + (f";dense_gemms={'+'.join(sorted(self.dense_gemms))}" if self.dense_gemms else "")


def _reference(device_type: str, why: str = "") -> KernelPlan:
    return KernelPlan("reference" if device_type == "cpu" else "reference (cuda)", False, why)


def plan_kernels(
    device: torch.device, dtype: torch.dtype, tokens, config: SparsityConfig, d: int = 0, h: int = 0
) -> KernelPlan:
    """The kernels of a site whose input has ``tokens`` rows (an int or a SymInt) on ``device``,
    with W1 of shape [h, d] (0: unknown, no F1 choice)."""
    if device.type not in DEVICES:
        raise ValueError(f"sparse_compile: no kernels for device {device.type!r}; supported: {DEVICES}")
    if config.kernels == "reference":
        return _reference(device.type)
    if config.kernels == "triton" and device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError("sparse_compile: kernels='triton' on CPU needs TRITON_INTERPRET=1 (the Triton interpreter)")
    if config.kernels == "auto" and device.type == "cpu":
        return _reference("cpu")
    pattern = config.activation_pattern
    if pattern is None or pattern[0] == 1:
        what = "2:4 weights alone" if pattern is None else "2:4 activations (V=1)"
        return _reference(device.type, f"{what}: no fast kernel yet, masked dense GEMMs")
    v = pattern[0]
    if v % 16:
        return _reference(device.type, f"V={v}: the gather kernels need V a multiple of 16")
    if not statically_known_true(tokens % v == 0):
        return _reference(device.type, f"T={tokens} is not known to be a multiple of V={v}")
    if config.kernels == "auto" and dtype not in (torch.bfloat16, torch.float16):
        return _reference(device.type, f"{str(dtype).removeprefix('torch.')}: the fast kernels are bf16/fp16")
    if device.type == "cuda" and torch.cuda.get_device_capability(device) < (8, 0):
        return _reference(device.type, "GPU older than sm80")
    if device.type != "cuda" or not (d and h):
        return KernelPlan(GATHER, True)
    t = tokens.node.hint if isinstance(tokens, torch.SymInt) else int(tokens)
    no_hint = "no example token count to measure at"
    f1_alg, f1_why = None, ""
    if config.weights == "2:4":
        from sparse_compile import f1_choice

        f1_why = f1_choice.applies(device, dtype, d, h) or (f"F1 cuBLAS: {no_hint}" if t is None else "")
        if not f1_why:
            choice = f1_choice.choose_f1(device.index or 0, dtype, t, d, h)
            f1_alg, f1_why = choice.alg, choice.why
    dense, gemm_why = frozenset(), ""
    if config.kernels == "auto":
        from sparse_compile import gather_choice

        if t is None:
            gemm_why = f"F2, B1, B3 gather kernels: {no_hint}"
        else:
            picked = gather_choice.choose_gathers(device.index or 0, dtype, t, d, h, *pattern)
            dense, gemm_why = picked.dense, picked.why
    return KernelPlan(GATHER, True, f1_alg=f1_alg, f1_why=f1_why, dense_gemms=dense, gemm_why=gemm_why)
