"""What the passes, the planner and the ops agree on, in one low module that imports nothing of the package.

The passes check a site against these (passes/legality.py), the planner picks kernels inside them
(sparse_compile/planning/), and the ops check their inputs and parse their spec against them
(sparse_compile/ops/spec.py): so ops and passes never import the planner.
"""

import torch

DEVICES = ("cpu", "cuda")  # device types with kernels
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)  # dtypes of x, the weights and biases
GATHER_GEMMS = ("F2", "B1", "B3")  # gather-path GEMMs that may run on cuBLAS instead (the spec's dense_gemms)
