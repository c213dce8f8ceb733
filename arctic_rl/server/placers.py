"""Ray placement of a deployment's engine actors: the layout of arctic_rl.server.placement (plain data)
made into Ray placement groups, and the Ray options each trainer, reference worker and sampler replica is
started with. The controller asks `make_placer` for one at start-up and releases it at shutdown."""

from __future__ import annotations

import time

import ray

from arctic_rl.config import ArcticRLClientConfig
from arctic_rl.engines.cpu_share import share_env
from arctic_rl.errors import ConfigError
from arctic_rl.server import placement


def make_placer(cfg: ArcticRLClientConfig) -> CpuPlacer | GpuPlacer:
    """GPU placement where the Ray cluster has GPUs, else CPU tokens."""
    return (GpuPlacer if ray.cluster_resources().get("GPU", 0) > 0 else CpuPlacer)(cfg)


class CpuPlacer:
    """CPU clusters: token bundles (0.01 CPU: no real reservation, all
    engines share the cores; what each computes on is its `placement.cpu_shares` share, in its environment). Each engine's workers are dealt over the nodes: trainer rank r and sampler
    replica r go to node r mod N, so a multi-node CPU cluster runs trainer ranks and sampler replicas on every
    node. The tokens come from STRICT_SPREAD groups (one token per node each, as many groups as engines), so
    every node holds a token for any engine dealt to it; the GCS places bundles from its own view of the
    cluster, and an actor's lease then follows its bundle. (Ray's SPREAD is best effort: with 10 tokens over 2
    nodes it left one node a single token. Soft node affinity is decided from the local raylet's view, which in
    CI had not yet seen a node that had just joined, and packed every engine on one node.)
    With `cpu.nodes` (a job's node count) the tokens span exactly that many nodes: placement waits for them
    and refuses to start on fewer, rather than packing a multi-node job onto the nodes that happen to be up."""

    def __init__(self, cfg: ArcticRLClientConfig):
        from ray.util.placement_group import placement_group, placement_group_table

        n = placement.cpu_bundle_count(cfg)
        num_nodes = wait_for_cpu_nodes(cfg.cpu.nodes)
        self.pgs = [
            placement_group([dict(placement.CPU_BUNDLE)] * num_nodes, strategy="STRICT_SPREAD") for _ in range(n)
        ]
        for pg in self.pgs:
            if not pg.wait(timeout_seconds=300):
                raise ConfigError(
                    f"Ray could not place engine tokens on {num_nodes} node(s) in 300 s "
                    f"(cluster: {ray.cluster_resources()})"
                )
        by_node: dict[str, list[tuple]] = {}
        for pg in self.pgs:
            for b, node in sorted(placement_group_table(pg)["bundles_to_node_id"].items()):
                by_node.setdefault(node, []).append((pg, b))
        if len(by_node) != num_nodes:  # STRICT_SPREAD promises one bundle per node; say so if Ray did not
            raise ConfigError(f"Ray put the engine tokens on {len(by_node)} node(s), not {num_nodes}: {cpu_nodes()}")
        self.queues = [by_node[k] for k in sorted(by_node)]
        self.nodes = sorted(by_node)
        print(f"[arctic-rl] engines dealt over {num_nodes} node(s): {cpu_nodes()}", flush=True)
        cpus = {node["NodeID"]: node["Resources"].get("CPU", 1) for node in ray.nodes() if node["Alive"]}
        self.shares = {node: placement.cpu_shares(cpus.get(node, 1), cfg.cpu) for node in self.nodes}
        self.envs: dict[tuple[str, int], dict[str, str]] = {}
        self.num_trainers = cfg.training_gpus

    def _take(self, slot: int, engine: str, index: int) -> dict:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        n = len(self.queues)
        q = next((slot + k) % n for k in range(n) if self.queues[(slot + k) % n])
        pg, bundle = self.queues[q].pop(0)
        share = self.shares[self.nodes[q]][engine]
        self.envs[(engine, index)] = share_env(share.threads, share.cores)
        return {
            "num_cpus": 0,
            "scheduling_strategy": PlacementGroupSchedulingStrategy(
                placement_group=pg, placement_group_bundle_index=bundle
            ),
        }

    def trainer(self, rank: int) -> dict:
        return self._take(rank, "training", rank)

    def reference(self, rank: int) -> dict:
        return self._take(self.num_trainers + rank, "reference", rank)

    def sampler(self, replica: int) -> tuple[dict, dict]:
        return self._take(replica, "sampling", replica), {}

    def env(self, engine: str, index: int) -> dict[str, str]:
        """The actor environment of an engine placed before: its share of its node's cores."""
        return self.envs[(engine, index)]

    def release(self) -> None:
        from ray.util.placement_group import remove_placement_group

        for pg in self.pgs:
            remove_placement_group(pg)


