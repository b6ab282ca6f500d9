"""sparse_compile::sqrelu_ffn_routed: the FFN with routed tokens (kernels/routing.py).

sqrelu_ffn_routed(x, w1, b1, w2, b2, spec) -> (y, r, ids, dest)
    spec carries "routes=G", the site ("units=<module path>", whose state ops/routes.py keeps) and
    "gather=1" for the gather kernels (kernels/ffn_routed.py): then r = R~ [rows, h*4/M] on the
    padded rows, ids [rows/V, h*4/M] and dest [T]; else the reference's masked dense math: r =
    relu(Z) * A [T, h], ids empty, dest = each token's group.
sqrelu_ffn_routed_backward(dy, x, w1, w2, r, ids, dest, spec) -> (dx, dw1, db1, dw2, db2)
The site's permutation must not change between a forward and its backward (refit between steps).
"""

import math

import torch

from sparse_compile.kernels import sqrelu_ffn_backward_ref
from sparse_compile.kernels.routing import routed_blocks, routed_ffn_ref
from sparse_compile.ops import routes, unit_perms
from sparse_compile.ops.spec import backward_operands, ffn_autograd, ffn_setup, forward_operands, grads_like, parse_spec


def _site(spec: str) -> tuple[routes.RouteSite, tuple[int, int, int], int, bool]:
    op = parse_spec(spec)
    if op.routes is None or op.units is None or op.activations is None:
        raise ValueError(f"sqrelu_ffn_routed: spec {spec!r} needs routes=G, units=<site> and V:N:M activations")
    return routes.site(op.units, op.routes, op.activations, op.chunk, op.router), op.activations, op.chunk, op.gather


@torch.library.custom_op("sparse_compile::sqrelu_ffn_routed", mutates_args=())
def sqrelu_ffn_routed(
    x: torch.Tensor,
    w1: torch.Tensor,
    b1: torch.Tensor | None,
    w2: torch.Tensor,
    b2: torch.Tensor | None,
    spec: str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    _, x2, w1, b1, w2, b2 = forward_operands(x, w1, b1, w2, b2, spec)
    s, (v, _, _), chunk, gather = _site(spec)
    routes.record(s, x2, w1, b1)
    routes.prepare(s, w1, b1)
    route = routes.route(s, x2, w1, b1)
    w1, b1, w2 = unit_perms.permute(w1, b1, w2, s.perm)
    if gather:
        from sparse_compile.kernels.ffn_routed import sqrelu_ffn_forward_routed  # Triton: imported when used

        y, r, ids, dest = sqrelu_ffn_forward_routed(x2, w1, b1, w2, b2, route, s.cols, v, chunk)
    else:
        y, r = routed_ffn_ref(x2, w1, b1, w2, b2, route, s.cols)
        ids, dest = x2.new_empty((0, s.cols.shape[1]), dtype=torch.int32), route
    return y.reshape(*x.shape[:-1], w2.shape[0]), r, ids, dest


@sqrelu_ffn_routed.register_fake
def _(x, w1, b1, w2, b2, spec):
    op = parse_spec(spec)
    v, _, m = op.activations
    tokens = math.prod(x.shape[:-1])
    kc = w1.shape[0] * 4 // m
    y = x.new_empty((*x.shape[:-1], w2.shape[0]))
    dest = x.new_empty((tokens,), dtype=torch.int64)
    if not op.gather:
        return y, x.new_empty((tokens, w1.shape[0])), x.new_empty((0, kc), dtype=torch.int32), dest
    blocks = routed_blocks(tokens, op.routes, v)
    return y, x.new_empty((blocks * v, kc)), x.new_empty((blocks, kc), dtype=torch.int32), dest


@torch.library.custom_op("sparse_compile::sqrelu_ffn_routed_backward", mutates_args=())
def sqrelu_ffn_routed_backward(
    dy: torch.Tensor,
    x: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    r: torch.Tensor,
    ids: torch.Tensor,
    dest: torch.Tensor,
    spec: str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    s, (v, _, m), chunk, gather = _site(spec)
    perm = None if s.perm is None else s.perm.to(x.device)
    dy2, x2, w1c, w2c = backward_operands(dy, x, w1, w2, perm)
    if gather:
        from sparse_compile.kernels.ffn_routed import sqrelu_ffn_backward_routed

        dx, dw1, db1, dw2, db2 = sqrelu_ffn_backward_routed(dy2, x2, w1c, w2c, r, ids, dest, v, m, chunk)
    else:
        dx, dw1, db1, dw2, db2 = sqrelu_ffn_backward_ref(dy2, x2, w1c, w2c, r, None, 0.0)
    dw1, db1, dw2 = unit_perms.unpermute(dw1, db1, dw2, perm)
    return dx.reshape(x.shape), dw1, db1, dw2, db2


@sqrelu_ffn_routed_backward.register_fake
def _(dy, x, w1, w2, r, ids, dest, spec):
    return grads_like(x, w1, w2)


sqrelu_ffn_routed.register_autograd(
    ffn_autograd(torch.ops.sparse_compile.sqrelu_ffn_routed_backward), setup_context=ffn_setup
)
