"""Which kernels compute a sparse FFN site, decided once per site at compile time.

  "reference"          pure torch, masked dense math (CPU; and CUDA under kernels="reference")
  "reference (cuda)"   the same on CUDA: masked dense cuBLAS GEMMs, no faster than dense
  "triton gather"      V:N:M activations on the compact operand (kernels/ffn_gather.py):
                       F2, B1, B3 on K reduced by M/4, exact B2/B4 on cuBLAS; with neuron
                       chunks (chunk a power of two >= 16) B2/B4 block-sparse along tokens
  "2:4 weight linears" 2:4 weights alone: the FFN's two linears become sparse_compile::linear_24
                       (F1, F2 and their dX GEMMs B3, B1 on cuSPARSELt where it measured faster,
                       with W~ or W~^T as the sparse operand), relu and square stay in the graph
  "triton 2:4"         2:4 activations (kernels/ffn_act24_cslt.py): the squared ReLU, 2:4 choice and
                       cuSPARSELt compression in one pass; F2 and B3 on cuSPARSELt with the activation
                       as the sparse operand where that measured faster than cuBLAS, else on cuBLAS
  "grouped GEMM"       per-token chunks (1:4:M in chunks of c): each chunk a grouped-GEMM "expert"
                       over the tokens that kept it (kernels/ffn_grouped.py, torch._grouped_mm); F1
                       first on the score_units of each chunk (or dense) to choose
The gather path needs V:N:M activations with V a multiple of 16, T a known multiple of V,
bf16/fp16 (fp32 would need IEEE-fp32 dots, slower than cuBLAS fp32), and sm80+. Anything else
runs the reference kernels, and the report says why. kernels="triton" forces the gather path
wherever the pattern allows (fp32 included; on CPU only under TRITON_INTERPRET=1, for tests).
With 2:4 weights on the gather path, F1 runs on cuSPARSELt where that measured faster than cuBLAS
on this GPU at the site's shape (sparse_compile/planning/f1_choice.py); the plan carries the algorithm id.
Under kernels="auto" each of F2, B1, B3 runs on its gather kernel or on cuBLAS over the dense
operand, whichever measured faster at the site's shape (sparse_compile/planning/gather_choice.py).
The grouped path needs 1:4:M, chunk, d and d_out multiples of 8, exact weight gradients, bf16 on
sm90 or sm100 and, under kernels="auto", chunks of at least 256 units (a chunk GEMM does about c FLOP per
byte of its token rows: narrower chunks are bound by memory); kernels="triton" forces it (on CPU too:
torch's grouped GEMM runs there, for tests).
The 2:4 activation path needs activations "2:4", an sm90 GPU (the compressor's layout), bf16/fp16,
T known to be a multiple of 64, and d and h multiples of 64; F2 and B3 go to cuSPARSELt when it
measured faster than cuBLAS at the site's shape (sparse_compile/planning/act24_choice.py), or under
kernels="triton" whenever an algorithm gives the right answer.
2:4 weight masks on CUDA always come from the Triton kernel (kernels/weight_mask_triton.py), which
gives the reference's answer, so it is not a choice here.
"""

import os
from dataclasses import dataclass

import torch
from torch.fx.experimental.symbolic_shapes import statically_known_true

from sparse_compile.contract import DEVICES
from sparse_compile.schema import SparsityConfig

NO_HINT = "no example token count to measure at"
GATHER = "triton gather"
CSLT24 = "triton 2:4"
W24 = "2:4 weight linears"
ROUTED = "triton routed gather"
ROUTED_REF = "routed reference"
GROUPED = "grouped GEMM"
GROUPED_MIN_CHUNK = 256  # auto: per-token chunks this wide and wider run grouped (c FLOP per byte of token rows)
GROUPED_MAJORS = (9, 10)  # compute capability majors with torch's grouped GEMM kernels (sm90, sm100)


@dataclass(frozen=True)
class KernelPlan:
    kernel: str
    gather: bool
    why: str = ""  # why the fast path is not taken ("" when it is, or when none was asked for)
    f1_alg: int | None = None  # cuSPARSELt algorithm of F1 (2:4 weights), None = cuBLAS
    f1_why: str = ""  # the F1 measurement, for the report
    dense_gemms: frozenset[str] = frozenset()  # of F2, B1, B3: on cuBLAS (measured faster)
    gemm_why: str = ""  # the F2/B1/B3 measurement, for the report
    act24_alg: int | None = None  # 2:4 activations: cuSPARSELt algorithm of F2 and B3 (-1: cuBLAS)
    f2_alg: int | None = None  # 2:4 weights alone: cuSPARSELt algorithm of F2 and B3 (F1, B1: f1_alg)

    @property
    def op(self) -> str:
        """The sparse_compile op the site is rewritten into."""
        ops = {GATHER: "sqrelu_ffn_vnm", CSLT24: "sqrelu_ffn_24", W24: "linear_24", ROUTED: "sqrelu_ffn_routed",
               GROUPED: "sqrelu_ffn_grouped"}  # fmt: skip
        return ops.get(self.kernel, "sqrelu_ffn_routed" if self.kernel.startswith(ROUTED_REF) else "sqrelu_ffn")

    @property
    def linear_algs(self) -> tuple[int, int]:
        """linear_24's algorithms of the [T, d] -> [T, h] and [T, h] -> [T, d] GEMMs (-1: cuBLAS)."""
        return tuple(-1 if a is None else a for a in (self.f1_alg, self.f2_alg))


