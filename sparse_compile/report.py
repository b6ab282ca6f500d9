"""The report of every FFN site a compile found: what runs sparse, with which pattern and kernel, or why not."""

import dataclasses
from dataclasses import dataclass, field

from tabulate import tabulate

from sparse_compile.passes import SiteRecord
from sparse_compile.passes.legality import fitted_units
from sparse_compile.passes.size_rule import SMALL_REASON, graphs_pay, small_ffn_bound
from sparse_compile.phase import FINAL_DENSE_FRAC, WARMUP_FRAC
from sparse_compile.schema import SparsityConfig

GEMMS = ("F1", "F2", "B1", "B2", "B3", "B4")
HOST_HINT = (
    "note: {n} CUDA site(s) under the small-FFN bound (T x d x h < {bound:.2g} {graphs} CUDA graphs) run sparse "
    "because small_ffn='sparse': each adds host work per step (its Python, dispatch and launches), measured slower "
    "than dense there (bench/RESULTS.md section 2; passes/size_rule.py)"
)

AUTO_GRAPHS_NOTE = (
    "note: CUDA graphs on (small_ffn='graphs'): {n} sparse site(s) have T x d x h under {bound:.2g}, where "
    "without CUDA graphs the sparse op's host work measured more than its GPU saving. Both phases of this "
    "graph run under torch's cudagraph trees, as with mode='reduce-overhead' (one memory pool for both): a "
    "later call overwrites a compiled call's outputs, and torch raises an error where one is read after "
    "that (clone what you keep across steps). small_ffn='dense' keeps these sites dense instead"
)
# What a run gains, as far as the compile can say: the sparse sites speed up only the steps that run in
# the sparse phase, so at equal steps a run with a fraction f of them sparse, each s times as fast as a
# dense step, is 1 / (1 - f + f / s) as fast as dense (Amdahl's law over the steps).
RUN_LINE = (
    "a run: these sites run sparse while phase() is 'sparse' (every step, until a PhaseSchedule or dense_phase() "
    "says otherwise) and as plain dense graphs in the dense phase; "
    "PhaseSchedule.from_fractions(steps), the default recipe, runs {sparse:.0%} of the steps sparse (dense the "
    "first {warmup:.0%} and the last {final:.0%}), so a sparse step s times as fast as dense makes the run "
    "1 / ({dense:g} + {sparse:g} / s) as fast at equal steps; what a run gains at the dense run's loss is "
    "measured in bench/RESULTS.md section 6c; under a warm-up-stable-decay lr, PhaseSchedule.until_lr_decay "
    "(sparse until the decay) reached the dense loss sooner than this default (projected at the 1.3B config's step "
    "speedup) in short runs (1.21B over 3200 steps, 126M over 1200), not in longer ones (126M over 2400) or at "
    "353M; all from runs far shorter than a full pre-training run, and at one size a longer run needed relatively "
    "more extra steps to reach the dense loss, a mostly sparse run more so (one pair of sweeps)"
)
NO_GRAPHS_NOTE = (
    "note: this graph runs without CUDA graphs ({blocker}), so {n} CUDA site(s) that pay with them stay "
    "dense by the size rule without CUDA graphs"
)


def gemm_patterns(config: SparsityConfig, activations: bool = True) -> dict[str, str]:
    """Sparse operand(s) of each GEMM (F1 = X W1^T, F2 = H~ W2^T, B1 = dY W2, B2 = dY^T H~, B3 = dZ W1, B4 = dZ^T X);
    ``tokV:N:M`` marks the token-dim approximation of B2/B4. ``activations`` False: the site runs its
    activations dense (SiteRecord.dense_activations)."""
    w = f"W{config.weights}" if config.weights else ""
    a = f"A{config.activations}" if config.activations and activations else ""
    if a and config.chunk > 1:
        a += f"c{config.chunk}"  # in chunks of c units
    if a and config.causal:
        a += " causal"  # columns chosen from earlier tokens
    if a and config.score_rows is not None:
        a += f" s{config.score_rows}"  # ... on the last score_rows tokens of the previous block
    if a and config.token_extra:
        a += f" +{config.token_extra}/token"  # and each token's own largest units outside the block's choice
    if a and config.score_units is not None:
        a += f" u{config.score_units}"  # each chunk ranked on its first score_units units

    def both(*parts: str) -> str:
        return "+".join(p for p in parts if p) or "dense"

    t = f"tok{config.weight_grad.removeprefix('tokens:')}" if config.weight_grad_pattern else ""
    return {
        "F1": both(w),
        "F2": both(a, w),
        "B1": both(w, "kept dH" if a else ""),
        "B2": both(a, t),
        "B3": both(a, w),
        "B4": both(a, t),
    }


