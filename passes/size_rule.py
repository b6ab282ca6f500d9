"""Which CUDA FFN sites are too small to pay (the ``small_ffn`` option): a size rule, not a timing.

Each sparse site adds its Python, the custom op's dispatch and 12-15 kernel launches per training
step: about 1.5 ms of host time on an H100 machine (bench/RESULTS.md section 2). Below the sizes
here that cost more than the GPU time the site saves, so the step got slower than dense:
without CUDA graphs 350M (T x d x h = 16384 x 1024 x 4096 = 2**36) ran 0.94x-0.97x and 125M
(3.9e10) 0.55x, while 1.3B (2.7e11) ran 1.16x-1.27x; with CUDA graphs 350M ran 1.03x-1.06x and
125M 0.995x. The rule depends only on the shapes and the compile mode, so the same compile always
decides the same way.
"""

# torch.compile modes that run the compiled graphs as CUDA graphs (no per-kernel host work)
CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")
SMALL_FFN = 2**37  # without CUDA graphs: T x d x h below this stays dense (1.4e11)
SMALL_FFN_GRAPHS = 2**36  # with CUDA graphs (6.9e10): 350M's 2**36 runs sparse, 125M stays dense


def uses_cuda_graphs(mode: str | None, inductor: dict | None = None) -> bool:
    """Whether torch.compile's ``mode`` (or Inductor's ``triton.cudagraphs`` option) runs CUDA graphs."""
    flag = (inductor or {}).get("triton.cudagraphs")
    return bool(flag) if flag is not None else mode in CUDA_GRAPH_MODES


def small_site_reason(work: float, device: str, cuda_graphs: bool) -> str | None:
    """Why a site with T x d x h = ``work`` on ``device`` stays dense under ``small_ffn="dense"``, or None."""
    if device != "cuda":
        return None
    bound = SMALL_FFN_GRAPHS if cuda_graphs else SMALL_FFN
    if work >= bound:
        return None
    graphs = "with" if cuda_graphs else "without"
    return (
        f"small FFN: T x d x h = {work:.2g} < {bound:.2g} {graphs} CUDA graphs, where the sparse op's host work "
        f"(about 1.5 ms per step) measured more than its GPU saving (125M-350M: 0.55x-0.97x of dense); "
        f"small_ffn='sparse' runs it sparse anyway"
        + ("" if cuda_graphs else ", mode='reduce-overhead' lowers the bound to 6.9e10")
    )
