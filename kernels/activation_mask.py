"""V:N:M ("Venom") and 2:4 activation masks: pure-torch reference.

H (T x F, non-negative: H = relu(Z)^2) is cut into blocks of V tokens x M features.
Each block keeps 4 of its M columns, the 4 with the largest column L1 norm over the
block's V tokens (accumulated in float32); inside those 4 columns every row keeps its
N largest entries. Density N/M. 2:4 along features is V=1, N=2, M=4.

Neuron chunks (``c`` > 1): the unit a block keeps or drops is a chunk of c adjacent hidden
units. H is cut into blocks of V tokens x M chunks of c units (M*c features); each block keeps the
4 chunks of largest L1 norm over its V tokens and c units; inside them every row keeps, at each of
the c offsets, its N largest of the 4 chunks' entries. c = 1 is the pattern above. A hidden unit
is then nonzero only in the token blocks that kept its chunk, which makes dW = (.)^T (.) block-
sparse along tokens (kernels/chunk_wgrad_triton.py).

Causal patterns (``seq``, tokens per sequence, a multiple of V): the 4 chunks a block keeps are
chosen from the tokens before it, so no token's output depends on a later token. Block j > 0 of
a sequence is scored by the norms of block j - 1 (with ``score_rows`` S < V: of its last S rows only,
the tokens right before block j); a sequence's first block by its first token's row alone.
Scoring on S rows lets a forward compute Z = X W1^T + b1 in full only on those rows and the kept
chunks elsewhere (kernels/chunk_score_triton.py): the chunks of block j are known before its Z is.
The in-row choice is per token, causal either way. Without ``seq`` a block's columns
are chosen from all V of its tokens, later ones included: token t's kept columns then carry
information about tokens t+1 .. of its block, which a causal LM can learn to read.

Scoring units (``score_units`` r < c): a chunk is ranked by the L1 norm of its first r units only
(over the same tokens), not of all c: with V = 1 (each token its own chunks) the choice then needs
Z on h r / c columns per token, a router from the token's own input, before the kept chunks' Z.

Ties, both steps: the lower column (chunk) index wins (the order of a stable descending sort).
Kept column ids are stored ascending. Column choice takes the first 4 of a stable descending sort
of the [T/V, F/(M c), M] norm tensor; the in-row choice is N rounds of argmax (first maximum).
"""

import torch


def _check(
    h: torch.Tensor,
    v: int,
    n: int,
    m: int,
    c: int = 1,
    seq: int | None = None,
    score_rows: int | None = None,
    score_units: int | None = None,
) -> None:
    if score_units is not None and (
        isinstance(score_units, bool) or not isinstance(score_units, int) or not 1 <= score_units <= c
    ):
        raise ValueError(f"vnm: score_units={score_units!r}: needs an int in [1, c] (c={c} units per chunk)")
    if seq is not None and (seq < v or seq % v or h.shape[0] % seq):
        raise ValueError(
            f"vnm: causal pattern with sequences of {seq} tokens: needs a multiple of V={v} that divides T={h.shape[0]}"
        )
    if score_rows is not None and (
        seq is None or isinstance(score_rows, bool) or not isinstance(score_rows, int) or not 1 <= score_rows <= v
    ):
        raise ValueError(
            f"vnm: score_rows={score_rows!r} rows of the previous block: needs a causal pattern (seq) and "
            f"1 <= score_rows <= V={v}"
        )
    if h.dim() != 2:
        raise ValueError(f"vnm: expected a 2-D activation [T, F], got shape {tuple(h.shape)}")
    t, f = h.shape
    if t % v:
        raise ValueError(f"vnm: token count T={t} is not a multiple of V={v}")
    if c == 1 and f % m:
        raise ValueError(f"vnm: feature count F={f} is not a multiple of M={m}")
    if c < 1 or f % (m * c):
        raise ValueError(f"vnm: feature count F={f} is not a multiple of M*c = {m}*{c} (groups of M chunks of c units)")
    if n not in (1, 2, 4) or m % 4 or m < 4:
        raise ValueError(f"vnm: pattern {v}:{n}:{m} needs N in (1, 2, 4) and M a multiple of 4")


