"""What the passes, the planner and the ops agree on, in one low module that imports nothing of the package.

The passes check a site against these (passes/legality.py), the planner picks kernels inside them
(sparse_compile/planning/), and the ops check their inputs and parse their spec against them
(sparse_compile/ops/spec.py): so ops and passes never import the planner. op_spec writes the spec
string every FFN op receives, in this one place; ops/spec.parse_spec reads it back.
"""

import torch

DEVICES = ("cpu", "cuda")  # device types with kernels
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)  # dtypes of x, the weights and biases
GATHER_GEMMS = ("F2", "B1", "B3")  # gather-path GEMMs that may run on cuBLAS instead (the spec's dense_gemms)
ROUTERS = ("representatives", "weighted", "linear", "oracle")  # SparsityConfig.router: how a token picks its group
DEFAULT_ROUTER = "weighted"  # kept more and trained closer to dense than "representatives" (bench/RESULTS.md, 6b)


def op_spec(config, plan=None, units: str | None = None) -> str:
    """The spec string of an FFN op, from a SparsityConfig (the pattern), a planning.plan.KernelPlan
    (the site's kernel choices; None: none) and ``units``, the module path of the site whose state
    (permutation, routes) the op keeps: 'weights=2:4;activations=64:2:8;kernels=auto;...'."""
    spec = (
        f"weights={config.weights or 'none'};activations={config.activations or 'none'};kernels={config.kernels};"
        f"weight_grad={config.weight_grad};dense_frac={float(config.weight_grad_dense_frac)!r}"
        + (f";chunk={config.chunk}" if config.chunk > 1 else "")
        + (";causal=1" if config.causal else "")
        + (f";score_rows={config.score_rows}" if config.score_rows is not None else "")
        + (f";routes={config.routes}" if config.routes is not None else "")
        + (f";router={config.router}" if config.router != DEFAULT_ROUTER else "")
        + (f";token_extra={config.token_extra}" if config.token_extra else "")
        + (f";score_units={config.score_units}" if config.score_units is not None else "")
        + (f";mass_loss={float(config.mass_loss)!r}" if config.mass_loss else "")
        + (f";mass_loss_rows={config.mass_loss_rows}" if config.mass_loss_rows != "all" else "")
    )
    if plan is not None:
        spec += "" if plan.f1_alg is None else f";f1_alg={plan.f1_alg}"
        spec += "" if plan.act24_alg is None else f";act24_alg={plan.act24_alg}"
        spec += f";dense_gemms={'+'.join(sorted(plan.dense_gemms))}" if plan.dense_gemms else ""
        spec += ";gather=1" if plan.op == "sqrelu_ffn_routed" and plan.gather else ""  # routed, on the gather kernels
    return spec + ("" if units is None else f";units={units}")
