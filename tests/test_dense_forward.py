"""forward="dense": the dense FFN's output, the masked FFN's gradients (the pattern prunes the backward only)."""

import copy
import dataclasses

import pytest
import torch

from sparse_compile import SparsityConfig
from sparse_compile.contract import op_spec
from sparse_compile.options import BackendOptions
from sparse_compile.planning.plan import GATHER

from .test_backend import Stack, assert_compiled_matches_oracle, grads

DENSE_FORWARD = {
    "reference, 16:2:8": SparsityConfig(activations="16:2:8", forward="dense"),
    "reference, per-token chunks": SparsityConfig(activations="1:4:8", chunk=16, forward="dense"),
    "triton, 16:2:8": SparsityConfig(activations="16:2:8", kernels="triton", forward="dense"),
    "triton, chunks of 16": SparsityConfig(activations="16:4:8", chunk=16, kernels="triton", forward="dense"),
    # causal chunks scored on 4 rows: the sparse forward would run F1 on the scoring rows only
    "triton, causal scored chunks": SparsityConfig(
        activations="16:4:8", chunk=16, causal=True, score_rows=4, kernels="triton", forward="dense"
    ),
}


@pytest.mark.parametrize("name", list(DENSE_FORWARD))
def test_dense_forward_output_is_dense_and_gradients_are_the_masked_ones(interpreter, name):
    """Compiled: the output equals the dense model's, the gradients the oracle's (the masked function's
    at the dense forward's inputs), and they differ from the dense model's gradients."""
    config = DENSE_FORWARD[name]
    x = torch.randn(2, 32, 32)
    report = assert_compiled_matches_oracle(config, x, 1e-4)
    if config.kernels == "triton":
        assert [s.kernel for s in report.sparse_sites] == [GATHER, GATHER]
    assert report.sparse_sites[0].patterns["F2"] == "dense"
    assert report.sparse_sites[0].patterns["B2"].startswith(f"A{config.activations}")
    assert "forward=dense" in str(report)

    dense, sparse = Stack(), Stack()
    y_dense = dense(x)
    y_dense.square().sum().backward()
    compiled = torch.compile(sparse, backend="sparse", options=dataclasses.asdict(config))
    y = compiled(x)
    y.square().sum().backward()
    torch.testing.assert_close(y, y_dense, rtol=1e-5, atol=1e-5)
    g, g_dense = grads(sparse), grads(dense)
    assert (g["blocks.0.fc.weight"] - g_dense["blocks.0.fc.weight"]).abs().max() > 1e-2  # the backward is pruned


def test_sparse_forward_differs_from_dense_forward():
    """The same pattern with forward="sparse" (the default) changes the output: the test above can fail."""
    x = torch.randn(2, 32, 32)
    model = Stack()
    y_dense = copy.deepcopy(model)(x)
    y = torch.compile(model, backend="sparse", options={"activations": "16:2:8"})(x)
    assert (y - y_dense).abs().max() > 1e-2


def test_dense_forward_options_and_spec():
    config = BackendOptions.parse({"forward": "dense", "causal": False}).config
    assert (config.forward, config.causal, config.score_rows, config.chunk) == ("dense", False, None, 128)
    assert op_spec(config).endswith(";forward=dense")
    assert "forward" not in op_spec(BackendOptions.parse(None).config)


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"activations": "16:2:8", "forward": "half"}, r"forward='half': expected one of \('sparse', 'dense'\)"),
        ({"activations": "16:2:8", "forward": True}, r"forward=True: expected one of"),
        ({"activations": "2:4", "forward": "dense"}, r"forward='dense' needs V:N:M activations.*activations='2:4'"),
        ({"weights": "2:4", "forward": "dense"}, r"forward='dense' needs .*activations=None"),
        ({"weights": "2:4", "activations": "16:2:8", "forward": "dense"}, r"weights='2:4'"),
        ({"activations": "16:4:8", "chunk": 16, "routes": 4, "forward": "dense"}, r"routes=4"),
    ],
)
def test_dense_forward_config_errors_name_the_value(fields, match):
    with pytest.raises(ValueError, match=match):
        SparsityConfig(**fields)