@dataclass
class SiteReport:
    graph: int
    record: SiteRecord
    patterns: dict[str, str]
    kernel: str


@dataclass
class Report:
    """Every FFN site and near-miss of one or more compiled graphs. ``str(report)`` is a table."""

    config: SparsityConfig
    sites: list[SiteReport] = field(default_factory=list)
    cuda_graphs: bool = False  # the graphs run as CUDA graphs (the compile mode, or auto_graphs)
    auto_graphs: int = 0  # sparse sites that small_ffn='graphs' turned CUDA graphs on for
    graphs_blocker: str | None = None  # why the graph runs without CUDA graphs the size rule would use

    @classmethod
    def from_records(
        cls,
        config: SparsityConfig,
        graph: int,
        records: list[SiteRecord],
        cuda_graphs: bool = False,
        auto_graphs: int = 0,
        graphs_blocker: str | None = None,
    ) -> "Report":
        report = cls(config, cuda_graphs=cuda_graphs, auto_graphs=auto_graphs, graphs_blocker=graphs_blocker)
        report.add(graph, records)
        return report

    def add(self, graph: int, records: list[SiteRecord]) -> None:
        for r in records:
            if r.sparse:  # a site's chunk may be a fallback smaller than the config's (passes/legality.fit_chunk)
                chunk = r.chunk or self.config.chunk
                units = fitted_units(self.config.score_units, self.config.chunk, chunk)
                site = dataclasses.replace(self.config, chunk=chunk, score_units=units)
                patterns = gemm_patterns(site, activations=not r.dense_activations)
                self.sites.append(SiteReport(graph, r, patterns, r.kernel))
            else:
                self.sites.append(SiteReport(graph, r, dict.fromkeys(GEMMS, "dense"), r.kernel))

    def extend(self, other: "Report") -> None:
        """Add another graph's sites (its CUDA-graph decision counts for the whole report)."""
        self.sites.extend(other.sites)
        self.cuda_graphs |= other.cuda_graphs
        self.auto_graphs += other.auto_graphs
        self.graphs_blocker = self.graphs_blocker or other.graphs_blocker

    @property
    def notes(self) -> list[str]:
        """Lines under the summary (passes/size_rule.py: a size rule, the same compile always says the
        same): AUTO_GRAPHS_NOTE where small_ffn='graphs' turned CUDA graphs on, NO_GRAPHS_NOTE where the
        graph runs without them (the options, or Inductor declined them) and sites that pay only with
        them stayed dense, HOST_HINT where small_ffn='sparse' runs CUDA sites
        below the size rule's bound sparse."""
        notes = []
        if self.auto_graphs:
            bound = small_ffn_bound(False, self.config.chunk > 1)
            notes.append(AUTO_GRAPHS_NOTE.format(n=self.auto_graphs, bound=bound))
        chunked = self.config.chunk > 1
        kept_dense = [  # dense by the size rule, and sparse with the CUDA graphs the blocker ruled out
            s
            for s in self.dense_sites
            if s.record.reason.startswith(SMALL_REASON) and graphs_pay(s.record.work, s.record.device, chunked)
        ]
        if self.graphs_blocker and kept_dense:
            notes.append(NO_GRAPHS_NOTE.format(n=len(kept_dense), blocker=self.graphs_blocker))
        graphs = self.cuda_graphs
        bound = small_ffn_bound(graphs, self.config.chunk > 1)
        small = [s for s in self.sparse_sites if s.record.device == "cuda" and s.record.work < bound]
        if small:
            notes.append(HOST_HINT.format(n=len(small), bound=bound, graphs="with" if graphs else "without"))
        return notes

    @property
    def warnings(self) -> list[str]:
        """The notes that change how the compiled model behaves for its caller (the backend logs them
        as warnings): AUTO_GRAPHS_NOTE, where small_ffn='graphs' turned CUDA graphs on."""
        return [n for n in self.notes if n.startswith(AUTO_GRAPHS_NOTE.split("{")[0])]

    @property
    def site_warnings(self) -> list[str]:
        """One line per reason that found FFNs run dense, or run sparse with dense activations, where
        the options did not ask for it (SiteRecord.warn: not min_hidden, not the small-FFN size rule,
        whose sites only the report names), naming the sites (module at source): the backend logs each
        as a warning, once per compile."""
        by_reason: dict[tuple[str, str], list[str]] = {}
        for s in self.sites:
            r = s.record
            what = "run dense" if r.warn else "run sparse with dense activations" if r.dense_activations else ""
            if what:
                by_reason.setdefault((what, r.dense_activations or r.reason), []).append(f"{r.module} at {r.source}")
        lines = []
        for (what, reason), names in by_reason.items():
            if len(names) == 1:
                lines.append(f"the FFN {names[0]} {what.replace('run ', 'runs ', 1)}: {reason}")
            else:
                lines.append(f"{len(names)} FFNs ({', '.join(names)}) {what}: {reason}")
        return lines

    @property
    def sparse_sites(self) -> list[SiteReport]:
        return [s for s in self.sites if s.record.sparse]

    @property
    def dense_sites(self) -> list[SiteReport]:
        return [s for s in self.sites if not s.record.sparse]

    def __len__(self) -> int:
        return len(self.sites)

    def table(self) -> str:
        headers = ["graph", "module", "source", "input", "hidden", "dtype", "status", *GEMMS, "kernel", "note"]
        rows = [
            [
                s.graph,
                s.record.module,
                s.record.source,
                s.record.input_shape,
                s.record.hidden,
                s.record.dtype,
                "sparse" if s.record.sparse else "dense",
                *(s.patterns[g] for g in GEMMS),
                s.kernel,
                s.record.reason,
            ]
            for s in self.sites
        ]
        return tabulate(rows, headers=headers, tablefmt="simple")

    def __str__(self) -> str:
        c = self.config
        head = (
            f"sparse_compile report: {len(self.sparse_sites)} sparse FFN site(s), {len(self.dense_sites)} dense "
            f"(config: weights={c.weights}, activations={c.activations}"
            + (f", chunk={c.chunk}" if c.chunk > 1 else "")
            + (", causal" if c.causal else "")
            + (f", score_rows={c.score_rows}" if c.score_rows is not None else "")
            + (", permute" if c.permute else "")
            + (f", token_extra={c.token_extra}" if c.token_extra else "")
            + (f", score_units={c.score_units}" if c.score_units is not None else "")
            + (f", mass_loss={c.mass_loss:g}" if c.mass_loss else "")
            + (f" on {c.mass_loss_rows} rows" if c.mass_loss_rows != "all" else "")
            + (f", routes={c.routes}, router={c.router}" if c.routes is not None else "")
            + (f", weight_copies={c.weight_copies}" if c.weight_copies != "keep" else "")
            + f", weight_grad={c.weight_grad}, kernels={c.kernels})"
        )
        head = "\n".join([head, *self.notes, *([run_line()] if self.sparse_sites else [])])
        return head if not self.sites else f"{head}\n{self.table()}"


def run_line(warmup: float = WARMUP_FRAC, final_dense: float = FINAL_DENSE_FRAC) -> str:
    """RUN_LINE for a schedule dense the first ``warmup`` and last ``final_dense`` fractions of the steps."""
    if not (0.0 <= warmup <= 1.0 and 0.0 <= final_dense <= 1.0 and warmup + final_dense <= 1.0):
        raise ValueError(
            f"run_line: warmup={warmup!r}, final_dense={final_dense!r}: expected fractions in [0, 1] summing to <= 1"
        )
    sparse = round(1.0 - warmup - final_dense, 6)
    return RUN_LINE.format(sparse=sparse, warmup=warmup, final=final_dense, dense=round(1.0 - sparse, 6))
