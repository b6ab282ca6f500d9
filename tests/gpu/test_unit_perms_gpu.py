"""Hidden-unit re-clustering on a real GPU: a CUDA site records its block-mass profiles on the GPU and
recluster() fits there (a CPU fit slows down many-fold when several training processes share the
CPU), giving a valid permutation that the site then runs with. Run by hand on H100/H200; the CPU
tests are tests/test_unit_perms.py."""

import pytest
import torch

import sparse_compile
from sparse_compile.clustering import cluster_units
from sparse_compile.ops import unit_perms

from ..test_backend import Stack

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (the CPU path is in tests/)")


@pytest.mark.parametrize("options", [{"activations": "16:2:8"}, {"activations": "16:4:8", "chunk": 4}])
def test_recluster_fits_on_the_gpu(options):
    sparse_compile.reset_units()
    torch._dynamo.reset()
    model = Stack().cuda()
    compiled = torch.compile(model, backend="sparse", options={**options, "permute": True, "small_ffn": "sparse"})
    x = torch.randn(4, 32, 32, device="cuda", generator=torch.Generator("cuda").manual_seed(0))
    before = compiled(x).detach()
    with sparse_compile.probe_units(), torch.no_grad():
        compiled(x)
    recorded = {name: site.profiles[0] for name, site in unit_perms._sites.items()}
    assert {p.device.type for p in recorded.values()} == {"cuda"}
    assert sorted(sparse_compile.recluster()) == ["blocks.0", "blocks.1"]
    for name, p in recorded.items():
        site = unit_perms._sites[name]
        assert site.perm.device.type == "cuda"
        assert torch.equal(torch.sort(site.perm).values.cpu(), torch.arange(128))
        m, c = site.pattern[2], site.chunk
        want = cluster_units(p, m, c)  # the same fit, called directly on the recorded profiles
        assert torch.equal(site.perm, want)
    assert not torch.allclose(compiled(x), before)  # the sites run with the fitted permutations
    sparse_compile.reset_units()