NODE_WAIT_S = 120.0


def cpu_nodes() -> dict[str, str]:
    """{node id: host} of the alive Ray nodes that have CPUs."""
    return {
        node["NodeID"]: node.get("NodeManagerHostname", "?")
        for node in ray.nodes()
        if node["Alive"] and node["Resources"].get("CPU", 0) > 0
    }


def wait_for_cpu_nodes(expected: int | None, timeout_s: float = NODE_WAIT_S) -> int:
    """The number of nodes to deal engines over: `expected` once that many nodes with CPUs are alive (polled,
    a ConfigError naming the ones seen after timeout_s), or with None the alive ones now (at least one)."""
    deadline = time.monotonic() + timeout_s
    while True:
        seen = cpu_nodes()
        if expected is None:
            return max(1, len(seen))
        if len(seen) >= expected:
            return expected
        if time.monotonic() > deadline:
            raise ConfigError(
                f"cpu.nodes={expected}: only {len(seen)} Ray node(s) with CPUs alive after {timeout_s:.0f} s "
                f"({', '.join(sorted(seen.values())) or 'none'}); start the missing nodes, or set cpu.nodes to "
                "the nodes this cluster has"
            )
        time.sleep(1.0)


class GpuPlacer:
    """GPU clusters: the layout of arctic_rl.server.placement (which engines share which one-GPU bundle,
    the same one `arctic-rl plan` prints), made into one Ray placement group per pool. Not run with
    TP > 1 here (no GPUs)."""

    FRAC = placement.GPU_SHARE

    def __init__(self, cfg: ArcticRLClientConfig):
        self.layout = placement.gpu_layout(cfg)
        self.pgs = {name: self._pool(n) for name, n in self.layout.pools.items()}

    @staticmethod
    def _pool(n: int):
        from ray.util.placement_group import placement_group

        pg = placement_group([dict(placement.BUNDLE)] * n, strategy="PACK")
        if not pg.wait(timeout_seconds=300):
            raise ConfigError(f"Ray could not reserve {n} GPU bundles in 300 s (cluster: {ray.cluster_resources()})")
        return pg

    def _opts(self, slot: placement.Slot) -> dict:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        return {
            "num_gpus": slot.gpu_share,
            "num_cpus": 0,
            "scheduling_strategy": PlacementGroupSchedulingStrategy(
                placement_group=self.pgs[slot.pool],
                placement_group_bundle_index=slot.bundle,
                placement_group_capture_child_tasks=True,
            ),
        }

    def trainer(self, rank: int) -> dict:
        return self._opts(self.layout.trainers[rank])

    def reference(self, rank: int) -> dict:
        return self._opts(self.layout.references[rank])

    def sampler(self, replica: int) -> tuple[dict, dict]:
        slot = self.layout.samplers[replica]
        return self._opts(slot), dict(slot.env)

    def env(self, engine: str, index: int) -> dict[str, str]:
        return {}  # GPU engines: Ray's CPU threads (OMP_NUM_THREADS of the deployment, else 1)

    def release(self) -> None:
        from ray.util.placement_group import remove_placement_group

        for pg in self.pgs.values():
            remove_placement_group(pg)
