"""GPU time of a training step, grouped by what it does, from a torch.profiler chrome trace.

Each GPU kernel is attributed to the CPU ops that launched it (the ops on the launching thread
whose time span holds the kernel's launch call, matched by the trace's correlation id), and
falls into one group:
  attention        flash/fmha/attention kernels, or launched under scaled_dot_product_attention
  optimizer        launched under Optimizer.step or clip_grad_norm_, or an Adam/foreach kernel
  FFN GEMMs        cuBLAS/cuSPARSELt GEMMs of an FFN (launched under a sparse_compile:: op, or an
                   aten mm whose operand shapes include the hidden size h), and the Triton
                   GEMMs (_gather_k_kernel, _gather_n_kernel, _chunk_wgrad_kernel)
  other GEMMs      every other cuBLAS GEMM (attention projections, the LM head)
  sparse kernels   the sparse path's own non-GEMM kernels (selection, scatter, masks, compressors,
                   transposes): any other kernel launched under a sparse_compile:: op
  other            the rest (Inductor's fused elementwise and norm kernels, the loss, copies)

collective_kernels() and split_collectives() split the collectives' kernel time of several ranks'
traces into transfer and wait. Every rank issues the same collectives in the same order, so the k-th
NCCL kernel of a name is one collective on every rank. It starts on each rank when that rank
reaches it and ends on all of them together, once the last rank has arrived and the bytes have
moved: on the last rank to arrive it takes the transfer alone. So per collective, transfer = the
shortest of its kernels over the ranks, and a rank's wait = its own kernel time less that.

host() reads the CPU side of the same trace: kernel launches per step, those made inside a
sparse_compile:: op, and the host time per step spent inside sparse_compile:: ops (the union of
their spans per thread). host_calls() splits that time by what spends it: the self time (own span
minus its children's) of every CPU-side event, per name, inside sparse_compile:: ops or elsewhere;
a sparse_compile:: op's own self time is the Python around its aten ops and launches. With the
profiler on, host times run longer than without it.
"""

import json
import re
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

GROUPS = ("FFN GEMMs", "other GEMMs", "sparse kernels", "attention", "optimizer", "collectives", "other")
_GEMM = re.compile(r"gemm|xmma|nvjet|cutlass|cublas|cusparselt|_mm_|matmul", re.IGNORECASE)
_GATHER_GEMM = re.compile(r"_gather_[kn]_kernel|_chunk_wgrad_kernel")
_ATTENTION = re.compile(r"flash|fmha|attention|sdpa", re.IGNORECASE)
_OPTIMIZER_KERNEL = re.compile(r"adam|multi_tensor", re.IGNORECASE)
_OPTIMIZER_OP = re.compile(r"Optimizer\.step|clip_grad|_foreach_")
_LAUNCH = re.compile(r"LaunchKernel")
_CPU_SIDE = ("cpu_op", "user_annotation", "python_function", "cuda_runtime", "cuda_driver")


def _events(trace: dict | str | Path) -> list[dict]:
    if not isinstance(trace, dict):
        trace = json.loads(Path(trace).read_text())
    return [e for e in trace["traceEvents"] if e.get("ph") == "X"]


def _dims(args: dict) -> list[int]:
    """Every size in a cpu_op's 'Input Dims' (record_shapes=True), flattened."""
    out: list[int] = []

    def walk(x) -> None:
        if isinstance(x, list):
            for y in x:
                walk(y)
        elif isinstance(x, int):
            out.append(x)

    walk(args.get("Input Dims", []))
    return out


