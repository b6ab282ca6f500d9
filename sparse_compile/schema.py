"""SparsityConfig: what the sparse phase computes (the schema and its validation).

Its presets are in presets.py, the parsing of ``torch.compile(options=...)`` into it in options.py;
sparse_compile.config re-exports the public names of all three.
"""

from dataclasses import dataclass

from sparse_compile.contract import DEFAULT_ROUTER, ROUTERS, op_spec

WEIGHT_PATTERNS = ("2:4",)
WEIGHT_GRAD_RULE = "'dense' or 'tokens:V:N:M' (V:N:M along tokens, e.g. 'tokens:64:2:8')"
KERNEL_CHOICES = ("auto", "reference", "triton")
SMALL_FFN_CHOICES = ("graphs", "dense", "sparse")
_VNM_RULE = "'2:4' or 'V:N:M' (e.g. '64:2:8') with V >= 1, N in {1, 2, 4} and M a multiple of 4 larger than N"


def parse_weight_grad(value: str) -> tuple[int, int, int] | None:
    """'dense' -> None; 'tokens:V:N:M' -> (V, N, M). Raises ValueError naming the value, the part that
    is wrong and the rule."""
    if value == "dense":
        return None
    if not isinstance(value, str) or not value.startswith("tokens:"):
        what = f"not a string ({type(value).__name__})" if not isinstance(value, str) else "not 'dense' or 'tokens:...'"
        raise ValueError(f"SparsityConfig.weight_grad={value!r}: {what}; expected {WEIGHT_GRAD_RULE}")
    try:
        return _vnm(value.removeprefix("tokens:"), forms=(3,))
    except ValueError as e:
        raise ValueError(f"SparsityConfig.weight_grad={value!r}: {e}; expected {WEIGHT_GRAD_RULE}") from None


def parse_activation_pattern(value: str) -> tuple[int, int, int]:
    """'2:4' -> (1, 2, 4); 'V:N:M' -> (V, N, M). Raises ValueError naming the value, the part that is
    wrong and the rule."""
    try:
        return _vnm(value, forms=(2, 3))
    except ValueError as e:
        raise ValueError(f"SparsityConfig.activations={value!r}: {e}; expected None, {_VNM_RULE}") from None


def _vnm(value: object, forms: tuple[int, ...]) -> tuple[int, int, int]:
    """(V, N, M) of 'V:N:M' (or of 'N:M', V = 1, where ``forms`` has 2). Raises ValueError saying which
    part is wrong and what it may be, without the value (the callers name it)."""
    if not isinstance(value, str):
        raise ValueError(f"not a string ({type(value).__name__})")
    parts = value.strip().split(":")
    if len(parts) not in forms:
        shapes = " or ".join({2: "2 (N:M, e.g. '2:4')", 3: "3 (V:N:M, e.g. '64:2:8')"}[f] for f in forms)
        raise ValueError(f"{len(parts)} part(s) separated by ':', not {shapes}")
    names = ("V", "N", "M")[3 - len(parts) :]
    nums = []
    for name, part in zip(names, parts, strict=True):
        try:
            nums.append(int(part))
        except ValueError:
            raise ValueError(f"{name}={part.strip()!r} is not an integer") from None
    v, n, m = [1, *nums] if len(nums) == 2 else nums
    if v < 1:
        raise ValueError(f"V={v} must be >= 1")
    if n not in (1, 2, 4):
        raise ValueError(f"N={n} must be 1, 2 or 4")
    if m % 4 or m <= n:
        raise ValueError(f"M={m} must be a multiple of 4 larger than N={n}")
    return v, n, m


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def score_rows_apply(score_rows: object, v: int | None, causal: object, chunk: object) -> bool:
    """Whether ``score_rows`` can choose a block's chunks: an int in [1, V] for causal blocks (V > 1,
    ``v``; None without blocks) in chunks (chunk > 1). SparsityConfig raises where it cannot; the
    options drop a preset's where the user's fields leave it nothing to apply to."""
    return _is_int(score_rows) and 1 <= score_rows <= (v or 0) and causal is True and _is_int(chunk) and chunk >= 2


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


