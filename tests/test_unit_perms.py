"""Hidden-unit permutations (SparsityConfig.permute, sparse_compile/ops/unit_perms.py): a permuted site
computes the V:N:M pattern of H[:, p] mapped back to the units' own order; gradients land on the
right units; the identity is today's op; the dense phase, the parameters and the state dict are
untouched; probe_units + recluster fit valid permutations; bad input names the value."""

import copy

import pytest
import torch
import torch.nn.functional as F

import sparse_compile
from sparse_compile import SparsityConfig, compile_reports
from sparse_compile.kernels import vnm_mask

from .test_backend import Stack, grads


def _oracle(model, x, pattern, perms):
    """Eager masked math: block i keeps vnm_mask(H[:, p_i]) mapped back by p_i^-1; masks constant."""
    for i, b in enumerate(model.blocks):
        h = torch.relu(F.linear(x, b.fc.weight, b.fc.bias)) ** 2
        h2 = h.reshape(-1, h.shape[-1]).detach()
        p = perms.get(f"blocks.{i}")
        keep = vnm_mask(h2 if p is None else h2[:, p], *pattern)
        if p is not None:
            keep = keep[:, torch.argsort(p)]
        x = x + F.linear(h * keep.reshape(h.shape), b.proj.weight, b.proj.bias)
    return x


def _perms(seed=0, h=128):
    g = torch.Generator().manual_seed(seed)
    return {"blocks.0": torch.randperm(h, generator=g), "blocks.1": torch.randperm(h, generator=g)}


@pytest.mark.parametrize("kernels", ["reference", "triton"])
def test_permuted_sites_match_the_oracle(kernels):
    options = {"activations": "16:2:8", "permute": True, "kernels": kernels}
    model, ref = Stack(), Stack()
    perms = _perms()
    sparse_compile.load_unit_permutations(perms)
    compiled = torch.compile(model, backend="sparse", options=options)
    x, gy = torch.randn(2, 32, 32), torch.randn(2, 32, 32)
    y = compiled(x)
    (y * gy).sum().backward()
    y_ref = _oracle(ref, x, (16, 2, 8), perms)
    (y_ref * gy).sum().backward()
    torch.testing.assert_close(y, y_ref, rtol=1e-4, atol=1e-4)
    g, g_ref = grads(model), grads(ref)
    for k in g:
        torch.testing.assert_close(g[k], g_ref[k], rtol=1e-4, atol=1e-4, msg=k)
    unpermuted = _oracle(Stack(), x, (16, 2, 8), {})
    assert not torch.allclose(y, unpermuted, rtol=1e-3, atol=1e-3)  # the permutation changed the groups
    report = compile_reports()[-1]
    assert {s.record.module for s in report.sparse_sites} == {"blocks.0", "blocks.1"}
    assert "hidden units permuted" in str(report)


def test_identity_is_the_plain_op_and_dense_phase_and_state_dict_are_untouched():
    x = torch.randn(2, 32, 32)
    plain = torch.compile(Stack(), backend="sparse", options={"activations": "16:2:8"})(x)
    model = Stack()
    keys = {k: v.shape for k, v in model.state_dict().items()}
    compiled = torch.compile(model, backend="sparse", options={"activations": "16:2:8", "permute": True})
    torch.testing.assert_close(compiled(x), plain, rtol=0, atol=0)  # no permutation yet: identity
    sparse_compile.load_unit_permutations(_perms(1))
    with sparse_compile.dense_phase():
        torch.testing.assert_close(compiled(x), Stack()(x), rtol=1e-5, atol=1e-5)
    assert {k: v.shape for k, v in model.state_dict().items()} == keys


def test_probe_and_recluster_fit_permutations_of_each_site():
    model = Stack()
    compiled = torch.compile(model, backend="sparse", options={"activations": "16:2:8", "permute": True})
    x = torch.randn(4, 32, 32)
    before = compiled(x).detach()
    assert sparse_compile.recluster() == []  # nothing recorded outside probe_units
    with sparse_compile.probe_units(), torch.no_grad():
        compiled(x)
    assert sorted(sparse_compile.recluster()) == ["blocks.0", "blocks.1"]
    perms = sparse_compile.unit_permutations()
    for p in perms.values():
        assert torch.equal(torch.sort(p).values, torch.arange(128))
    assert any(not torch.equal(p, torch.arange(128)) for p in perms.values())
    assert not torch.allclose(compiled(x), before)  # the sites now run with the fitted permutations
    saved = copy.deepcopy(perms)
    sparse_compile.reset_units()
    assert sparse_compile.unit_permutations() == {}
    sparse_compile.load_unit_permutations(saved)
    assert all(torch.equal(sparse_compile.unit_permutations()[k], v) for k, v in saved.items())


def test_bad_permutations_and_configs_name_the_value():
    with pytest.raises(ValueError, match="not a permutation of 0..n-1"):
        sparse_compile.load_unit_permutations({"blocks.0": torch.tensor([0, 0, 1])})
    sparse_compile.load_unit_permutations({"blocks.0": torch.arange(64)})  # wrong size for h = 128
    compiled = torch.compile(Stack(), backend="sparse", options={"activations": "16:2:8", "permute": True})
    with pytest.raises(ValueError, match="permutation of 64 units for a site with hidden=128"):
        compiled(torch.randn(2, 32, 32))
    for kwargs in ({"activations": "2:4", "permute": True}, {"weights": "2:4", "permute": True}):
        with pytest.raises(ValueError, match="permute=True needs V:N:M activations with V > 1 or in chunks"):
            SparsityConfig(**kwargs)
    with pytest.raises(ValueError, match="expected True or False"):
        SparsityConfig(activations="16:2:8", permute="yes")