def _launch_stacks(events: list[dict]) -> dict[int, list[dict]]:
    """correlation id -> the cpu_ops enclosing that launch call, outermost first (one sweep per thread)."""
    by_tid: dict[object, list[tuple[float, int, float, dict]]] = defaultdict(list)
    for e in events:
        if e.get("ph") != "X":
            continue
        if e.get("cat") in ("cpu_op", "user_annotation", "python_function"):
            by_tid[e.get("tid")].append((e["ts"], 0, -e.get("dur", 0), e))
        elif e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {}):
            by_tid[e.get("tid")].append((e["ts"], 1, 0, e))
    stacks: dict[int, list[dict]] = {}
    for items in by_tid.values():
        items.sort(key=lambda r: r[:3])
        open_ops: list[dict] = []
        for ts, is_launch, _, e in items:
            while open_ops and open_ops[-1]["ts"] + open_ops[-1].get("dur", 0) < ts:
                open_ops.pop()
            if is_launch:
                stacks[e["args"]["correlation"]] = list(open_ops)
            else:
                open_ops.append(e)
    return stacks


def classify(name: str, stack: Iterable[dict], hidden: int) -> str:
    """The group of a kernel called ``name`` launched under ``stack`` (cpu_op events, outermost first)."""
    stack = list(stack)
    names = [e.get("name", "") for e in stack]
    if name.startswith("nccl"):  # DDP's all-reduces, FSDP2's all-gathers and reduce-scatters: transfer and wait
        return "collectives"
    if _ATTENTION.search(name) or any("scaled_dot_product" in n for n in names):
        return "attention"
    if _OPTIMIZER_KERNEL.search(name) or any(_OPTIMIZER_OP.search(n) for n in names):
        return "optimizer"
    in_op = any(n.startswith("sparse_compile::") for n in names)
    if _GATHER_GEMM.search(name):
        return "FFN GEMMs"
    if _GEMM.search(name) and not name.startswith("triton"):
        innermost = next((e for e in reversed(stack) if e.get("name", "").startswith("aten::")), None)
        ffn = in_op or (innermost is not None and hidden in _dims(innermost.get("args", {})))
        return "FFN GEMMs" if ffn else "other GEMMs"
    return "sparse kernels" if in_op else "other"


def breakdown(
    trace: dict | str | Path, hidden: int, steps: int
) -> tuple[dict[str, float], list[tuple[str, str, float]]]:
    """(ms per step of each group in GROUPS, [(group, kernel, ms per step)] heaviest first) from a
    chrome trace (a path or the loaded JSON) of ``steps`` training steps of a model with FFN hidden size ``hidden``."""
    events = _events(trace)
    stacks = _launch_stacks(events)
    groups = dict.fromkeys(GROUPS, 0.0)
    kernels: dict[tuple[str, str], float] = defaultdict(float)
    for e in events:
        if e.get("cat") != "kernel":
            continue
        name = e.get("name", "")
        group = classify(name, stacks.get(e.get("args", {}).get("correlation"), []), hidden)
        ms = e.get("dur", 0) / 1e3 / steps
        groups[group] += ms
        kernels[(group, name)] += ms
    top = sorted(((g, k, ms) for (g, k), ms in kernels.items()), key=lambda r: -r[2])
    return groups, top


def collective_kernels(trace: dict | str | Path) -> dict[str, float]:
    """The NCCL kernels of a trace, each keyed by its name and its rank among the kernels of that name
    in start order ('ncclDevKernel_AllGather...#3'): microseconds each."""
    seen: dict[str, int] = defaultdict(int)
    out: dict[str, float] = {}
    nccl = [e for e in _events(trace) if e.get("cat") == "kernel" and e.get("name", "").startswith("nccl")]
    for e in sorted(nccl, key=lambda e: e["ts"]):
        out[f"{e['name']}#{seen[e['name']]}"] = e.get("dur", 0)
        seen[e["name"]] += 1
    return out


