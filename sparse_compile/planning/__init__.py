"""Compile-time kernel choices: per FFN site, once, which op and kernels compute it.

| module           | decides                                                                      |
|------------------|------------------------------------------------------------------------------|
| plan.py          | the site's KernelPlan: op, kernels, and why not the fast path (plan_kernels)  |
| f1_choice.py     | F1 (and the 2:4-weight linears) on cuSPARSELt or cuBLAS, measured             |
| gather_choice.py | F2, B1, B3 of the gather path on the gather kernels or cuBLAS, measured       |
| act24_choice.py  | F2, B3 of 2:4 activations on cuSPARSELt or cuBLAS, measured                   |
| measure.py       | the timing, error and cuSPARSELt algorithm sweep the choices share            |

Nothing here runs at training time: ops and passes read the plan's result (KernelPlan.op, and its
kernel choices in the op's spec, contract.op_spec), and what they share with it is in
sparse_compile/contract.py.
"""