def _reference(device_type: str, why: str = "") -> KernelPlan:
    return KernelPlan("reference" if device_type == "cpu" else "reference (cuda)", False, why)


def plan_kernels(
    device: torch.device, dtype: torch.dtype, tokens, config: SparsityConfig, d: int = 0, h: int = 0, d_out: int = 0
) -> KernelPlan:
    """The kernels of a site whose input has ``tokens`` rows (an int or a SymInt) on ``device``,
    with W1 of shape [h, d] and W2 of [d_out, h] (0: unknown, no F1 choice)."""
    if device.type not in DEVICES:
        raise ValueError(f"sparse_compile: no kernels for device {device.type!r}; supported: {DEVICES}")
    if config.routes is not None:
        return _plan_routed(device, dtype, config)
    if config.kernels == "reference":
        return _reference(device.type)
    pattern = config.activation_pattern
    # the mass loss's gradient needs H in full on its rows: the gather path has it on the scoring rows alone
    all_rows = config.mass_loss and (config.mass_loss_rows == "all" or pattern[0] == 1)
    why = "; ".join(
        [f"token_extra={config.token_extra}: no fast kernel takes per-token extra units"] * bool(config.token_extra)
        + [f"mass_loss={config.mass_loss:g}: its gradient needs H in full (F1 dense)"] * bool(all_rows)
    )
    if why:
        return _reference(device.type, why)
    if pattern is not None and pattern[0] == 1 and config.chunk > 1:
        return _plan_grouped(device, dtype, config, d, d_out)
    if config.kernels == "triton" and device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError("sparse_compile: kernels='triton' on CPU needs TRITON_INTERPRET=1 (the Triton interpreter)")
    if config.kernels == "auto" and device.type == "cpu":
        return _reference("cpu")
    if pattern is None:
        return _plan_w24(device, dtype, tokens, config, d, h)
    if pattern == (1, 2, 4):
        return _plan_24(device, dtype, tokens, config, d, h)
    v, _, m = pattern
    if v % 16:
        return _reference(device.type, f"V={v}: the gather kernels need V a multiple of 16")
    if not statically_known_true(tokens % v == 0):
        return _reference(device.type, f"T={tokens} is not known to be a multiple of V={v}")
    if config.kernels == "auto" and dtype not in (torch.bfloat16, torch.float16):
        return _reference(device.type, f"{str(dtype).removeprefix('torch.')}: the fast kernels are bf16/fp16")
    if device.type == "cuda" and torch.cuda.get_device_capability(device) < (8, 0):
        return _reference(device.type, "GPU older than sm80")
    c = config.chunk
    if c > 1:
        from sparse_compile.kernels.ffn_gather import chunk_path_supports, f1_on_scoring_rows  # Triton: when used

        if config.weight_grad_pattern is not None or not chunk_path_supports(v, m, c):
            return _reference(
                device.type,
                f"chunks of {c}: the gather path needs chunk a power of two >= 16, M*chunk a power of two "
                f"and exact weight gradients (M={m}, weight_grad={config.weight_grad})",
            )
    cuda_shapes = device.type == "cuda" and d and h
    f1_alg, f1_why = _f1(device, dtype, tokens, config, d, h) if cuda_shapes else (None, "")
    scored = c > 1 and f1_on_scoring_rows(v, pattern[1], c, config.causal, config.score_rows, f1_alg)
    if config.mass_loss and not scored:
        return _reference(
            device.type,
            f"mass_loss={config.mass_loss:g} on the scoring rows: the fast path has those rows' H in full only "
            "for causal V:4:M chunks scored on fewer than V rows with F1 on cuBLAS"
            + (f" ({f1_why})" if f1_alg is not None else ""),
        )
    if not cuda_shapes:
        return KernelPlan(GATHER, True)
    t = _hint(tokens)
    dense, gemm_why = frozenset(), ""
    if c > 1:
        rows = config.score_rows
        f1 = f"F1 on each block's last {rows} rows (cuBLAS) and its kept chunks (gather); " if scored else ""
        mass = (
            f"; mass_loss={config.mass_loss:g} on those rows: dZ there from the forward's Z, two more GEMMs of "
            f"{rows}/{v} of F1's size in the backward"
        ) * bool(config.mass_loss)
        gemm_why = f"chunks of {c}: {f1}F2, B1, B3 gather; B2, B4 block-sparse along tokens (no cuBLAS choice){mass}"
    elif config.kernels == "auto":
        from sparse_compile.planning import gather_choice

        if t is None:
            gemm_why = f"F2, B1, B3 gather kernels: {NO_HINT}"
        else:
            picked = gather_choice.choose_gathers(device.index or 0, dtype, t, d, h, *pattern)
            dense, gemm_why = picked.dense, picked.why
    return KernelPlan(GATHER, True, f1_alg=f1_alg, f1_why=f1_why, dense_gemms=dense, gemm_why=gemm_why)


