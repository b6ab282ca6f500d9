"""Which CUDA FFN sites are too small to pay (the ``small_ffn`` option): a size rule, not a timing.

Each sparse site adds its Python, the custom op's dispatch and 12-15 kernel launches per training
step. Below a size that host work costs more than the GPU time the site saves, and the step gets
slower than dense. The rule compares T x d x h (tokens per call x model dim x hidden; 125M's
16384 x 768 x 3072 = 3.9e10, 350M's 16384 x 1024 x 4096 = 2**36) with a bound that depends on
whether the graph runs as CUDA graphs, which remove the per-launch host work, and on whether the
pattern has neuron chunks, which launch fewer kernels. Whether the graph runs as CUDA graphs is
decided in sparse_compile/cuda_graphs.py (small_ffn="graphs" turns them on where a site pays only
with them: ``graphs_pay``); the bounds come from the step times of bench/RESULTS.md, section 2.

A symbolic dim counts at the size the graph is compiled for (Dynamo's hint), so a small FFN
traced with dynamic shapes is as small as a static one.
"""

# T x d x h below the bound stays dense: (without CUDA graphs, with them), by chunking
SMALL_FFN = {False: (2**37, 2**36), True: (2**37, 2**35)}
SMALL_REASON = "small FFN"  # how a site's reason starts when the rule keeps it dense


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
        why, tail = "under the smallest size measured to pay with them (bench/RESULTS.md, section 2)", ""
    else:
        why = "where the sparse op's host work measured more than its GPU saving (bench/RESULTS.md, section 2)"
        tail = f", mode='reduce-overhead' lowers the bound to {small_ffn_bound(True, chunked):.2g}"
    return f"{head}, {why}; small_ffn='sparse' runs it sparse anyway{tail}"
