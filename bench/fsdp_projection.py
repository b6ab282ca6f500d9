"""python -m bench.fsdp_projection: FSDP2 past two GPUs, on paper (a projection, not a measurement).

Projects the step time of dense and sparse (the default) training under FSDP2 at 8 GPUs in one host
and 64 GPUs in 8 hosts, for the project's 1.3B GPT and a 7B one, from the measured one-GPU step times
(bench/RESULTS.md section 2) and the 2-GPU FSDP2 measurement on H200 (section 5), with published link speeds.
Prints markdown tables: the projection, the 2-GPU check, and where the sparse gain starts shrinking.

The formula, per GPU and per step (weak scaling: every GPU keeps its 8 x 2048 tokens per step):

    comm    = b * P * (N - 1) / N / (eta * B)     b = 2 (bf16 all-gather, forward) + 4 (fp32 reduce-scatter)
                                                  [+ 2: the backward's all-gather, with reshard_after_forward]
    exposed = comm / U                            U FSDP units: the first unit's all-gather and the last
                                                  reduce-scatter have no compute to hide behind
    step    = max(compute + fixed, comm) + exposed
    speedup = step(dense) / step(sparse) <= compute(dense) / compute(sparse)

    comm exceeds the sparse compute (the gain starts shrinking) when B < B* = b * P * (N - 1) / N / (eta * compute)

Assumptions (every one a named constant or function below):
- Compute per GPU per step is the one-GPU step time, measured (section 2: 1.3B on H100, 256.61 ms dense,
  174.02 ms sparse; section 5: 1.3B on H200, for the 2-GPU check). FSDP2 shards the optimizer, which this
  does not credit (14 ms of the one-GPU step; at 2 GPUs it fell by 4 ms).
- 7B is this project's GPT at 32 layers, d = 4096 (FFN hidden 16384, vocabulary 256): 6.45B parameters.
  Its compute is the 1.3B step scaled by FLOPs, 6 x params x tokens per GPU per step: tokens fixed at
  8 x 2048, so by the parameter ratio (5.33x), and the sparse speedup stays 1.3B's (section 2 measured
  1.555x at 2.7B, so likely low). Memory is not modelled: 7B at 16k tokens per GPU with
  reshard_after_forward=False may not fit 80 GB without activation checkpointing (more compute per step).
- FSDP2 as section 5 ran it: units of 4 blocks, reshard_after_forward=False (one all-gather per step),
  blocks all-gathered in bf16, gradients reduce-scattered in fp32; the root unit (embeddings, final norm)
  in fp32 both ways.
- Collectives are NCCL rings. Every GPU sends and receives (N-1)/N of the collective's bytes, at the bus
  bandwidth B of its slowest link times eta = EFFICIENCY (NCCL reaches about 370 of NVLink 4's 450 GB/s
  per direction on all-gather and reduce-scatter, and 46-48 of a 400 Gb/s NIC's 50 GB/s).
- One host: NVLink 4 through NVSwitch, 900 GB/s bidirectional per GPU (H100 and H200 SXM), 450 per
  direction.
- 8 hosts: one 400 Gb/s InfiniBand NDR NIC per GPU (50 GB/s per direction), rail-aligned rings: NCCL runs
  one ring per NIC, each leaving a host once, so a GPU sends 1/G of its ring bytes over its NIC and the
  rest over NVLink: B = min(G x NIC, NVLink x G / (G - 1)) = 400 GB/s for G = 8 (a host takes in its
  (H-1)/H share over G NICs; the ring is within (N-1)/N / ((H-1)/H) = 1.125x of that bound). The worst
  case, B = 50 GB/s (a GPU's whole share through its own NIC: one NIC's worth per host, or rings that
  do not stay on NVLink inside a host), is a separate row.
- Per-GPU bytes grow only as (N-1)/N, so within one fabric the GPU count alone never makes a step
  comm-bound (from N = 2 to any N they at most double); the bandwidth tier and the tokens per GPU do.
- Communication overlaps compute fully up to the compute time (FSDP2 prefetches the next unit's
  all-gather and issues reduce-scatters as the backward goes); only the first all-gather and the last
  reduce-scatter (1/U of the bytes) are exposed. NCCL's use of SMs and HBM during overlap is not
  modelled beyond FIXED_MS.
- FIXED_MS: what FSDP2 cost at 2 GPUs beyond the modelled exposed communication (copy-in / copy-out of
  parameters and gradients, hooks, contention), fitted on section 5's 2 x H200 rows (mean of dense and
  sparse), taken as independent of N and proportional to the parameter count.
"""

