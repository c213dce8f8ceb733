"""Rollout side of the verl integration, on verl's own plug-in points:

- `ArcticReplica`: the rollout backend "arctic" in `RolloutReplicaRegistry` (`actor_rollout_ref.rollout.name=arctic`).
  It starts no inference server: arctic-rl's samplers belong to the deployment the worker group opened.
- `ArcticAgentLoopManager` (`+actor_rollout_ref.rollout.agent.agent_loop_manager_class=...`): the trainer's
  `generate_sequences`: applies the chat template, samples all n responses of each prompt through arctic-rl in
  one call, and scores them with verl's own reward loop workers (verl's reward manager and
  `compute_score`, or `reward.custom_reward_function`). Returns verl's rollout layout with `rm_scores`.
- `ArcticCheckpointManager` (`+actor_rollout_ref.rollout.checkpoint_manager_class=...`): `update_weights` is
  arctic-rl's `sync_weights` (trainer -> samplers, checked).

Sleep and wake, when the deployment is colocated (arctic_rl.client.sleep.EngineSleep, as the reference loop):
verl's fit calls generate_sequences, then `sleep_replicas` right after it, and `update_weights` before the
next generation (also once after start-up: sleep_replicas, then update_weights(0)). So generate_sequences
puts the trainer and reference to sleep, sleep_replicas puts the sampler to sleep (level 2) and wakes the
trainer (and the reference, when the deployment has one), and update_weights wakes the sampler and syncs.
"""

from __future__ import annotations

import time

import numpy as np
import ray
from verl.workers.rollout.replica import RolloutReplica

from recipes.verl.layout import samples_to_dataproto

_SLEEPERS: dict[str, object] = {}  # job id -> its EngineSleep: the checkpoint and agent loop managers share one


def _sleeper(client):
    from arctic_rl.client.sleep import EngineSleep

    job = client.config.job_id
    if job not in _SLEEPERS:
        _SLEEPERS[job] = EngineSleep(client, client.config.use_reference, enabled=client.config.colocate)
    return _SLEEPERS[job]


def _client_of(actor_wg):
    from arctic_rl import ArcticRLClientConfig, create_arctic_rl_client

    return create_arctic_rl_client(ArcticRLClientConfig.from_json(actor_wg.arctic_config()[0]))


class ArcticReplica(RolloutReplica):
    async def launch_servers(self):
        # The worker process is the handle verl's router records; arctic-rl's samplers serve the requests.
        self._server_handle = self.workers[0] if self.workers else None
        self._server_address = f"arctic-rl-{self.replica_rank}"

    def get_ray_class_with_init_args(self):  # noqa: D102 (no server actors to create)
        raise NotImplementedError("the arctic rollout backend runs inside the arctic-rl deployment")

    # verl reaches a replica's sleep/wake only through its checkpoint manager's sleep_replicas /
    # wake_up_replicas; ArcticCheckpointManager replaces those and sleeps the whole deployment there.
    async def wake_up(self):
        pass

    async def sleep(self):
        pass

    async def clear_kv_cache(self):
        pass


class ArcticCheckpointManager:
    def __init__(self, config=None, actor_wg=None, replicas=None, **kwargs):
        self.actor_wg = actor_wg
        self.replicas = replicas or []
        self.last_sync: dict = {}
        self._engine_sleep = None

    @property
    def engines(self):
        """The deployment's EngineSleep (its client attached on first use: the worker group starts it)."""
        if self._engine_sleep is None:
            self._engine_sleep = _sleeper(_client_of(self.actor_wg))
        return self._engine_sleep

    def update_weights(self, global_steps: int = 0, *args, **kwargs):
        self.engines.before_sync()  # the sampler awake (it may have slept at level 2: the sync below reloads it)
        needs_sync = global_steps > 0 or self.engines.client.health()["sampler_weights_dropped"]
        if not needs_sync:
            return  # before step 1 the samplers already hold the initial weights
        self.last_sync = self.actor_wg.arctic_sync_weights()[0]

    def sleep_replicas(self, *args, **kwargs):
        self.engines.after_gen()

    def wake_up_replicas(self, *args, **kwargs):
        self.engines.before_sync()


