"""One rank of the 2-process re-clustering check (gloo, CPU): each rank records the profiles of its
own batch, then recluster() runs on both; writes the ranks' profiles and permutations."""

import json
import os
import sys

import torch
import torch.distributed as dist

import sparse_compile
from sparse_compile.ops import unit_perms
from tests.test_backend import Stack

OPTIONS = {"activations": "16:2:8", "permute": True}


def main(rank: int, world: int, port: str, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    compiled = torch.compile(Stack(), backend="sparse", options=OPTIONS)
    x = torch.randn(4, 32, 32, generator=torch.Generator().manual_seed(rank))  # each rank its own batch
    with sparse_compile.probe_units(), torch.no_grad():
        compiled(x)
    profiles = {name: site.profiles[0].tolist() for name, site in unit_perms._sites.items()}
    sites = sparse_compile.recluster()
    perms = {name: p.tolist() for name, p in sparse_compile.unit_permutations().items()}
    with sparse_compile.probe_units(), torch.no_grad():  # rank 1 records twice: the shapes differ
        for _ in range(1 + rank):
            compiled(x)
    try:
        sparse_compile.recluster()
        error = ""
    except ValueError as e:
        error = str(e)
    every: list = [None] * world
    dist.all_gather_object(every, {"profiles": profiles, "sites": sites, "perms": perms, "error": error})
    if rank == 0:
        with open(out, "w") as f:
            json.dump(every, f)
    dist.barrier()
    os._exit(0)  # gloo's teardown can hang a rank whose peer has exited (tests/ddp_worker.py)


if __name__ == "__main__":
    torch.multiprocessing.spawn(main, args=(2, sys.argv[1], sys.argv[2]), nprocs=2)