import argparse
from dataclasses import dataclass, replace

GB = 1e9
NVLINK_GBPS = 450.0  # NVLink 4 (H100 / H200 SXM), per GPU per direction: 900 GB/s bidirectional
NIC_GBPS = 50.0  # InfiniBand NDR, 400 Gb/s per NIC per direction, one NIC per GPU
GPUS_PER_HOST = 8
EFFICIENCY = 0.75  # achieved fraction of the links' peak for large all-gathers / reduce-scatters
TOKENS_PER_GPU = 8 * 2048  # the bench's batch: 8 sequences of 2048 per GPU per step
BLOCKS_PER_UNIT = 4  # FSDP2 unit, section 5's setting
GATHER_BYTES = 2  # bf16 parameters all-gathered (blocks)
REDUCE_BYTES = 4  # fp32 gradients reduce-scattered
ROOT_BYTES = 4  # the root unit (embeddings, final norm) stays fp32 both ways

# Measured step times, ms (bench/RESULTS.md): (dense, default)
H100_1P3B = (256.61, 174.02)  # section 2, results/h100_e2e_1.3b_default_bf7909d_e2e.csv
H200_1P3B = (244.31, 162.93)  # section 5, one GPU: results/h200x2_e2e_1.3b_one-ddp-fsdp_73c52fc.csv, engine one
H200X2_FSDP_1P3B = (253.35, 169.52)  # section 5, FSDP2: the same file, engine fsdp
H200X2_FSDP_SPEEDUP = 1.494  # the same file's speedup (from tokens/s)
H100_1P3B_HOST = (115.25, 80.62)  # host ms per step of section 2's 1.3B rows (the time to enqueue a step)


