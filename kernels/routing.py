"""Routed tokens: each token keeps the hidden units of one group, chosen from its own input.

A routed V:4:M pattern in chunks of c units has G groups. Group g is a fixed set of chunks: in every
run of M chunks (M c units) the same 4 (``groups`` [G, F/(M c), 4], chunk ids inside each run,
ascending), so it keeps 1/(M/4) of H's columns. A router scores each token from its own row x_t:
route(t) = argmax_g sum_j relu(x_t W1[rep[g, j]] + b1[rep[g, j]])^2 over r representative units of
each group (``rep`` [G, r]; ties to the lower group), or a linear router route(t) = argmax_g x_t L_g + l_g
(``route_linear``), and the token keeps the units of its group:

    H~[t, u] = H[t, u] if u is in group route(t), else 0;  H = relu(X W1^T + b1)^2.

No token's kept units depend on another token, so the pattern is causal by construction.

The fast path (kernels/ffn_routed.py) runs the V:N:M gather kernels on the tokens sorted by route:
a stable sort of the T tokens by group, each group padded to a multiple of V with zero rows, so
every block of V rows holds tokens of one group and its kept columns are that group's
(``route_plan``). The padded layout has a fixed number of blocks for any routing,
(T + G (V - 1)) // V (the bound on sum_g ceil(T_g / V)), so no shape depends on the data: blocks
past the last group's are zero rows with the last group's columns.
"""

import torch


def group_columns(groups: torch.Tensor, m: int, c: int) -> torch.Tensor:
    """int32 [G, F*4/M]: the absolute unit ids of each group's kept columns, in the compact layout of
    the gather kernels (per run of M chunks its 4 kept chunks side by side, c units each), from
    ``groups`` [G, F/(M c), 4] (chunk ids in 0..M-1, ascending)."""
    if groups.dim() != 3 or groups.shape[2] != 4:
        raise ValueError(f"group_columns: groups must be [G, F/(M c), 4]; got {tuple(groups.shape)}")
    g, runs, _ = groups.shape
    base = torch.arange(runs, device=groups.device)[:, None, None] * (m * c)
    ids = base + groups[..., None] * c + torch.arange(c, device=groups.device)  # [G, runs, 4, c]
    return ids.reshape(g, runs * 4 * c).to(torch.int32)


def rep_activations(x: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor | None, rep: torch.Tensor) -> torch.Tensor:
    """float32 [T, G r]: H = relu(x w1[u] + b1[u])^2 of each row of x [T, d] on the representative units
    rep [G, r] (unit ids of w1 [h, d]), group by group: F1 on G r of the h units, the product in x's dtype."""
    flat = rep.reshape(-1)
    z = torch.nn.functional.linear(x, w1.index_select(0, flat), None if b1 is None else b1.index_select(0, flat))
    return torch.relu(z).float().square()


def route_tokens(x: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor | None, rep: torch.Tensor) -> torch.Tensor:
    """int64 [T]: each row of x [T, d]'s group, from its own activations on the groups' representative
    units rep [G, r]: argmax_g sum_j relu(x w1[rep[g, j]] + b1[rep[g, j]])^2 (``rep_activations``), the
    sums and the argmax in float32."""
    return route_of_activations(rep_activations(x, w1, b1, rep), rep.shape[0])


def route_linear(x: torch.Tensor, lin: torch.Tensor) -> torch.Tensor:
    """int64 [T]: each row of x [T, d]'s group by a linear router lin [G, d + 1] (weights, then the
    bias): argmax_g x lin[g, :d] + lin[g, d] in float32 (ties to the lower group): bf16 would round
    together scores closer than 1/256 of their size. A [T, d] x [d, G] GEMM."""
    return torch.nn.functional.linear(x.float(), lin[:, :-1].float(), lin[:, -1].float()).argmax(dim=1)


def route_of_activations(h_rep: torch.Tensor, n_groups: int) -> torch.Tensor:
    """int64 [T]: argmax over groups of the summed H on each group's representatives, from h_rep
    [T, G r] float32 (H at rep.reshape(-1), group by group): the router's choice from H itself."""
    return h_rep.reshape(h_rep.shape[0], n_groups, -1).sum(dim=2).argmax(dim=1)