# SparsityConfig's checks of one field alone: field -> (whether a value is valid, what is expected).
# activations and weight_grad are parsed, with their parser's error; the checks that combine fields follow.
FIELD_CHECKS = {
    "weights": (lambda v: v is None or v in WEIGHT_PATTERNS, "None or '2:4'"),
    "activations": (lambda v: v is None or parse_activation_pattern(v), _VNM_RULE),  # raises its own error
    "weight_grad": (lambda v: parse_weight_grad(v) or True, WEIGHT_GRAD_RULE),  # raises its own error
    "weight_grad_dense_frac": (lambda v: _is_number(v) and 0.0 <= v <= 1.0, "a float in [0, 1]"),
    "kernels": (lambda v: v in KERNEL_CHOICES, f"one of {KERNEL_CHOICES}"),
    "chunk": (lambda v: _is_int(v) and v >= 1, "an int >= 1 (units per kept column)"),
    "causal": (lambda v: isinstance(v, bool), "True or False"),
    "permute": (lambda v: isinstance(v, bool), "True or False"),
    "min_hidden": (lambda v: _is_int(v) and v >= 0, "an int >= 0"),
    "small_ffn": (lambda v: v in SMALL_FFN_CHOICES, f"one of {SMALL_FFN_CHOICES}"),
    "masked_decay": (lambda v: _is_number(v) and v >= 0.0, "a float >= 0"),
    "weight_copies": (lambda v: v in ("keep", "recompute"), "'keep' or 'recompute'"),
    "token_extra": (lambda v: _is_int(v) and v >= 0, "an int >= 0 (units per token)"),
    "score_units": (lambda v: v is None or (_is_int(v) and v >= 1), "None or an int >= 1 (units per chunk)"),
    "router": (lambda v: v in ROUTERS, " or ".join(map(repr, ROUTERS))),
    "mass_loss": (lambda v: _is_number(v) and 0.0 <= v < float("inf"), "a finite float >= 0"),
    "mass_loss_rows": (lambda v: v in ("all", "scoring"), "'all' or 'scoring'"),
}