@dataclass(frozen=True)
class Model:
    name: str
    n_layer: int
    d: int
    vocab: int = 256
    seq: int = 2048

    @property
    def block_params(self) -> int:
        """Per block: attention 4d^2 + 4d, FFN 8d^2 + 5d, two LayerNorms 4d."""
        return self.n_layer * (12 * self.d**2 + 13 * self.d)

    @property
    def root_params(self) -> int:
        """Token and position embeddings (the head is tied to the token embedding), final norm."""
        return (self.vocab + self.seq) * self.d + 2 * self.d

    @property
    def params(self) -> int:
        """As bench.e2e reports it (model.num_params(): without the position embedding)."""
        return self.block_params + self.root_params - self.seq * self.d

    @property
    def units(self) -> int:
        return -(-self.n_layer // BLOCKS_PER_UNIT)


M1P3B = Model("1.3B", 24, 2048)
M7B = Model("7B", 32, 4096)


@dataclass(frozen=True)
class Fabric:
    name: str
    gpus: int
    bus_gbps: float  # peak bus bandwidth per GPU per direction, before EFFICIENCY


def one_host(gpus: int) -> Fabric:
    return Fabric(f"{gpus}, one host, NVLink", gpus, NVLINK_GBPS)


def rail_hosts(hosts: int, per_host: int = GPUS_PER_HOST) -> Fabric:
    """Rings across hosts, one per NIC: B = min(G x NIC, NVLink x G / (G - 1))."""
    bus = min(per_host * NIC_GBPS, NVLINK_GBPS * per_host / (per_host - 1))
    return Fabric(f"{hosts * per_host}, {hosts} hosts, IB rails", hosts * per_host, bus)


def flat_nic(hosts: int, per_host: int = GPUS_PER_HOST) -> Fabric:
    """The worst case: every byte of a GPU's share through its own NIC."""
    return Fabric(f"{hosts * per_host}, {hosts} hosts, flat 50 GB/s (worst)", hosts * per_host, NIC_GBPS)


def comm_bytes(model: Model, reshard: bool = False) -> float:
    """Bytes of one step's collectives (the whole collective's size; a GPU moves (N-1)/N of it)."""
    gathers = 2 if reshard else 1
    blocks = model.block_params * (gathers * GATHER_BYTES + REDUCE_BYTES)
    return blocks + model.root_params * 2 * ROOT_BYTES


def comm_ms(nbytes: float, gpus: int, bus_gbps: float, eta: float = EFFICIENCY) -> float:
    """Ring all-gather / reduce-scatter: (N-1)/N of the bytes through each GPU at eta x B."""
    if gpus <= 1:
        return 0.0
    return nbytes * (gpus - 1) / gpus / (eta * bus_gbps * GB) * 1e3


def step_ms(compute: float, comm: float, exposed: float, fixed: float) -> float:
    """Comm hidden behind compute up to the compute time; the exposed part and FSDP2's fixed cost on top."""
    return max(compute + fixed, comm) + exposed


def compute_ms(model: Model, measured: tuple[float, float] = H100_1P3B) -> tuple[float, float]:
    """(dense, sparse) one-GPU step ms: the measured 1.3B step scaled by 6 x params x tokens."""
    scale = (6 * model.params * TOKENS_PER_GPU) / (6 * M1P3B.params * TOKENS_PER_GPU)
    return measured[0] * scale, measured[1] * scale


def fitted_fixed_ms(eta: float = EFFICIENCY) -> float:
    """FSDP2's cost at 2 GPUs beyond the modelled exposed comm, from section 5's 2 x H200 rows (1.3B)."""
    exposed = comm_ms(comm_bytes(M1P3B), 2, NVLINK_GBPS, eta) / M1P3B.units
    extra = [fsdp - one for fsdp, one in zip(H200X2_FSDP_1P3B, H200_1P3B, strict=True)]
    return sum(extra) / len(extra) - exposed


@dataclass(frozen=True)
class Row:
    model: Model
    fabric: Fabric
    compute: tuple[float, float]  # dense, sparse
    comm: float
    exposed: float
    fixed: float

    @property
    def steps(self) -> tuple[float, float]:
        if self.fabric.gpus == 1:
            return self.compute
        dense, sparse = self.compute
        return tuple(step_ms(c, self.comm, self.exposed, self.fixed) for c in (dense, sparse))  # type: ignore[return-value]

    @property
    def speedup(self) -> float:
        return self.steps[0] / self.steps[1]

    @property
    def compute_speedup(self) -> float:
        return self.compute[0] / self.compute[1]

    @property
    def per_gpu(self) -> tuple[float, float]:
        """Each arm's per-GPU throughput against its one-GPU run."""
        return self.compute[0] / self.steps[0], self.compute[1] / self.steps[1]


def project(
    model: Model,
    fabric: Fabric,
    measured: tuple[float, float] = H100_1P3B,
    eta: float = EFFICIENCY,
    reshard: bool = False,
    fixed_1p3b: float | None = None,
) -> Row:
    comm = comm_ms(comm_bytes(model, reshard), fabric.gpus, fabric.bus_gbps, eta)
    fixed = fitted_fixed_ms(eta) if fixed_1p3b is None else fixed_1p3b
    fixed *= model.params / M1P3B.params
    return Row(model, fabric, compute_ms(model, measured), comm, comm / model.units, fixed)


def crossover_gbps(model: Model, gpus: int, compute: float, eta: float = EFFICIENCY, reshard: bool = False) -> float:
    """Peak bus bandwidth per GPU below which one step's comm exceeds ``compute`` ms: B*."""
    return comm_bytes(model, reshard) * (gpus - 1) / gpus / (eta * compute * 1e-3) / GB


def crossover_tokens(model: Model, fabric: Fabric, sparse: bool = True, eta: float = EFFICIENCY) -> float:
    """Tokens per GPU per step below which comm exceeds compute (compute taken linear in tokens)."""
    compute = compute_ms(model)[1 if sparse else 0]
    return TOKENS_PER_GPU * comm_ms(comm_bytes(model), fabric.gpus, fabric.bus_gbps, eta) / compute


def configurations() -> list[tuple[Model, Fabric]]:
    fabrics = [one_host(1), one_host(8), rail_hosts(8), flat_nic(8)]
    return [(m, f) for m in (M1P3B, M7B) for f in fabrics]


def table(eta: float = EFFICIENCY, reshard: bool = False) -> str:
    head = (
        "| model | GPUs | bus GB/s per GPU (peak) | comm ms per step | dense step ms | sparse step ms "
        "| per GPU vs one GPU, dense / sparse | sparse speedup | vs one GPU's |"
    )
    lines = [head, "|" + "---|" * 9]
    for model, fabric in configurations():
        r = project(model, fabric, eta=eta, reshard=reshard)
        one = r.compute_speedup
        bus = "-" if fabric.gpus == 1 else f"{fabric.bus_gbps:.0f}"
        comm = "-" if fabric.gpus == 1 else f"{r.comm:.1f} (+{r.exposed:.1f} exposed)"
        lines.append(
            f"| {model.name} | {fabric.name if fabric.gpus > 1 else '1'} | {bus} | {comm} | {r.steps[0]:.1f} "
            f"| {r.steps[1]:.1f} | {r.per_gpu[0]:.3f} / {r.per_gpu[1]:.3f} | **{r.speedup:.3f}x** "
            f"| {r.speedup / one - 1:+.1%} |"
        )
    return "\n".join(lines)


def calibration(eta: float = EFFICIENCY) -> str:
    """The model at 2 x H200 against section 5's measurement (FIXED_MS is fitted on these rows)."""
    r = project(M1P3B, Fabric("2, one host, NVLink", 2, NVLINK_GBPS), measured=H200_1P3B, eta=eta)
    bare = replace(r, fixed=0.0)
    meas = H200X2_FSDP_1P3B
    m_speedup, one = H200X2_FSDP_SPEEDUP, H200_1P3B[0] / H200_1P3B[1]
    m_per_gpu = tuple(o / f for o, f in zip(H200_1P3B, meas, strict=True))
    return "\n".join(
        [
            "| 1.3B, 2 x H200, FSDP2 | dense step ms | sparse step ms | per GPU vs one GPU, dense / sparse "
            "| sparse speedup |",
            "|---|---|---|---|---|",
            f"| measured (2 x H200; one GPU {one:.3f}x) | {meas[0]:.2f} | {meas[1]:.2f} "
            f"| {m_per_gpu[0]:.3f} / {m_per_gpu[1]:.3f} | {m_speedup:.3f}x |",
            f"| model, comm {r.comm:.1f} ms, exposed {r.exposed:.1f} ms, no fixed cost | {bare.steps[0]:.2f} "
            f"| {bare.steps[1]:.2f} | {bare.per_gpu[0]:.3f} / {bare.per_gpu[1]:.3f} | {bare.speedup:.3f}x |",
            f"| model with the fitted fixed cost {r.fixed:.1f} ms | {r.steps[0]:.2f} | {r.steps[1]:.2f} "
            f"| {r.per_gpu[0]:.3f} / {r.per_gpu[1]:.3f} | {r.speedup:.3f}x |",
        ]
    )


def host_bound_tokens(model: Model, sparse: bool = True) -> float:
    """Tokens per GPU per step below which the measured host time (taken independent of tokens, scaled by the
    layer count) exceeds the GPU compute: the step turns host-bound before any comm limit."""
    host = H100_1P3B_HOST[1 if sparse else 0] * model.n_layer / M1P3B.n_layer
    return TOKENS_PER_GPU * host / compute_ms(model)[1 if sparse else 0]


def crossovers(eta: float = EFFICIENCY) -> str:
    lines = []
    for model in (M1P3B, M7B):
        dense, sparse = compute_ms(model)
        fixed = fitted_fixed_ms(eta) * model.params / M1P3B.params
        b_sparse = crossover_gbps(model, 64, sparse + fixed, eta)
        b_dense = crossover_gbps(model, 64, dense + fixed, eta)
        b_resh = crossover_gbps(model, 64, sparse + fixed, eta, reshard=True)
        t_nvl = crossover_tokens(model, one_host(8), eta=eta)
        t_ib = crossover_tokens(model, rail_hosts(8), eta=eta)
        lines.append(
            f"- {model.name}, 64 GPUs: comm exceeds the sparse step's compute below B* = {b_sparse:.0f} GB/s peak "
            f"per GPU ({b_resh:.0f} with reshard_after_forward), the dense step's below {b_dense:.0f} (both arms "
            f"comm-bound: no gain). At a fixed global batch, below {t_nvl:.0f} (8, NVLink) / {t_ib:.0f} (64, IB "
            f"rails) tokens per GPU per step; host-bound already below {host_bound_tokens(model):.0f} (sparse) / "
            f"{host_bound_tokens(model, sparse=False):.0f} (dense)."
        )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--efficiency", type=float, default=EFFICIENCY, help="achieved fraction of peak link bandwidth")
    p.add_argument("--reshard", action="store_true", help="reshard_after_forward=True: all-gather again in backward")
    args = p.parse_args()
    print(f"FSDP2 projection (on paper), eta = {args.efficiency}, reshard_after_forward = {args.reshard}\n")
    print(table(args.efficiency, args.reshard))
    print()
    print(calibration(args.efficiency))
    print()
    print(crossovers(args.efficiency))


if __name__ == "__main__":
    main()
