"""Where the 2:4-activation FFN's time goes: torch.profiler over 5 forward + backward steps of the op's
functions (kernels/ffn_act24.py, F2/B3 on the measured cuSPARSELt algorithm) and of the dense FFN
(F.linear, relu^2, autograd) at (T, d, h) = (16384, 4096, 16384), bf16; CUDA time per kernel per step,
and wall time per step."""

import time

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from sparse_compile.act24_choice import choose_act24
from sparse_compile.kernels.ffn_act24 import sqrelu_ffn_backward_24, sqrelu_ffn_forward_24

t, d, h = 16384, 4096, 16384
dt = torch.bfloat16
x = torch.randn(t, d, device="cuda", dtype=dt)
w1 = (torch.randn(h, d, device="cuda") * d**-0.5).to(dt)
w2 = (torch.randn(d, h, device="cuda") * h**-0.5).to(dt)
b1 = torch.zeros(h, device="cuda", dtype=dt)
b2 = torch.zeros(d, device="cuda", dtype=dt)
dy = torch.randn(t, d, device="cuda", dtype=dt)
choice = choose_act24(0, dt, t, d, h)
print("choice:", choice.alg, f"{choice.ratio:.2f}x", flush=True)


def sparse_step():
    y, r_buf = sqrelu_ffn_forward_24(x, w1, b1, w2, b2, choice.alg)
    sqrelu_ffn_backward_24(dy, x, w1, w2, r_buf, choice.alg)


xs, w1s, w2s = (a.clone().requires_grad_() for a in (x, w1, w2))
dense_ffn = torch.compile(lambda x, w1, w2: F.linear(torch.relu(F.linear(x, w1, b1)) ** 2, w2, b2))


def dense_step():
    dense_ffn(xs, w1s, w2s).backward(dy)


for name, step in (("sparse act24", sparse_step), ("dense compiled", dense_step)):
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(5):
        step()
    torch.cuda.synchronize()
    print(f"{name}: {(time.perf_counter() - t0) / 5 * 1e3:.3f} ms per step (wall)", flush=True)
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        for _ in range(5):
            step()
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=18, max_name_column_width=60), flush=True)