@dataclass(frozen=True)
class SparsityConfig:
    """What is sparse in the sparse phase (docs/design.md, "Semantics").

    weights: None or "2:4" (transposable 2:4 magnitude mask of W1 and W2, straight-through grads).
    activations: None, "2:4" (along the hidden dim) or "V:N:M" (e.g. "64:2:8").
    weight_grad: "dense": B2 = dY^T H~ and B4 = dZ^T X exact; or "tokens:V:N:M": their operand (H~, dZ)
        made V:N:M-sparse along tokens (kernels/weight_grad_approx.py), an approximation; on the
        gather kernels when V % 16 == 0. It is slower than the exact product and its gradients
        deviate from the exact ones: for experiments, not for speed.
    weight_grad_dense_frac: with "tokens:...", the fraction of hidden units (the densest) kept exact.
    chunk: hidden units per kept column of a V:N:M pattern ("neuron chunks", kernels/activation_mask.py):
        each block of V tokens keeps 4 of every M chunks of ``chunk`` adjacent units. 1 (default) is
        the plain pattern; > 1 makes the weight gradients block-sparse along tokens. Needs V:N:M
        activations with V > 1, and hidden % (M * chunk) == 0 at a site; where it is not, a site takes
        the largest chunk / 2**k >= 16 that divides (the report names it), else stays dense.
        Per token, "1:4:M" with chunk > 1: each token keeps the 4 of every M chunks with most of its
        own mass (causal by construction); chunks of 256 units and more (bf16, sm90 / sm100) run on grouped
        GEMMs (kernels/ffn_grouped.py), narrower ones on the reference (planning/plan.py says why).
    causal: a V:N:M block (V > 1) chooses its kept columns from the tokens before it (the previous
        block of its sequence; a sequence's first block from its first token), so no token's output
        depends on a later token (kernels/activation_mask.py). The sequence is x's second-to-last
        dim (a 2-D x is one sequence); its length must be a multiple of V at the site. False
        (default): a block's columns come from all of its V tokens, later ones included.
    score_rows: with ``causal`` and ``chunk`` > 1, the rows of the previous block whose norms choose
        a block's chunks: its last ``score_rows`` tokens (1 <= score_rows <= V). None: all V (the
        field's default; the "chunked" preset, backend="sparse"'s default, has 16). Under V (and
        N = 4), the forward computes Z = X W1^T + b1 in full only on those rows (and each
        sequence's first token) and on the kept chunks of every row (the gather GEMM;
        kernels/chunk_score_triton.py): score_rows/V + 4/M of F1's work instead of all of it (0.375 at 16
        of 128, keep 1/4); the choice sees fewer tokens.
    permute: each site's V:N:M op (V > 1, or per-token chunks) runs on a permutation of its hidden units, kept by the
        backend per site (identity at first; sparse_compile.recluster() refits it from the
        activations recorded under sparse_compile.probe_units(); sparse_compile/ops/unit_perms.py), so that
        a block's kept groups and chunks cover more of H. The dense function, the parameters and
        the state dict are unchanged.
    routes: None, or G >= 2 groups of routed tokens (kernels/routing.py): each token keeps the units of
        one of G fixed sets of chunks (4 of every M chunks), chosen by a router from its own input,
        instead of sharing a block's choice; causal by construction. Needs V:4:M activations with
        V > 1 in chunks (chunk > 1), causal=False, score_rows None and permute False (a routed site
        keeps its own permutation). The groups and the router are fitted from the samples recorded
        under sparse_compile.probe_units() by sparse_compile.recluster() (ops/routes.py).
    router: with ``routes``, how a token's group is chosen (each from the token alone, so causal by
        construction). "weighted" (default): every group scored from the token's activations on all
        groups' representative units (F1 on G r units, r = 16) by a linear classifier fitted at each
        refit to the sample's best group of every token (route_fit.fit_linear_router); before its first
        fit it sums each group's own, as "representatives" does. "representatives": the group whose
        representative units the token's own H is largest on (kernels/routing.route_tokens).
        "linear": argmax_g x L_g + l_g, a linear router of the token's input (kernels/routing.route_linear;
        a [T, d] x [d, G] GEMM), fitted the same way; before its first fit every token takes group 0.
        "oracle": the group that keeps the most of the token's own H, which F1 computes in full every
        call (ops/routes.route_by_mass): a measure of what a better router would buy with the same
        groups, not a speed option.
    token_extra: r >= 0. With V:N:M blocks (V > 1), each token also keeps its own r largest units of H
        outside its block's choice (where > 0): per token, so causal as the block's choice is. No fast
        kernel takes it (the reference runs it): a measure of what a token's own top units are worth
        on top of a shared choice, not a speed option; the size rule (small_ffn) treats its sites as
        the pattern's fast path. Ties go to the lower unit index. 0 (default): none.
    score_units: None, or r in [1, chunk) with per-token chunks (1:4:M, chunk > 1): each token ranks its
        chunks by its H on each chunk's first r units (in the op's unit order: with ``permute``, the r
        heaviest units of each co-firing chunk in the last refit's sample), not on all of them: a
        router from the token's own input that needs Z on h r / chunk columns before the kept chunks'
        Z (kernels/activation_mask.py). It runs where its pattern runs: on grouped GEMMs for chunks
        of 256 units and more (F1 on those r units first), else on the reference. None (default):
        every unit scores its chunk (the token's whole H; on grouped GEMMs, F1 in full first).
    mass_loss: lambda >= 0. With an activation pattern (routes None): in the sparse phase, each token's
        H on the units its pattern drops is pushed toward 0 by the gradient of lambda times the mean over
        tokens of its dropped fraction of mass, sum_dropped H / sum H (the denominator held constant;
        kernels/ffn_reference.py), added in the backward of every site that runs sparse: a loss that moves
        the mass to where the pattern sends it, not reported in the training loss. The term is added to dZ
        as it is, so a loss scale (GradScaler, a loss divided over accumulation steps) changes its weight
        against the loss's gradient; a token with little mass gets a strong push. Over all rows it needs
        H in full, so the reference runs it (F1 dense, slower than dense); the size rule (small_ffn)
        treats its sites as the pattern's fast path. 0 (default): none.
    mass_loss_rows: "all" (default) or "scoring": the term on the last score_rows rows of every block
        and each sequence's first token alone, as a mean over those rows: lambda on the same scale, each
        sampled row's push about V / score_rows times as strong. Those are the rows whose H the chunked
        fast path computes in full (causal V:4:M chunks scored on fewer than V rows, F1 on cuBLAS), so
        there it runs on the fast kernels (kernels/scored_mass_loss.py: two more GEMMs of about
        score_rows / V of F1 in the backward); elsewhere on the reference, and the report says why.
    kernels: "auto" (the fast kernels where they apply, each gather GEMM measured against cuBLAS at
        compile time; per-token chunks on grouped GEMMs from 256 units; else the reference;
        sparse_compile/planning/plan.py), "reference" (pure torch) or "triton" (the fast path wherever
        the pattern allows: the Triton gather kernels, or the grouped GEMMs at any chunk width).
    min_hidden: FFNs with a smaller hidden size stay dense.
    small_ffn: CUDA sites too small to pay, by a size rule on T x d x h (sparse_compile/passes/
        size_rule.py). "graphs" (default): a site that pays only with CUDA graphs runs sparse and its
        graph runs as CUDA graphs in both phases, where that is possible (sparse_compile/cuda_graphs.py
        says where not); smaller sites stay dense, and the report says so per site. "dense": they stay dense
        and nothing turns CUDA graphs on. "sparse": they run sparse anyway.
    masked_decay: lambda of masked decay, grad(W) += lambda * (1 - M) * W (needs weights="2:4").
    weight_copies: under autocast, float32 weights reach the sparse op as compute-dtype copies.
        "keep" (the field's default, as dense autocast does): forward's copies stay alive until
        backward; the "chunked" preset (backend="sparse"'s default) has "recompute".
        "recompute": the op gets the float32 weights and casts them itself, forward and again in
        backward, so no copy stays alive between them: 2 bytes per FFN weight less peak memory for
        one more cast of W1 and W2 per backward. Needs weights=None: 2:4 weights are masked copies.
    """

    weights: str | None = None
    activations: str | None = None
    weight_grad: str = "dense"
    weight_grad_dense_frac: float = 0.02
    kernels: str = "auto"
    chunk: int = 1
    causal: bool = False
    score_rows: int | None = None
    permute: bool = False
    routes: int | None = None
    min_hidden: int = 0
    small_ffn: str = "graphs"
    masked_decay: float = 0.0
    weight_copies: str = "keep"
    token_extra: int = 0
    router: str = DEFAULT_ROUTER
    score_units: int | None = None
    mass_loss: float = 0.0
    mass_loss_rows: str = "all"

    def __post_init__(self) -> None:
        for name, (valid, expected) in FIELD_CHECKS.items():  # each field alone, then how they combine
            value = getattr(self, name)
            if not valid(value):
                raise ValueError(f"SparsityConfig.{name}={value!r}: expected {expected}")
        # chunk, causal and permute act on the blocks of V > 1 tokens of a V:N:M pattern (chunk and permute
        # also on per-token chunks, 1:4:M)
        no_blocks = self.activations is None or parse_activation_pattern(self.activations)[0] == 1
        if self.chunk > 1 and (self.activations is None or (no_blocks and self.activation_pattern[1] != 4)):
            raise ValueError(
                f"SparsityConfig.chunk={self.chunk} needs V:N:M activations with V > 1, or per token (V = 1) "
                f"whole chunks, 1:4:M; got activations={self.activations!r}"
            )
        if self.causal and no_blocks:
            raise ValueError(
                f"SparsityConfig.causal=True needs V:N:M activations with V > 1 (2:4 and V = 1 choose per "
                f"token and are causal already); got activations={self.activations!r}"
            )
        if self.score_rows is not None:
            v = None if no_blocks else parse_activation_pattern(self.activations)[0]
            sr = self.score_rows
            if not score_rows_apply(sr, v, self.causal, self.chunk):
                raise ValueError(
                    f"SparsityConfig.score_rows={sr!r}: expected None or an int in [1, V] (V={v}) with causal=True "
                    f"and chunk > 1 (causal={self.causal!r}, chunk={self.chunk}, activations={self.activations!r})"
                )
        if self.permute and (no_blocks and self.chunk < 2):
            raise ValueError(
                f"SparsityConfig.permute=True needs V:N:M activations with V > 1 or in chunks (chunk > 1); got "
                f"activations={self.activations!r}, chunk={self.chunk}"
            )
        if self.routes is not None:
            self._check_routes()
        elif self.router != DEFAULT_ROUTER:
            raise ValueError(f"SparsityConfig.router={self.router!r} needs routes=G (routed tokens); got routes=None")
        if self.masked_decay and self.weights is None:
            raise ValueError(
                f"SparsityConfig.masked_decay={self.masked_decay!r} needs weights='2:4' (it decays the pruned weights)"
            )
        if self.weights is None and self.activations is None:
            raise ValueError("SparsityConfig: weights=None and activations=None leave nothing sparse; set one")
        if self.token_extra and (no_blocks or self.routes is not None):
            raise ValueError(
                f"SparsityConfig.token_extra={self.token_extra} needs V:N:M activations with V > 1 (a block's choice "
                f"to add to) and routes=None; got activations={self.activations!r}, routes={self.routes!r}"
            )
        if self.score_units is not None and not (no_blocks and 1 < self.chunk and self.score_units < self.chunk):
            raise ValueError(
                f"SparsityConfig.score_units={self.score_units} needs per-token chunks (1:4:M activations, chunk > 1) "
                f"and an int in [1, chunk - 1]; got activations={self.activations!r}, chunk={self.chunk}"
            )
        if self.mass_loss and (self.activations is None or self.routes is not None):
            raise ValueError(
                f"SparsityConfig.mass_loss={self.mass_loss!r} needs an activation pattern (units for it to drop) "
                f"and routes=None; got activations={self.activations!r}, routes={self.routes!r}"
            )
        if self.mass_loss_rows == "scoring" and not (self.mass_loss and self.score_rows is not None):
            raise ValueError(
                f"SparsityConfig.mass_loss_rows='scoring' needs mass_loss > 0 and score_rows (each block's scoring "
                f"rows); got mass_loss={self.mass_loss!r}, score_rows={self.score_rows!r}"
            )
        if self.weight_copies == "recompute" and self.weights is not None:
            raise ValueError(
                f"SparsityConfig.weight_copies='recompute' needs weights=None; got weights={self.weights!r} (2:4 "
                "weights reach the op as masked copies, not parameters)"
            )

    def _check_routes(self) -> None:
        g = self.routes
        if not _is_int(g) or not 2 <= g <= 1024:
            raise ValueError(f"SparsityConfig.routes={g!r}: expected None or an int in [2, 1024] (groups of units)")
        pattern = None if self.activations is None else parse_activation_pattern(self.activations)
        if pattern is None or pattern[0] == 1 or pattern[1] != 4 or self.chunk < 2:
            raise ValueError(
                f"SparsityConfig.routes={g} needs V:4:M activations with V > 1 in chunks (chunk > 1): a routed "
                f"token keeps whole chunks; got activations={self.activations!r}, chunk={self.chunk}"
            )
        clash = {k: v for k, v in (("causal", self.causal), ("score_rows", self.score_rows), ("permute", self.permute))
                 if v not in (False, None)}  # fmt: skip
        if clash:
            raise ValueError(
                f"SparsityConfig.routes={g}: routing chooses per token from its own input (causal by construction) "
                f"and keeps its own unit permutation; set causal=False, score_rows=None, permute=False, got {clash}"
            )

    @property
    def activation_pattern(self) -> tuple[int, int, int] | None:
        """(V, N, M) of the activation pattern, or None."""
        return None if self.activations is None else parse_activation_pattern(self.activations)

    @classmethod
    def preset(cls, name: str) -> "SparsityConfig":
        """A named recipe: 'chunked' (the default: causal 128:4:16 in chunks of 128 units), 'chunked-half'
        (causal 128:4:8 in chunks of 64), or a paper's:
        'activation24' (Haziza), 'weight24' (Hu), 'venom' (Madhyastha)."""
        from sparse_compile.presets import PRESETS  # presets.py builds on this module

        if not isinstance(name, str) or name not in PRESETS:
            raise ValueError(f"SparsityConfig preset={name!r}: expected one of {sorted(PRESETS)}")
        return PRESETS[name]

    @property
    def weight_grad_pattern(self) -> tuple[int, int, int] | None:
        """(V, N, M) of the token-dim weight-gradient pattern, or None (exact)."""
        return parse_weight_grad(self.weight_grad)

    def op_spec(self) -> str:
        """The string the custom op receives, without a plan's kernel choices (contract.op_spec):
        'weights=..;activations=..;kernels=..;weight_grad=..;dense_frac=..'."""
        return op_spec(self)