def routed_blocks(tokens: int, n_groups: int, v: int) -> int:
    """Blocks of V rows in the padded layout of ``tokens`` tokens routed to ``n_groups`` groups."""
    return (tokens + n_groups * (v - 1)) // v


def route_plan(route: torch.Tensor, n_groups: int, v: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The padded layout of tokens routed to groups: (dest int64 [T]: the padded row of token t,
    block_group int64 [blocks]: the group of each block of V rows). Tokens of a group keep their
    order; group g's rows start at V * (the blocks of the groups before it). A stable sort by group
    without a sort: one scan of the one-hot routes laid out group-major, e[g T + t] = [route(t) = g],
    gives at g T + t the tokens of groups < g plus those of group g up to t; so token t's rank in its
    group is that at route(t) T + t minus the tokens of groups < route(t), minus 1. One flat scan (a
    scan along a short outer dimension would run each column serially). No host sync: every shape is
    fixed by T, G and V."""
    t = route.numel()
    flat = route * t + torch.arange(t, device=route.device)
    # index_fill_, not one_hot or bincount: those may read the routes' range back to the host (a sync);
    # int32 counts (at most T) halve the [G T] buffers
    e = torch.zeros(n_groups * t, dtype=torch.int32, device=route.device).index_fill_(0, flat, 1)
    running = torch.cumsum(e, 0, dtype=torch.int32)
    ends = running.view(n_groups, t)[:, -1] if t else running.new_zeros(n_groups)  # tokens of groups <= g
    before = torch.cat([running.new_zeros(1), ends]).long()  # [G + 1]: tokens of groups < g
    counts = before[1:] - before[:-1]
    rank = running[flat].long() - before[route] - 1
    blocks = (counts + v - 1) // v
    block_end = torch.cumsum(blocks, 0)
    dest = (block_end - blocks)[route] * v + rank
    block_group = torch.searchsorted(
        block_end, torch.arange(routed_blocks(t, n_groups, v), device=route.device), right=True
    )
    return dest, block_group.clamp_max(n_groups - 1)


def padded_sources(dest: torch.Tensor, rows: int) -> torch.Tensor:
    """src int64 [rows]: the token of each padded row, 0 for the padding."""
    # index_copy_ with an arange, not `src[dest] = ...` from a host tensor (a sync)
    src = torch.zeros(rows, dtype=torch.long, device=dest.device)
    return src.index_copy_(0, dest, torch.arange(dest.numel(), device=dest.device))


def padding_rows(dest: torch.Tensor, rows: int) -> torch.Tensor:
    """int64 [rows - T]: the padded layout's rows that hold no token, ascending. No host sync: their
    number is fixed by the shapes. Row i's slot in a permutation of the rows: the padding first, by
    rank among the padding (c_i - 1, c = the running count of padding rows), then the tokens' rows
    (rows - T + i - c_i); the first rows - T of the inverse permutation are the padding rows."""
    t = dest.numel()
    is_pad = torch.ones(rows, dtype=torch.long, device=dest.device).index_fill_(0, dest, 0)
    c = torch.cumsum(is_pad, 0)
    i = torch.arange(rows, device=dest.device)
    slot = torch.where(is_pad.bool(), c - 1, rows - t + i - c)
    return torch.empty_like(i).index_copy_(0, slot, i)[: rows - t]


def routed_mask(route: torch.Tensor, cols: torch.Tensor, hidden: int) -> torch.Tensor:
    """bool [T, hidden]: the units each token keeps (its group's columns, ``cols`` [G, Kc])."""
    keep = torch.zeros(cols.shape[0], hidden, dtype=torch.bool, device=cols.device)
    keep.scatter_(1, cols.long(), True)
    return keep[route]


def routed_ffn_ref(
    x: torch.Tensor,
    w1: torch.Tensor,
    b1: torch.Tensor | None,
    w2: torch.Tensor,
    b2: torch.Tensor | None,
    route: torch.Tensor,
    cols: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Masked dense math of the routed FFN: (y [T, d_out], r_masked [T, h] = relu(Z) * A), A the
    routed mask; the gradients of y with the mask held constant are those of this function."""
    r = torch.relu(torch.nn.functional.linear(x, w1, b1)) * routed_mask(route, cols, w1.shape[0])
    return torch.nn.functional.linear(r * r, w2, b2), r
