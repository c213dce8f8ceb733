"""Where each engine goes: the placement decision as plain data, no Ray needed to compute it.

The controller turns a `GpuLayout` into Ray placement groups at deploy time (arctic_rl/server/placers.py),
and `arctic-rl plan` (arctic_rl/plan.py) lays the same layout out over nodes before anything is queued, so
the plan and the deployment cannot disagree about which engines share a device.

GPU clusters: placement groups of one-GPU bundles (BUNDLE: one GPU and one CPU each), so which engines share
a device is decided here, not by Ray's packing of fractional GPUs. Colocated: one pool of
max(training, sampling) GPUs; trainer rank i and sampler GPU i share bundle i, and a reference without GPUs
of its own shares the trainer's bundles (rank r in bundle r: all of them under ZeRO-3, else bundle 0). Split: a pool per engine. Every actor takes GPU_SHARE of its bundle's GPU (up to
three per device); a sampler with tensor parallelism sits in its first bundle without a share, and vLLM's
Ray executor puts its TP workers on the replica's bundles (VLLM_RAY_BUNDLE_INDICES).

CPU clusters: cpu_bundle_count STRICT_SPREAD groups of token bundles (one per node each), dealt at deploy time
over the nodes Ray put them on (that part depends on Ray's answer, so it is placers.py's). A token reserves no
core, so cpu_shares says what each engine computes on: its thread count and, with `cpu.split`, which of its
node's cores.
"""

from __future__ import annotations

from dataclasses import dataclass

from arctic_rl.config import ArcticRLClientConfig, CpuConfig
from arctic_rl.errors import ConfigError

GPU_SHARE = 0.3  # of a bundle's GPU per actor: trainer + reference + one sampler (TP worker) fit on one device
BUNDLE = {"GPU": 1, "CPU": 1}
CPU_BUNDLE = {"CPU": 0.01}  # a token: no real reservation on CPU clusters, all engines share the cores


@dataclass(frozen=True)
class Slot:
    """One engine actor: the pool (placement group) and bundle it sits in, and its share of that GPU."""

    engine: str  # "training" | "reference" | "sampling"
    index: int  # rank (training, reference) or replica (sampling)
    pool: str
    bundle: int
    gpu_share: float
    tp_bundles: tuple[int, ...] = ()  # sampling with TP > 1: the bundles its vLLM workers take, GPU_SHARE each
    env: tuple[tuple[str, str], ...] = ()  # extra env vars of the actor

    @property
    def devices(self) -> tuple[int, ...]:
        """The bundles (devices) of this actor's pool whose memory it uses."""
        return self.tp_bundles or (self.bundle,)


@dataclass(frozen=True)
class GpuLayout:
    pools: dict[str, int]  # pool name -> number of one-GPU bundles, in creation order
    trainers: tuple[Slot, ...]
    references: tuple[Slot, ...]
    samplers: tuple[Slot, ...]

    @property
    def slots(self) -> tuple[Slot, ...]:
        return self.trainers + self.references + self.samplers

    @property
    def num_bundles(self) -> int:
        return sum(self.pools.values())


def num_reference_workers(cfg: ArcticRLClientConfig) -> int:
    """Dedicated reference workers; else, sharing the trainer's devices, one per trainer rank under ZeRO-3
    (partitioned like the trainer, rank r beside trainer rank r) and one whole copy otherwise; none when
    the run has no use for a reference (use_reference=False: no KL term)."""
    if not cfg.use_reference:
        return 0
    if cfg.reference_gpus:
        return cfg.reference_gpus
    return cfg.training_gpus if cfg.training_config.zero_stage == 3 else 1


def cpu_bundle_count(cfg: ArcticRLClientConfig) -> int:
    return cfg.training_gpus + num_reference_workers(cfg) + cfg.num_sampling_replicas


def gpu_layout(cfg: ArcticRLClientConfig) -> GpuLayout:
    if cfg.colocate:
        pools = {"shared": max(cfg.training_gpus, cfg.sampling_gpus)}
        train_pool = sample_pool = "shared"
    else:
        pools = {"training": cfg.training_gpus, "sampling": cfg.sampling_gpus}
        train_pool, sample_pool = "training", "sampling"
    ref_pool = train_pool
    if cfg.reference_gpus:
        pools["reference"] = cfg.reference_gpus
        ref_pool = "reference"
    trainers = tuple(Slot("training", r, train_pool, r, GPU_SHARE) for r in range(cfg.training_gpus))
    refs = tuple(Slot("reference", r, ref_pool, r, GPU_SHARE) for r in range(num_reference_workers(cfg)))
    tp = cfg.vllm_config.tensor_parallel_size
    samplers = []
    for i in range(cfg.num_sampling_replicas):
        first = i * tp
        if tp == 1:
            samplers.append(Slot("sampling", i, sample_pool, first, GPU_SHARE))
            continue
        # TP > 1: this actor only drives vLLM; its TP workers hold the GPU shares. Taking none here keeps
        # bundle 0 at trainer + reference + TP worker; the NOSET flag keeps the node's GPUs visible, so
        # this process still sees CUDA (Ray would blank CUDA_VISIBLE_DEVICES).
        bundles = tuple(range(first, first + tp))
        env = (
            ("VLLM_RAY_BUNDLE_INDICES", ",".join(map(str, bundles))),
            ("VLLM_RAY_PER_WORKER_GPUS", str(GPU_SHARE)),
            ("RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES", "1"),
        )
        samplers.append(Slot("sampling", i, sample_pool, first, 0.0, bundles, env))
    return GpuLayout(pools, trainers, refs, tuple(samplers))


@dataclass(frozen=True)
class CpuShare:
    """What one engine actor computes on, on a CPU node: `threads` (its OMP_NUM_THREADS and torch's intra-op
    threads) and, when pinned, the slice [start, stop) of the node's cores in ascending order (None: not pinned)."""

    threads: int
    cores: tuple[int, int] | None = None


def cpu_shares(node_cpus: float, cpu: CpuConfig) -> dict[str, CpuShare]:
    """Each engine's share of a node with `node_cpus` cores (Ray's CPU count of the node). Not split: every engine
    may use every core; the sync loop runs one engine at a time, so the one computing has the whole node. Split
    (async: the sampler generates while the trainer trains): the sampler pinned to the first `sampler_cores`
    cores, the trainer and the reference model (which computes when the trainer does not) to the rest, so neither
    steals the other's cores. `cpu.threads` caps every count. A one-core node cannot be split: shared."""
    n = max(1, int(node_cpus))
    if not cpu.split or n < 2:
        t = min(n, cpu.threads or n)
        return {e: CpuShare(t) for e in ("training", "reference", "sampling")}
    k = cpu.sampler_cores or max(1, n // 2)
    if k >= n:
        raise ConfigError(
            f"cpu.sampler_cores={k} leaves no core for the trainer on a node with {n} CPUs: "
            f"set it below {n}, or cpu.split=false"
        )
    sampling = CpuShare(min(k, cpu.threads or k), (0, k))
    training = CpuShare(min(n - k, cpu.threads or n - k), (k, n))
    return {"training": training, "reference": training, "sampling": sampling}