def _plan_routed(device: torch.device, dtype: torch.dtype, config: SparsityConfig) -> KernelPlan:
    """Routed tokens: the gather kernels on the tokens sorted by route (kernels/ffn_routed.py), any T
    (groups are padded to V), where the chunk kernels take the pattern; else the masked dense reference."""
    v, _, m = config.activation_pattern
    c = config.chunk

    def reference(why: str = "") -> KernelPlan:
        return KernelPlan(ROUTED_REF + ("" if device.type == "cpu" else " (cuda)"), False, why)

    if config.kernels == "reference" or (config.kernels == "auto" and device.type == "cpu"):
        return reference()
    if config.kernels == "triton" and device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError("sparse_compile: kernels='triton' on CPU needs TRITON_INTERPRET=1 (the Triton interpreter)")
    if config.kernels == "auto" and dtype not in (torch.bfloat16, torch.float16):
        return reference(f"{str(dtype).removeprefix('torch.')}: the fast kernels are bf16/fp16")
    if device.type == "cuda" and torch.cuda.get_device_capability(device) < (8, 0):
        return reference("GPU older than sm80")
    from sparse_compile.kernels.ffn_gather import chunk_path_supports  # Triton: when used

    if v % 16 or not chunk_path_supports(v, m, c):
        return reference(f"routed {v}:4:{m} in chunks of {c}: the gather path needs V a multiple of 16, chunk a "
                         "power of two >= 16 and M*chunk a power of two")  # fmt: skip
    why = (f"{config.routes} groups routed per token; F1 and F2, B1, B3 gathered on the kept chunks, "
           "B2, B4 block-sparse along tokens")  # fmt: skip
    if config.router == "oracle":
        why += "; routed by the oracle: F1 in full on every call to choose (a quality probe)"
    elif config.router == "linear":
        why += "; routed by a linear router of x fitted to the best groups"
    elif config.router == "weighted":
        why += "; routed by a linear router of the representatives' activations fitted to the best groups"
    else:
        why += "; routed to the group whose representative units fire most"
    return KernelPlan(ROUTED, True, gemm_why=why)


def _plan_grouped(device: torch.device, dtype: torch.dtype, config: SparsityConfig, d: int, d_out: int) -> KernelPlan:
    """Per-token chunks (1:4:M in chunks of c > 1): each chunk a grouped-GEMM "expert" over the tokens
    that kept it (kernels/ffn_grouped.py), where torch's grouped GEMM takes the shapes and the chunks
    are wide enough to pay; else the masked dense reference, and the report says why."""
    m, c, r = config.activation_pattern[2], config.chunk, config.score_units  # 1:4:M (SparsityConfig checks)
    if config.kernels == "reference" or (config.kernels == "auto" and device.type == "cpu"):
        return _reference(device.type)
    why = ""
    if config.weight_grad_pattern is not None:
        why = f"weight_grad={config.weight_grad}: the grouped kernel computes exact weight gradients"
    elif c % 8 or d % 8 or d_out % 8:
        why = f"chunks of {c}, d={d}, d_out={d_out}: grouped GEMMs need each a multiple of 8 (16-byte bf16 rows)"
    elif config.kernels == "auto" and c < GROUPED_MIN_CHUNK:
        why = (f"chunks of {c}: a chunk's grouped GEMM does about {c} FLOP per byte of its token rows, bound by "
               f"memory below {GROUPED_MIN_CHUNK} units and slower than the masked dense GEMMs")  # fmt: skip
    elif device.type == "cuda" and dtype != torch.bfloat16:
        why = f"{str(dtype).removeprefix('torch.')}: torch's grouped GEMM runs bf16"
    elif device.type == "cuda" and (cap := torch.cuda.get_device_capability(device))[0] not in GROUPED_MAJORS:
        why = (f"sm{cap[0]}{cap[1]}: torch's grouped GEMM has kernels for sm90 and sm100; elsewhere it loops over "
               "the groups and waits on the host")  # fmt: skip
    if why:
        return _reference(device.type, why)
    scored = (f"F1 on each chunk's first {r} units to choose, then on the kept chunks" if r is not None and r < c
              else "F1 dense to choose (every unit scores), then F2, B1-B4 on the kept chunks")  # fmt: skip
    return KernelPlan(GROUPED, False, gemm_why=f"each token's 4 of every {m} chunks of {c} as grouped GEMMs; {scored}")


