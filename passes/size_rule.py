"""Which CUDA FFN sites are too small to pay (the ``small_ffn`` option): a size rule, not a timing.

Each sparse site adds its Python, the custom op's dispatch and 12-15 kernel launches per training
step: about 1.5 ms of host time on an H100 machine (bench/RESULTS.md section 2). Below the sizes
here that cost more than the GPU time the site saves, so the step got slower than dense. Measured
end to end on an H100 (T x d x h: 125M 16384 x 768 x 3072 = 3.9e10, 350M 16384 x 1024 x 4096 =
2**36, 1.3B 2.7e11), dense torch.compile in the same run:

  plain patterns (chunk 1), causal 128:4:16 at bc520ee: without CUDA graphs 350M 0.94x-0.97x,
  125M 0.55x, 1.3B 1.16x; with CUDA graphs 350M 1.03x, 125M 0.995x.
  neuron chunks (chunk > 1), causal 128:4:16 chunk 64: without CUDA graphs 350M 0.958x (bc520ee),
  1.146x (349ef49), 0.895x and 1.074x (two processes at b6b169f): its GPU time is 0.88x of dense
  (85.6 vs 96.8 ms) but the step is host-bound by 4-28 ms, so it is not reliably faster; 125M
  0.530x, 1.3B 1.29x-1.30x; with CUDA graphs 350M 1.117x, 125M 1.049x (349ef49).

With CUDA graphs the bounds are lower. ``small_ffn="graphs"`` (the default) turns them on by
itself where they make a site pay: a site between the two bounds runs sparse, and both variants
of its graph run as CUDA graphs (Inductor's cudagraph trees, as under mode="reduce-overhead"; one
memory pool for the two phases: with the sparse variant alone under graphs, the dense phase at
350M kept 10.9 GB more reserved). Measured with the default preset against a dense
torch.compile step: 350M 1.127x-1.164x over six processes, 125M at 16 x 1024 tokens
1.051x-1.060x (H100, bench/RESULTS.md section 2).
It does not where the user turned CUDA graphs off, with permuted units (their permutation starts
as the identity and is probed on the host, which a replayed graph does not see), or in a run of
several processes (DDP and FSDP2 under CUDA graphs are not measured), or in a graph traced with
dynamic shapes (cudagraph trees record one graph per size; not measured): there the bounds without
graphs apply and the report says why. Nor where Inductor declines to run the sparse variant's
forward under CUDA graphs (mutated inputs, CPU tensors; sparse_compile/backend.py checks its
cudagraph_skips counter when it compiles): the backend then decides again without them, as it
does where the compile mode asked for the graphs (small_ffn "graphs" or "dense").

A symbolic dim counts at the size the graph is compiled for (Dynamo's hint), so a small FFN
traced with dynamic shapes is as small as a static one.

The rule depends only on the shapes, the pattern's chunking, the options, whether the run has
several processes and what Inductor makes of the graph, so the same compile always decides the
same way.
"""

# torch.compile modes that run the compiled graphs as CUDA graphs (no per-kernel host work)
CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")
# T x d x h below the bound stays dense: (without CUDA graphs, with them), by chunking
SMALL_FFN = {False: (2**37, 2**36), True: (2**37, 2**35)}
SMALL_REASON = "small FFN"  # how a site's reason starts when the rule keeps it dense


def uses_cuda_graphs(mode: str | None, inductor: dict | None = None) -> bool:
    """Whether torch.compile's ``mode`` (or Inductor's ``triton.cudagraphs`` option) runs CUDA graphs."""
    flag = (inductor or {}).get("triton.cudagraphs")
    return bool(flag) if flag is not None else mode in CUDA_GRAPH_MODES


def auto_graphs_blocker(
    mode: str | None, inductor: dict | None, permute: bool, processes: int, dynamic: bool = False
) -> str | None:
    """Why small_ffn='graphs' may not turn CUDA graphs on for a compile, or None where it may
    (``dynamic``: the graph has symbolic shapes)."""
    flag = (inductor or {}).get("triton.cudagraphs")
    if flag is not None and not flag:
        return f"the inductor option triton.cudagraphs={flag!r}"
    if mode == "max-autotune-no-cudagraphs":
        return f"mode={mode!r}"
    if permute:
        return "permute=True or routes (a replayed graph does not see the host's unit state and probes)"
    if processes > 1:
        return f"a run of {processes} processes (DDP and FSDP2 under CUDA graphs are not measured)"
    if dynamic:
        return "dynamic shapes (cudagraph trees record one graph per size; not measured)"
    return None


def bounds_with_graphs(
    config_small_ffn: str, mode: str | None, inductor: dict | None, permute: bool, processes: int, dynamic: bool = False
):
    """(whether the size rule takes its bounds with CUDA graphs, why small_ffn='graphs' may not turn
    them on or None): with them where the compile runs CUDA graphs, or small_ffn='graphs' may turn
    them on (the backend then does, for both variants, where a sparse site needs them)."""
    if uses_cuda_graphs(mode, inductor):
        return True, None
    if config_small_ffn != "graphs":
        return False, None
    blocker = auto_graphs_blocker(mode, inductor, permute, processes, dynamic)
    return blocker is None, blocker


def graphs_pay(work: float, device: str, chunked: bool) -> bool:
    """Whether a site with T x d x h = ``work`` pays only with CUDA graphs (between the two bounds)."""
    return device == "cuda" and small_ffn_bound(True, chunked) <= work < small_ffn_bound(False, chunked)


def small_ffn_bound(cuda_graphs: bool, chunked: bool) -> int:
    """T x d x h under which a CUDA site stays dense: 2**37 / 2**36 (without / with CUDA graphs) for
    plain patterns, 2**37 / 2**35 with neuron chunks (their fewer launches measured to pay at 125M
    with graphs; without graphs 350M's 2**36 measured 0.90x-1.15x of dense over four runs)."""
    return SMALL_FFN[chunked][cuda_graphs]


def small_site_reason(work: float, device: str, cuda_graphs: bool, chunked: bool = False) -> str | None:
    """Why a site with T x d x h = ``work`` on ``device`` stays dense under ``small_ffn`` "dense" or
    "graphs" (``cuda_graphs``: the graphs run, or will be made to run, as CUDA graphs), or None."""
    if device != "cuda":
        return None
    bound = small_ffn_bound(cuda_graphs, chunked)
    if work >= bound:
        return None
    graphs = "with" if cuda_graphs else "without"
    head = f"{SMALL_REASON}: T x d x h = {work:.2g} < {bound:.2g} {graphs} CUDA graphs" + (
        " (neuron chunks)" if chunked else ""
    )
    if cuda_graphs:  # no host work left; below the bound the GPU saving was not measured to pay
        paid = "125M's 3.9e10: 1.05x-1.06x" if chunked else "350M's 6.9e10: 1.045x; 125M's 3.9e10 ran 0.995x"
        why, tail = f"under the smallest size measured to pay with them ({paid} of dense)", ""
    else:
        measured = "125M-350M: 0.53x-1.15x, 350M host-bound" if chunked else "125M-350M: 0.55x-0.97x"
        why = f"where the sparse op's host work (about 1.5 ms per step) measured more than its GPU saving ({measured}"
        why += " of dense)"
        tail = f", mode='reduce-overhead' lowers the bound to {small_ffn_bound(True, chunked):.2g}"
    return f"{head}, {why}; small_ffn='sparse' runs it sparse anyway{tail}"
