"""The controller: one detached, named Ray actor per deployment (arctic_rl.ops.controller_name). It owns the
engine actors, validates every request, splits batches over workers and turns engine failures into typed errors.

Both transports end in `dispatch(op, kwargs)`: the Ray client calls it directly, the HTTP server forwards to
it. It binds the arguments against the op's declaration (arctic_rl.ops), runs the request checks
(server/requests.py) and calls the method named after the op. Where the engines go is server/placers.py's
business; whether the samplers hold the trainer's weights, server/weight_check.py's.
Ops on different engines may run at once (generate while training: the async pipeline); ops on the
same engine are serialized by that engine's lock.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
import traceback
from pathlib import Path
from typing import Any

import ray
import torch

from arctic_rl import ops
from arctic_rl.batch import LOG_PROBS_KEYS, TRAIN_KEYS, Batch, select_rows, split_micro_batches, validate_batch
from arctic_rl.config import ArcticRLClientConfig, forget_deployment, sampler_dtype
from arctic_rl.errors import ArcticRLError, ConfigError, EngineDeadError, EngineError, ServerBusyError
from arctic_rl.losses import global_loss_keys, load_loss_modules, resolve_loss_fn
from arctic_rl.server import checkpoint_dirs, placement, startup, weight_check
from arctic_rl.server.placers import make_placer
from arctic_rl.server.requests import ENGINES, check_request, checkpoint_path, save_target
from arctic_rl.server.routing import StickyRouter

PING_TIMEOUT_S = 10.0


class Controller:
    def __init__(self, config_json: str):
        from arctic_rl.engines.sampling import SamplingWorker
        from arctic_rl.engines.training import TrainingWorker

        self.cfg = ArcticRLClientConfig.from_json(config_json)
        cfg = self.cfg
        load_loss_modules(cfg.server.loss_modules)  # before any engine starts: a bad plugin fails fast
        assert cfg.job_id, "deploy() gives the controller a config with its job_id"
        self.job_id: str = cfg.job_id
        self.locks = {e: threading.Lock() for e in ENGINES}
        self.step = 0
        env_vars = {"TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "")}
        env_vars = {k: v for k, v in env_vars.items() if v}
        self.placer = place = make_placer(cfg)
        train_cls, sample_cls = ray.remote(TrainingWorker), ray.remote(SamplingWorker)

        def env(engine: str, index: int, extra: dict | None = None) -> dict:  # after the placer placed it
            return {"env_vars": {**env_vars, **place.env(engine, index), **(extra or {})}}

        self.trainers = []
        for r in range(cfg.training_gpus):
            opts = place.trainer(r)
            actor = train_cls.options(runtime_env=env("training", r), **opts)
            self.trainers.append(actor.remote(cfg.to_json(), r, cfg.training_gpus, True))
        # The reference model: dedicated workers, or one worker sharing the trainer's devices.
        n_ref = placement.num_reference_workers(cfg)
        self.reference = []
        for r in range(n_ref):
            opts = place.reference(r)
            self.reference.append(
                train_cls.options(runtime_env=env("reference", r), **opts).remote(cfg.to_json(), r, n_ref, False)
            )
        self.samplers = []
        for i in range(cfg.num_sampling_replicas):
            opts, tp_env = place.sampler(i)
            self.samplers.append(
                sample_cls.options(runtime_env=env("sampling", i, tp_env), **opts).remote(cfg.to_json(), i)
            )
        self.router = StickyRouter(max(1, cfg.num_sampling_replicas))  # generate's routing_keys
        # Each DeepSpeed group meets at its rank 0's node (ranks may be on different nodes).
        setups = []
        for engine, group in (("training", self.trainers), ("reference", self.reference)):
            if not group:  # no reference deployed (use_reference=False)
                continue
            addr, port = self._get(group[0].rendezvous.remote(), engine, timeout=None)
            setups += [(engine, w.setup.remote(addr, port)) for w in group]
        get_in_completion_order(setups, self._get)
        self.groups = {"training": self.trainers, "reference": self.reference, "sampling": self.samplers}
        self.asleep = {e: False for e in ENGINES}
        # True from a sampler sleep at level 2 (vLLM dropped its weights) until the next sync_weights.
        self.sampler_weights_dropped = False
        # Wait for every engine; an engine that fails to start fails the deployment with its message.
        for engine, actors in self.groups.items():
            self._get([a.ping.remote() for a in actors], engine, timeout=None)
        self.uses_transfer_engine = (
            cfg.vllm_config.weight_sync != "reload"
        )  # vLLM's weight-transfer engine (NCCL or IPC)
        if self.uses_transfer_engine:
            if ray.cluster_resources().get("GPU", 0) == 0:
                raise ConfigError(
                    f"vllm_config.weight_sync={cfg.vllm_config.weight_sync!r} needs GPUs; use 'reload' on CPU"
                )
            port, workers = self._get(self.trainers[0].rendezvous.remote(), "training")[1], cfg.sampling_gpus
            self._get(
                [t.transfer_connect.remote(self.samplers, port, workers) for t in self.trainers],
                "training",
                timeout=None,
            )
        # Token ids a request may carry: below the model's embedding rows.
        self.vocab = self._get(self.trainers[0].vocab_size.remote(), "training")
        self._tokenizer: Any = None  # loaded at the first string prompt (_count_tokens)
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
        return _MultiLock({e: self.locks[e] for e in engines}, self.cfg.request_timeout_s)

    def _sampler_locked(self) -> _MultiLock:
        """For ops that sample with the sampler's weights (not sync_weights, which reloads them)."""
        if self.sampler_weights_dropped:
            raise EngineError(
                "the sampler's weights were dropped by sleep('sampling', level=2): call sync_weights first"
            )
        return self._locked("sampling")

    def _deal(
        self, batch: Batch, num_ranks: int, micro_rows: int
    ) -> tuple[list[list[Batch | None]], list[list[list[int]]]]:
        """Micro-batches (never splitting a prompt group) dealt round-robin to ranks and padded with
        None so every rank runs the same number of passes (ZeRO-3 gathers collectively)."""
        mbs = split_micro_batches(batch, micro_rows)
        per_rank: list[list[Batch | None]] = [[] for _ in range(num_ranks)]
        rows: list[list[list[int]]] = [[] for _ in range(num_ranks)]
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

    def dispatch(self, op: str, kwargs: dict):
        """Runs op `op` (a name in arctic_rl.ops.OPS) with `kwargs`, after binding them against its declaration
        and checking them (a malformed request raises a 4xx error naming the argument); the methods below,
        named after the ops, assume checked arguments."""
        args = ops.lookup(op).bind(kwargs)
        check_request(op, args, self.cfg, self.vocab, self._count_tokens)
        return getattr(self, op)(**args)

    def _count_tokens(self, prompt: str) -> int:
        """A string prompt's length as the sampler will count it (vLLM encodes with the model's tokenizer)."""
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(self.cfg.model_name)
        return len(self._tokenizer.encode(prompt))

    def generate(self, prompts: list, sampling_params: dict, routing_keys: list | None = None) -> list[dict]:
        params = dict(sampling_params or {})
        if routing_keys is not None and len(self.samplers) > 1:
            return self._generate_routed(prompts, params, routing_keys)
        with self._sampler_locked():
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

    def _generate_routed(self, prompts: list, params: dict, keys: list) -> list[dict]:
        """Each prompt on the replica its routing key chose (arctic_rl.server.routing), answers in request order."""
        weights = [len(p) if isinstance(p, list) else len(str(p)) // 4 for p in prompts]
        where = self.router.assign([str(k) for k in keys], weights)
        per = {r: [i for i, w in enumerate(where) if w == r] for r in sorted(set(where))}
        with self._sampler_locked():
            refs = [
                (idx, self.samplers[r].generate.remote([prompts[i] for i in idx], params, idx[0]))
                for r, idx in per.items()
            ]
            outs = self._get([ref for _, ref in refs], "sampling")
        groups: list[list[dict]] = [[] for _ in prompts]
        for (idx, _), part in zip(refs, outs):
            for i, group in zip(idx, part):
                groups[i] = [{**s, "replica": where[i]} for s in group]
        return [s for g in groups for s in g]

    def log_probs(
        self,
        batch: Batch,
        reference: bool = False,
        compute_entropy: bool = False,
        temperature: float = 1.0,
        post_processor: str = "log_probs",
    ) -> dict[str, torch.Tensor]:
        B, P, R = validate_batch(batch, LOG_PROBS_KEYS)
        engine = "reference" if reference else "training"
        actors = self.reference if reference else self.trainers
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
        B, P, R = validate_batch(batch, TRAIN_KEYS)
        cfg = dict(loss_config or {})
        mask = batch["response_mask"]
        try:  # the loss's keys over the whole mini-batch (grpo: rollout_is_batch_mean, counts left by rollout_rs)
            cfg = {**global_loss_keys(loss_fn, batch, cfg), **cfg}
        except (ValueError, KeyError, TypeError) as e:
            raise ConfigError(f"loss {loss_fn!r} rejected the request: {e}") from None
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

    def optimizer_step(self, optim_params: dict | None = None) -> dict[str, float]:
        with self._locked("training"):
            outs = self._get([a.optimizer_step.remote(optim_params) for a in self.trainers], "training")
        self.step += 1
        return {**outs[0], "step": self.step}

    def sync_weights(self) -> dict[str, float]:
        """Trainer -> samplers, streamed in buckets of vllm_config.sync_bucket_mb: by vLLM's weight-transfer
        engine on CUDA ("nccl"/"ipc"), else through the trainers' `stream_weights` (each bucket gathered,
        put in the object store once and loaded by every sampler). This actor only coordinates: no weights
        pass through it. Then the exact check and the log-prob probe."""
        t0 = time.time()
        with self._locked("training", "sampling"):
            if self.uses_transfer_engine:  # trainer -> vLLM workers by NCCL broadcast or CUDA IPC; no host copy
                self._get([a.transfer_send.remote() for a in self.trainers], "training")
                sent = {"gather_s": 0.0, "load_s": time.time() - t0, "buckets": 0}
                check = self._stream(load=False)[1]
            else:
                sent, check = self._stream(load=True)
                self._get([s.reset_prefix_cache.remote() for s in self.samplers], "sampling")
            self.sampler_weights_dropped = False  # loaded again (sleep level 2 dropped them)
            self._get([s.wake_kv_cache.remote() for s in self.samplers], "sampling")
        probe = self._probe_log_prob_diff()
        return {"sync_s": time.time() - t0, **sent, **check, "probe_max_abs_logprob_diff": probe}

    def check_weights(self) -> dict:
        """Whether the samplers hold exactly the trainer's current weights, without syncing (a sampler that
        missed an update fails it): the buckets stream as in a sync, compared and not loaded. sync_weights
        runs the same check while loading."""
        with self._locked("training", "sampling"):
            check = self._stream(load=False)[1]
        return {**check, "probe_max_abs_logprob_diff": self._probe_log_prob_diff()}

    def _stream(self, load: bool) -> tuple[dict[str, float], dict]:
        """Every trainer rank streams its buckets to the samplers (rank 0 sends; ZeRO-3 ranks gather with it);
        returns timings and the samplers' exact comparison, judged by weight_check."""
        outs = self._get([t.stream_weights.remote(self.samplers, load, True) for t in self.trainers], "training")
        out = outs[0]
        timing = {
            "gather_s": out["gather_s"],
            "load_s": max(r["load_s"] for r in out["replicas"]),
            "buckets": out["buckets"],
        }
        return timing, weight_check.verify_replicas(out["replicas"], sampler_dtype(self.cfg))

    def sync_weights_whole_model(self) -> dict[str, float]:
        """The sync before streaming, kept for benchmarks/weight_sync.py to compare against (not an op): the
        whole model gathered into one state dict on trainer rank 0, sent through the object store to every
        sampler, and sent again for the exact check."""
        t0 = time.time()
        with self._locked("training", "sampling"):
            pairs = [a.full_state_and_norms.options(num_returns=2).remote() for a in self.trainers]
            state_ref = pairs[0][0]
            self._get([p[1] for p in pairs], "training")  # every rank took part (ZeRO-3 gathers)
            t_gather = time.time() - t0
            secs = self._get([s.update_weights.remote(state_ref) for s in self.samplers], "sampling")
            results = self._get([s.check_weights.remote(state_ref) for s in self.samplers], "sampling")
            check = weight_check.verify_replicas(results, sampler_dtype(self.cfg))
            self.sampler_weights_dropped = False  # loaded again (sleep level 2 dropped them)
            self._get([s.wake_kv_cache.remote() for s in self.samplers], "sampling")
        probe = self._probe_log_prob_diff()
        return {
            "sync_s": time.time() - t0,
            "gather_s": t_gather,
            "load_s": max(secs),
            **check,
            "probe_max_abs_logprob_diff": probe,
        }

    def _probe_diff(self) -> tuple[float, float]:
        """(max, mean) |log-prob difference| of the probe sequence, trainer against sampler 0. With router replay on,
        the trainer replays the sampler's routing of the probe: a bf16 sampler and an fp32 trainer route some tokens
        of an MoE model to other experts, far beyond the dtype's noise, which a correct sync cannot remove (seen:
        tests/e2e/test_moe.py's R3 deployment failed its probe after one step, the exact check passing)."""
        batch = weight_check.probe_batch()
        seqs, lens = [weight_check.PROBE_SEQ], [weight_check.PROBE_PROMPT_LEN]
        if self.cfg.training_config.router_replay.enable:
            scored = self._get(self.samplers[0].score_routed.remote(seqs, lens), "sampling")
            sampler, routed = scored["log_probs"][0], scored["routed_experts"]
            if routed and routed[0] is not None:  # vLLM may return no record: the trainer routes freely
                batch["routed_experts"] = routed[0].unsqueeze(0)  # [1, T, L, k]
        else:
            sampler = self._get(self.samplers[0].score.remote(seqs, lens), "sampling")[0]
        trainer = self.dispatch("log_probs", {"batch": batch})["log_probs"][0]
        return weight_check.probe_diff(trainer, sampler)

    def _probe_log_prob_diff(self) -> float:
        worst, mean = self._probe_diff()
        dtype = weight_check.probe_dtype(self.cfg.training_config.dtype, sampler_dtype(self.cfg))
        weight_check.verify_probe(worst, mean, self._probe_baseline, dtype)
        return worst

    def sampler_log_probs(self, sequences: list[list[int]], prompt_lens: list[int]) -> list[list[float]]:
        """The sampler's log-probs of given tokens (checks, and vLLM-side log-prob engines)."""
        with self._sampler_locked():
            return self._get(self.samplers[0].score.remote(sequences, prompt_lens), "sampling")

    def update_reference(self) -> dict[str, float]:
        """reference := current policy (for recipes that refresh their KL anchor)."""
        t0 = time.time()
        with self._locked("training", "reference"):
            # Trainer rank 0 streams buckets straight to the reference workers; nothing passes through here.
            self._get([t.stream_to_reference.remote(self.reference) for t in self.trainers], "training")
        return {"update_reference_s": time.time() - t0}

    def sleep(self, engine: str, level: int | None = None) -> dict:
        return self._sleep_wake(engine, True, level)

    def wake(self, engine: str) -> dict:
        return self._sleep_wake(engine, False)

    def _sleep_wake(self, engine: str, sleep: bool, level: int | None = None) -> dict:
        """Every worker of `engine` moves its state off the device (sleep) or back (wake), or leaves it where
        sleep would free nothing (CPU: `no_op`, and `why`). Returns the bytes moved to or from host memory, the
        device memory given back and the seconds. An engine without workers (no reference deployed) only
        records the flag. Asleep, the engine's ops are refused until wake, no-op or not."""
        t0 = time.time()
        actors = self.groups[engine]
        with _MultiLock({engine: self.locks[engine]}, self.cfg.request_timeout_s):
            if engine == "sampling":
                level = level or 1
                refs = [s.sleep.remote(level) if sleep else s.wake.remote() for s in actors]
            else:
                refs = [a.sleep.remote() if sleep else a.wake.remote() for a in actors]
            outs = self._get(refs, engine) if refs else []
            self.asleep[engine] = sleep
            if engine == "sampling" and sleep and level == 2:
                self.sampler_weights_dropped = True
        out = {
            "engine": engine,
            "asleep": sleep,
            "seconds": time.time() - t0,
            "moved_bytes": sum(o.get("moved_bytes", 0) for o in outs),
            **_sleep_summary(outs),
        }
        if sleep:
            out["freed_bytes"] = sum(o.get("freed_bytes", 0) for o in outs)
            if engine != "sampling":
                out["state_bytes"] = sum(o.get("state_bytes", 0) for o in outs)
        if engine == "sampling" and sleep:
            out["level"] = level
        return out

    def state_digests(self, engine: str) -> list[dict[str, str]]:
        """Not an op (checks only: tests, scripts/gpu_check.sh): each worker's sha256 of every parameter
        partition, gradient and optimizer-state tensor, to compare across sleep/wake bit for bit."""
        with self._locked(engine):
            return self._get([a.state_digest.remote() for a in self.groups[engine]], engine)

    def save_checkpoint(self, path: str) -> dict:
        """Writes the checkpoint into a new folder next to `path` and swaps it in once complete
        (server/checkpoint_dirs.py): a save killed midway leaves the previous checkpoint at `path` whole."""
        target = save_target(path, self.cfg)  # under server.checkpoint_root only, and not a folder of other files
        with self._locked("training"):
            staging = checkpoint_dirs.staging_dir(target)
            try:
                self._get([a.save_checkpoint.remote(str(staging)) for a in self.trainers], "training")
                meta = {"step": self.step, "job_id": self.job_id, "config": json.loads(self.cfg.to_json())}
                (staging / checkpoint_dirs.META_FILE).write_text(json.dumps(meta, indent=1))  # last: marks it complete
                checkpoint_dirs.publish(staging, target)
            finally:
                shutil.rmtree(staging, ignore_errors=True)  # a failed save's files (gone once published)
        return {"path": str(target), "step": self.step}

    def load_checkpoint(self, path: str) -> dict:
        target = checkpoint_path(path, self.cfg)  # under server.checkpoint_root only
        meta_path = target / checkpoint_dirs.META_FILE
        with self._locked("training"):
            checkpoint_dirs.recover(target)
            if not meta_path.is_file():
                raise ConfigError(f"not an arctic-rl checkpoint: {meta_path} does not exist")
            try:
                meta = json.loads(meta_path.read_text())
                step = int(meta["step"])
            except (ValueError, KeyError, TypeError) as e:
                raise ConfigError(
                    f"{meta_path}: not a valid arctic-rl checkpoint record ({type(e).__name__}: {e})"
                ) from None
            self._check_same_lora(meta, meta_path)
            self._get([a.load_checkpoint.remote(str(target)) for a in self.trainers], "training")
        self.step = step
        return {"path": str(target), "step": self.step}

    def _check_same_lora(self, meta: dict, meta_path: Path) -> None:
        """A LoRA checkpoint holds adapters only, and a full one no adapters: DeepSpeed would load either into
        the other engine without a word (a LoRA engine loads its module non-strictly), so the configs must
        agree."""
        saved_cfg = meta.get("config")
        saved = ((saved_cfg if isinstance(saved_cfg, dict) else {}).get("training_config") or {}).get("lora")
        lora = self.cfg.training_config.lora
        current = lora.model_dump(mode="json") if lora is not None else None  # as the record holds it
        if saved != current:
            raise ConfigError(
                f"{meta_path}: the checkpoint was saved with training_config.lora={saved}, this deployment "
                f"runs training_config.lora={current}: load it into a deployment with the same LoRA config"
            )

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
        sleep = {
            e: _sleep_summary([v["sleep"] for n, v in engines.items() if n.startswith(f"{e}[") and "sleep" in v])
            for e, actors in self.groups.items()
            if actors
        }
        return {
            "ok": not dead,
            "job_id": self.job_id,
            "step": self.step,
            "dead": dead,
            "engines": engines,
            "asleep": [e for e in ENGINES if self.asleep[e]],
            "sleep": sleep,  # per engine: whether sleep frees its device or is a no-op here, and why
            "sampler_weights_dropped": self.sampler_weights_dropped,
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


def _sleep_summary(infos: list[dict]) -> dict:
    """One engine's {"no_op", "why"} from its workers' (they share a device type; the first one's reason).
    Without an answer from any worker (none deployed, none alive) nothing is claimed."""
    if not infos:
        return {"no_op": None, "why": "no worker to ask: none deployed or none answered"}
    no_op = all(i.get("no_op") for i in infos)
    return {"no_op": no_op, "why": next((i["why"] for i in infos if bool(i.get("no_op")) == no_op), "")}


def get_in_completion_order(tagged: list[tuple[str, ray.ObjectRef]], get) -> list:
    """`get(ref, engine, timeout=None)` of every (engine, ref), in the order they finish: a rank that fails
    while rank 0 waits for it in the process-group rendezvous fails the deployment at once, instead of after
    torch's rendezvous timeout (or never, waiting on rank 0 first)."""
    engine_of = {ref: engine for engine, ref in tagged}
    pending, out = list(engine_of), {}
    while pending:
        done, pending = ray.wait(pending, num_returns=1)
        out[done[0]] = get(done[0], engine_of[done[0]], timeout=None)
    return [out[ref] for _, ref in tagged]


class _MultiLock:
    """The engines' locks, taken in order within `timeout_s` in all: a request waiting behind one that hangs
    gets a ServerBusyError naming the engine instead of waiting forever."""

    def __init__(self, locks: dict[str, threading.Lock], timeout_s: float):
        self.locks, self.timeout_s = locks, timeout_s
        self.held: list[threading.Lock] = []

    def __enter__(self):
        deadline = time.monotonic() + self.timeout_s
        for engine, lock in self.locks.items():
            if not lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
                self.__exit__()
                raise ServerBusyError(
                    f"the {engine} engine is busy: another request held it for over request_timeout_s="
                    f"{self.timeout_s:g}s; nothing ran, send it again later"
                )
            self.held.append(lock)

    def __exit__(self, *exc):
        while self.held:
            self.held.pop().release()


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