def split_collectives(per_rank: list[dict[str, float]], steps: int, rank: int = 0) -> dict[str, float]:
    """ms per step of ``rank``'s collectives: 'collectives transfer ms' (per collective, the shortest
    of its kernels over the ranks: the last rank to arrive waits for no one) and 'collectives wait
    ms' (``rank``'s kernel time less that); ``per_rank`` is collective_kernels() of every rank's
    trace of the same ``steps`` steps. A ValueError if the ranks' collectives differ."""
    keys = set(per_rank[rank])
    for i, r in enumerate(per_rank):
        if set(r) != keys:
            odd = sorted(set(r) ^ keys)
            raise ValueError(f"split_collectives: the ranks' traces hold different collectives: rank {i} "
                             f"against rank {rank} differ in {len(odd)}, e.g. {odd[:3]}")  # fmt: skip
    transfer = sum(min(r[k] for r in per_rank) for k in keys)
    mine = sum(per_rank[rank].values())
    return {
        "collectives transfer ms": transfer / 1e3 / steps,
        "collectives wait ms": (mine - transfer) / 1e3 / steps,
    }


def _self_times(items: list[dict], totals: dict[tuple[str, str], list[float]]) -> None:
    """Add each event's (count, self us) to totals[(where, name)]: one thread's events, nested by span."""
    open_ops: list[list] = []  # [event, us of its direct children, inside a sparse op]
    for e in [*sorted(items, key=lambda e: (e["ts"], -e.get("dur", 0))), None]:
        ts = float("inf") if e is None else e["ts"]
        while open_ops and open_ops[-1][0]["ts"] + open_ops[-1][0].get("dur", 0) <= ts:
            done, children, inside = open_ops.pop()
            t = totals[("sparse op" if inside else "elsewhere", done["name"])]
            t[0] += 1
            t[1] += max(0.0, done.get("dur", 0) - children)
            if open_ops:
                open_ops[-1][1] += done.get("dur", 0)
        if e is not None:
            inside = e["name"].startswith("sparse_compile::") or bool(open_ops and open_ops[-1][2])
            open_ops.append([e, 0.0, inside])


def host_calls(trace: dict | str | Path, steps: int, top: int = 10) -> list[dict]:
    """The ``top`` CPU-side event names by self time per step, inside sparse_compile:: ops and
    elsewhere: [{"where": "sparse op" | "elsewhere", "name", "calls per step", "self ms per step"}]."""
    by_tid: dict[object, list[dict]] = defaultdict(list)
    for e in _events(trace):
        if e.get("cat") in _CPU_SIDE:
            by_tid[e.get("tid")].append(e)
    totals: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0, 0.0])
    for items in by_tid.values():
        _self_times(items, totals)
    rows = []
    for where in ("sparse op", "elsewhere"):
        mine = sorted(((n, c, us) for (w, n), (c, us) in totals.items() if w == where), key=lambda r: -r[2])
        rows += [
            {
                "where": where,
                "name": n,
                "calls per step": round(c / steps, 2),
                "self ms per step": round(us / 1e3 / steps, 4),
            }
            for n, c, us in mine[:top]
        ]
    return rows


def host(trace: dict | str | Path, steps: int) -> dict[str, float]:
    """Per step: 'launches' (kernel launch calls), 'sparse launches' (of those, inside a
    sparse_compile:: op) and 'sparse op host ms' (CPU time inside sparse_compile:: ops, nested and
    overlapping calls counted once per thread)."""
    events = _events(trace)
    stacks = _launch_stacks(events)
    launches = [e for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver") and _LAUNCH.search(e["name"])]
    in_op = sum(
        any(o.get("name", "").startswith("sparse_compile::") for o in stacks.get(e["args"].get("correlation"), []))
        for e in launches
    )
    spans: dict[object, list[tuple[float, float]]] = defaultdict(list)
    for e in events:
        if e.get("cat") == "cpu_op" and e.get("name", "").startswith("sparse_compile::"):
            spans[e.get("tid")].append((e["ts"], e["ts"] + e.get("dur", 0)))
    busy = 0.0
    for items in spans.values():
        end = float("-inf")
        for a, b in sorted(items):
            busy += max(0.0, b - max(a, end))
            end = max(end, b)
    return {
        "launches": len(launches) / steps,
        "sparse launches": in_op / steps,
        "sparse op host ms": busy / 1e3 / steps,
    }