def top_k_mask(values: torch.Tensor, k: int) -> torch.Tensor:
    """Bool mask of the k largest entries along the last dim; ties go to the lower index (the first
    k of a stable descending sort: an entry's place is the count of larger entries plus equal ones
    at a lower index). Memory of the size of ``values``."""
    first = torch.sort(values, dim=-1, descending=True, stable=True).indices[..., :k]
    return torch.zeros(values.shape, dtype=torch.bool, device=values.device).scatter_(-1, first, True)


def block_scores(
    h: torch.Tensor,
    v: int,
    m: int,
    c: int = 1,
    seq: int | None = None,
    score_rows: int | None = None,
    score_units: int | None = None,
) -> torch.Tensor:
    """The float32 L1 norm [T/V, F/(M c), M] each block ranks its chunks by: over its own V tokens,
    or (causal, ``seq``) over the previous block of its sequence (its last ``score_rows`` rows when
    given) / its first token's row; over each chunk's first ``score_units`` units when given, else
    all c."""
    t, f = h.shape
    blocks = h.reshape(t // v, v, f // (m * c), m, c)[..., : c if score_units is None else score_units]
    if seq is None:
        return blocks.sum(dim=(1, 4), dtype=torch.float32)
    own = blocks[:, v - (score_rows or v) :].sum(dim=(1, 4), dtype=torch.float32)
    first = blocks[:, 0].sum(dim=-1, dtype=torch.float32)
    previous = torch.cat([first[:1], own[:-1]])
    starts = (torch.arange(t // v, device=h.device) % (seq // v) == 0)[:, None, None]
    return torch.where(starts, first, previous)


def _vnm(
    h: torch.Tensor,
    v: int,
    n: int,
    m: int,
    c: int = 1,
    seq: int | None = None,
    score_rows: int | None = None,
    score_units: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(chosen [T/V, F/(M c), M]: the 4 chunks of largest float32 L1 norm per V x M-chunk block
    (block_scores), keep [T/V, V, F/(M c), M, c]: the V:N:M mask)."""
    _check(h, v, n, m, c, seq, score_rows, score_units)
    t, f = h.shape
    blocks = h.reshape(t // v, v, f // (m * c), m, c)
    chosen = top_k_mask(block_scores(h, v, m, c, seq, score_rows, score_units), 4)
    if n == 4:
        return chosen, chosen[:, None, :, :, None].expand(blocks.shape)
    # N rounds of argmax over the M chunks at each row and offset, unchosen chunks at -inf: argmax
    # returns the first maximum, so ties go to the lower chunk, as in a stable descending sort.
    ranked = torch.where(chosen[:, None, :, :, None], blocks, float("-inf"))
    keep = torch.zeros(ranked.shape, dtype=torch.bool, device=h.device)
    for _ in range(n):
        best = ranked.argmax(dim=3, keepdim=True)
        keep.scatter_(3, best, True)
        ranked.scatter_(3, best, float("-inf"))
    return chosen, keep


def vnm_mask(
    h: torch.Tensor,
    v: int,
    n: int,
    m: int,
    c: int = 1,
    seq: int | None = None,
    score_rows: int | None = None,
    score_units: int | None = None,
) -> torch.Tensor:
    """Boolean mask [T, F] of the V:N:M pattern of ``h`` with c-unit chunks, causal over sequences of
    ``seq`` tokens when given, scored on the last ``score_rows`` rows of the previous block and on
    each chunk's first ``score_units`` units when given (see module docstring)."""
    return _vnm(h, v, n, m, c, seq, score_rows, score_units)[1].reshape(h.shape)


def with_token_extra(h: torch.Tensor, keep: torch.Tensor, r: int) -> torch.Tensor:
    """``keep`` [T, F] (bool) with each row's ``r`` largest entries of h [T, F] (>= 0, as H is) outside it
    added, where they are > 0: a token's own top units on top of its block's choice, ties to the lower
    index (top_k_mask). Each row's extra units depend on that row alone, so a causal ``keep`` stays
    causal."""
    if r <= 0:
        return keep
    return keep | (top_k_mask(h.masked_fill(keep, -1), min(r, h.shape[-1])) & (h > 0))


def vnm_select(
    h: torch.Tensor,
    v: int,
    n: int,
    m: int,
    c: int = 1,
    seq: int | None = None,
    score_rows: int | None = None,
    score_units: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Kept chunks and in-row choice of the V:N:M pattern of ``h`` [T, F] (the compact form).

    Returns ``cols`` int64 [T/V, F/(M c), 4]: kept chunk ids inside each group of M chunks,
    ascending; and ``keep`` bool [T, F/(M c), 4 c]: which of those 4 each row keeps at each
    offset o (entry j c + o for chunk j; N per row and offset).
    """
    chosen, mask = _vnm(h, v, n, m, c, seq, score_rows, score_units)
    t, f = h.shape
    g = f // (m * c)
    ids = torch.arange(m, device=h.device).expand_as(chosen)
    cols = torch.where(chosen, ids, m + ids).sort(dim=-1).values[..., :4]  # unchosen ids sort last
    keep = torch.gather(mask, 3, cols[:, None, :, :, None].expand(t // v, v, g, 4, c))
    return cols, keep.reshape(t, g, 4 * c)


def vnm_compact_ref(
    z: torch.Tensor,
    bias: torch.Tensor | None,
    v: int,
    n: int,
    m: int,
    c: int = 1,
    seq: int | None = None,
    score_rows: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The compact V:N:M form of H = relu(z + bias)^2 (z [T, F], bias [F] or None), in z's dtype.

    Returns ``h_c`` [T, F*4/M]: the 4 kept columns of each M-group (ascending), entries a row
    does not keep set to 0; ``r_c`` [T, F*4/M]: relu(z + bias) at the same places (what backward
    needs); ``ids`` int32 [T/V, F*4/M]: the absolute column of each compact column.
    With chunks (c > 1) each group's 4 kept chunks lie side by side, c columns each.
    """
    r = torch.relu(z if bias is None else z + bias)
    h = r * r
    (h_c, r_c), ids = _compact(h, (h, r), v, n, m, c, seq, score_rows)
    return h_c, r_c, ids


def vnm_compact_abs_ref(x: torch.Tensor, v: int, n: int, m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The compact form of x [R, C] (signed) under the V:N:M pattern of |x| (blocks of V rows x M
    columns): (x_c [R, C*4/M], ids int32 [R/V, C*4/M]), as vnm_compact_ref lays them out."""
    (x_c,), ids = _compact(x.abs(), (x,), v, n, m)
    return x_c, ids


def _compact(
    ranked: torch.Tensor,
    values: tuple[torch.Tensor, ...],
    v: int,
    n: int,
    m: int,
    c: int = 1,
    seq: int | None = None,
    score_rows: int | None = None,
):
    """Each of ``values`` at the kept places of the V:N:M pattern of ``ranked`` (compact, 0 where a
    row drops the entry), and the int32 ids of the compact columns."""
    cols, keep = vnm_select(ranked, v, n, m, c, seq, score_rows)
    t, f = ranked.shape
    g = torch.arange(f // (m * c), device=ranked.device)[:, None, None] * (m * c)
    ids = (g + cols[..., None] * c + torch.arange(c, device=ranked.device)).reshape(t // v, f * 4 // m)
    rows = ids.repeat_interleave(v, dim=0)
    keep = keep.reshape(t, f * 4 // m)
    return tuple(x.gather(1, rows) * keep for x in values), ids.to(torch.int32)