def _hint(tokens) -> int | None:
    return tokens.node.hint if isinstance(tokens, torch.SymInt) else int(tokens)


def _f1(device: torch.device, dtype: torch.dtype, tokens, config: SparsityConfig, d: int, h: int):
    """(cuSPARSELt algorithm of F1 = [T, d] x W~^T [d, h] or None, why) for 2:4 weights on CUDA."""
    if config.weights != "2:4":
        return None, ""
    from sparse_compile.planning import f1_choice

    t = _hint(tokens)
    why = f1_choice.cslt_unsupported(device, dtype, d, h)
    why = why and f"F1 cuBLAS: {why}"
    if not why and not statically_known_true(tokens % 64 == 0):
        why = f"F1 cuBLAS: T={tokens} is not known to be a multiple of 64 (cuSPARSELt's dense operand)"
    if not why and t is None:
        why = f"F1 cuBLAS: {NO_HINT}"
    if why:
        return None, why
    choice = f1_choice.choose_f1(device.index or 0, dtype, t, d, h)
    return choice.alg, choice.why


def _plan_24(device: torch.device, dtype: torch.dtype, tokens, config: SparsityConfig, d: int, h: int) -> KernelPlan:
    """2:4 activations: the fused kernels with F2, B3 on cuSPARSELt or cuBLAS, where they apply; else the reference."""
    if device.type != "cuda":
        return _reference(device.type, "2:4 activations: cuSPARSELt needs a CUDA GPU; masked dense GEMMs")
    if not (d and h):
        return _reference(device.type, "2:4 activations: shapes unknown; masked dense GEMMs")
    from sparse_compile.planning import act24_choice, f1_choice

    why = f1_choice.cslt_unsupported(device, dtype, d, h)
    why = why and f"2:4 activations: {why}"
    if not why and not statically_known_true(tokens % 64 == 0):
        why = f"2:4 activations: T={tokens} is not known to be a multiple of 64 (cuSPARSELt's tile)"
    t = _hint(tokens)
    if not why and t is None:
        why = f"2:4 activations: {NO_HINT}"
    if why:
        return _reference(device.type, why + "; masked dense GEMMs")
    choice = act24_choice.choose_act24(device.index or 0, dtype, t, d, h)
    alg, why = (choice.alg if choice.pays else None), choice.why
    if config.kernels == "triton" and choice.alg is not None and not choice.pays:
        alg = choice.alg
        why = f"F2, B3 on cuSPARSELt alg {alg} (kernels='triton'; {choice.ratio:.2f}x cuBLAS measured at this shape)"
    f1_alg, f1_why = _f1(device, dtype, tokens, config, d, h)
    return KernelPlan(CSLT24, False, f1_alg=f1_alg, f1_why=f1_why, gemm_why=why, act24_alg=-1 if alg is None else alg)


def _plan_w24(device: torch.device, dtype: torch.dtype, tokens, config: SparsityConfig, d: int, h: int) -> KernelPlan:
    """2:4 weights alone: the two linears on cuSPARSELt or cuBLAS, each GEMM shape measured."""
    if config.weight_grad_pattern is not None:
        return _reference(device.type, "2:4 weights alone with the token-dim dW approximation: the reference op")
    if device.type != "cuda":  # kernels="triton" on CPU: the rewrite, every GEMM on F.linear (for tests)
        return KernelPlan(W24, False, f1_why="F1, B1, F2, B3 cuBLAS: cuSPARSELt needs a CUDA GPU")
    if not (d and h):
        return _reference(device.type, "2:4 weights alone: shapes unknown; masked dense GEMMs")
    f1_alg, f1_why = _f1(device, dtype, tokens, config, d, h)  # [T, d] -> [T, h]: F1, and B1 = dY W~2
    f2_alg, f2_why = _f1(device, dtype, tokens, config, h, d)  # [T, h] -> [T, d]: F2, and B3 = dZ W~1
    return KernelPlan(
        W24,
        False,
        f1_alg=f1_alg,
        f1_why=f1_why.replace("F1", "F1, B1", 1),
        gemm_why=f2_why.replace("F1", "F2, B3", 1),
        f2_alg=f2_alg,
    )