class ArcticAgentLoopManager:
    def __init__(self, config, llm_client=None, teacher_client=None, reward_loop_worker_handles=None):
        self.config = config
        self.reward_workers = list(reward_loop_worker_handles or [])
        self._client = None
        self._tokenizer = None

    @classmethod
    def create(cls, config, llm_client=None, teacher_client=None, reward_loop_worker_handles=None, **kwargs):
        return cls(config, llm_client, teacher_client, reward_loop_worker_handles)

    # The client is attached lazily to the deployment the actor worker group started (its job id).
    def attach(self, actor_wg) -> None:
        from arctic_rl import ArcticRLClientConfig, create_arctic_rl_client

        cfg = ArcticRLClientConfig.from_json(actor_wg.arctic_config()[0])
        self._client = create_arctic_rl_client(cfg)
        self._sleep = _sleeper(self._client)

    @property
    def tokenizer(self):
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            m = self.config.actor_rollout_ref.model
            self._tokenizer = AutoTokenizer.from_pretrained(m.get("tokenizer_path") or m.path)
        return self._tokenizer

    def _prompt_ids(self, row_messages) -> list[int]:
        msgs = list(row_messages.tolist() if isinstance(row_messages, np.ndarray) else row_messages)
        text = self.tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def generate_sequences(self, gen_batch):
        if self._client is None:
            raise RuntimeError("ArcticAgentLoopManager is not attached: run through recipes.verl.main")
        rc = self.config.actor_rollout_ref.rollout
        raw = gen_batch.non_tensor_batch["raw_prompt"]
        B = len(raw)
        n = int(rc.n)
        # The trainer repeats each prompt n times, interleaved: sample n per prompt in one request when it did.
        grouped = n > 1 and B % n == 0 and all(list(raw[i]) == list(raw[i - i % n]) for i in range(B))
        heads = list(range(0, B, n)) if grouped else list(range(B))
        prompts = [self._prompt_ids(raw[i]) for i in heads]
        val = bool(gen_batch.meta_info.get("validate", False))
        params = {
            "n": n if grouped else 1,
            "max_tokens": int(rc.response_length),
            "temperature": float(rc.val_kwargs.temperature if val else rc.temperature),
            "top_p": float(rc.val_kwargs.top_p if val else rc.top_p),
        }
        if int(rc.get("top_k", -1) or -1) > 0:
            params["top_k"] = int(rc.top_k)
        step = int(gen_batch.meta_info.get("global_steps", 0))
        params["seed"] = int(self.config.data.get("seed", 1) or 1) * 100003 + step
        t0 = time.perf_counter()
        self._sleep.before_gen()
        samples = self._client.generate(prompts, params)
        gen_s = time.perf_counter() - t0
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        keep = {
            k: v
            for k, v in gen_batch.non_tensor_batch.items()
            if k in ("data_source", "reward_model", "extra_info", "uid", "raw_prompt")
        }
        out = samples_to_dataproto(samples, int(rc.prompt_length), int(rc.response_length), pad, non_tensor=keep)
        t0 = time.perf_counter()
        scores, extra = self._score(out)
        reward_s = time.perf_counter() - t0
        out = samples_to_dataproto(samples, int(rc.prompt_length), int(rc.response_length), pad, scores=scores)
        for k, v in extra.items():
            out.non_tensor_batch[k] = np.array(v, dtype=object)
        mm = np.empty(len(samples), dtype=object)
        mm[:] = [{} for _ in samples]  # verl's agent loop output carries one (here empty) dict per row
        out.non_tensor_batch["multi_modal_inputs"] = mm
        out.meta_info["reward_extra_keys"] = list(extra)
        out.meta_info["timing"] = {"generate_sequences": gen_s, "reward_loop": reward_s}
        return out

    def _score(self, data) -> tuple[list[float], dict[str, list]]:
        """verl's reward: its RewardLoopWorkers (reward manager + compute_score), rows spread over them."""
        if not self.reward_workers:
            raise RuntimeError("no verl reward loop workers were given to the agent loop manager")
        k = len(self.reward_workers)
        chunks = [list(range(i, len(data), k)) for i in range(k)]
        refs = [
            w.compute_score_batch.remote(data.select_idxs(np.array(rows)))
            for w, rows in zip(self.reward_workers, chunks)
            if rows
        ]
        results = ray.get(refs)
        scores = [0.0] * len(data)
        extra: dict[str, list] = {}
        for rows, res in zip([c for c in chunks if c], results):
            for r, item in zip(rows, res):
                scores[r] = float(item["reward_score"])
                for key, val in (item.get("reward_extra_info") or {}).items():
                    extra.setdefault(key, [None] * len(data))[r] = val
        return scores, extra
