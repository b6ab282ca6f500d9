"""Which CUDA FFN sites are too small to pay (the ``small_ffn`` option): a size rule, not a timing.

Each sparse site adds its Python, the custom op's dispatch and 12-15 kernel launches per training
step. Below a size that host work costs more than the GPU time the site saves, and the step gets
slower than dense. The rule compares T x d x h (tokens per call x model dim x hidden; 125M's
16384 x 768 x 3072 = 3.9e10, 350M's 16384 x 1024 x 4096 = 2**36) with a bound that depends on
whether the graph runs as CUDA graphs, which remove the per-launch host work, and on whether the
pattern has neuron chunks, which launch fewer kernels.

``small_ffn="graphs"`` (the default) turns CUDA graphs on by itself where they make a site pay: a
site between the two bounds runs sparse, and both variants of its graph run as CUDA graphs
(Inductor's cudagraph trees, as under mode="reduce-overhead"; both variants, so that the two
phases share one memory pool). It does not where the user turned CUDA graphs off, with permuted
units or routes (their state lives on the host, which a replayed graph does not see), in a run of
several processes, or in a graph traced with dynamic shapes (cudagraph trees record one graph per
size): there the bounds without graphs apply and the report says why. Nor where Inductor declines
to run the sparse variant's forward under CUDA graphs (mutated inputs, CPU tensors;
sparse_compile/backend.py checks its cudagraph_skips counter when it compiles): the backend then
decides again without them, as it does where the compile mode asked for the graphs.

A symbolic dim counts at the size the graph is compiled for (Dynamo's hint), so a small FFN
traced with dynamic shapes is as small as a static one. The rule depends only on the shapes, the
pattern's chunking, the options, whether the run has several processes and what Inductor makes of
the graph, so the same compile always decides the same way.
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
    plain patterns, 2**37 / 2**35 with neuron chunks (fewer launches per site)."""
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
