"""`ArcticGenerator`: a SkyRL `GeneratorInterface` that samples through arctic-rl and scores with SkyRL's own
skyrl-gym environments (single turn), as SkyRL's SkyRLGymGenerator does.

SkyRL hands the generator one row per sample (`prepare_generator_input` repeats each prompt
`n_samples_per_prompt` times, adjacent). Each run of identical adjacent prompts becomes one prompt of a
request with `n` = the run length, so arctic-rl's sampler sees the group (prefix caching / ZoRRo Inference)
instead of n unrelated prompts. Rewards: `skyrl_gym.make(env_class, env_config=environment.skyrl_gym.<env_class>, extras=row extras)`,
then `env.step(response_text)["reward"]`: SkyRL's gsm8k env on its own data, or env_class "arctic"
(recipes/skyrl/env.py) for any arctic-rl recipe, whose examples may pre-fill the assistant turn
(`assistant_prefix`: appended to the prompt here).
"""

from __future__ import annotations

import asyncio
import json
import zlib
from typing import Any

from skyrl_train.generators.base import GeneratorInput, GeneratorInterface, GeneratorOutput

from arctic_rl.rewards import score_all

# The vLLM sampling keys arctic-rl accepts (arctic_rl/engines/sampling.py); SkyRL's other keys are dropped
# only when unset (None), anything else unknown is refused by the server with its name.
_DROP_IF_NONE = ("stop", "logprobs", "top_k", "min_p")


def sampling_params_from_skyrl(params: dict[str, Any] | None, seed: int) -> dict[str, Any]:
    out = {k: v for k, v in dict(params or {}).items() if not (k in _DROP_IF_NONE and v is None)}
    out.pop("logprobs", None)  # arctic-rl always returns the sampled tokens' log-probs
    if out.get("top_k") == -1:
        out.pop("top_k")
    out.setdefault("seed", seed)
    return out


def _runs(prompts: list) -> list[tuple[int, int]]:
    """(start, length) of each run of equal adjacent prompts."""
    runs: list[tuple[int, int]] = []
    for i, p in enumerate(prompts):
        if runs and prompts[runs[-1][0]] == p:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((i, 1))
    return runs


def env_reward(env_class: str, env_config: dict, extras: dict, text: str) -> float:
    """`env.step(text)["reward"]` of a fresh skyrl-gym env (module level: pool workers call it by name)."""
    import skyrl_gym
    from omegaconf import DictConfig

    from recipes.skyrl.env import register

    register()  # a pool worker is a fresh process: env_class "arctic" is registered there too
    env = skyrl_gym.make(env_class, env_config=DictConfig(env_config), extras=extras)
    try:
        return float(env.step(text)["reward"])
    finally:
        env.close()


class ArcticGenerator(GeneratorInterface):
    def __init__(self, cfg, tokenizer, client):
        from recipes.skyrl.env import register

        register()  # env_class "arctic" in this process (the one that makes the envs)
        self.cfg, self.tokenizer, self.client = cfg, tokenizer, client

    def _env_config(self, env_class: str) -> dict:
        from omegaconf import DictConfig, OmegaConf

        return OmegaConf.to_container(self.cfg.environment.skyrl_gym.get(env_class, DictConfig({})), resolve=True)

    def _prompt_ids(self, messages: list[dict], example: dict) -> list[int]:
        text = self.tokenizer.apply_chat_template(
            list(messages),
            tokenize=False,
            add_generation_prompt=True,
            **dict(self.cfg.generator.get("chat_template_kwargs") or {}),
        )
        return self.tokenizer(text + example.get("assistant_prefix", ""), add_special_tokens=False)["input_ids"]

    async def generate(self, input_batch: GeneratorInput) -> GeneratorOutput:
        prompts = input_batch["prompts"]
        extras = input_batch.get("env_extras") or [{}] * len(prompts)
        meta = input_batch.get("batch_metadata")
        step = getattr(meta, "global_step", 0) if meta is not None else 0
        phase = getattr(meta, "training_phase", "train") if meta is not None else "train"
        # A seed per (run seed, step, phase): reruns sample the same rollouts.
        seed = zlib.crc32(f"{self.cfg.trainer.seed}:{step}:{phase}".encode())
        params = sampling_params_from_skyrl(input_batch.get("sampling_params"), seed)
        examples = [json.loads(e["arctic_example"]) if "arctic_example" in e else {} for e in extras]
        runs = _runs([json.dumps(p, sort_keys=True) for p in prompts])
        # One request per run length (usually one in all: n_samples_per_prompt), n = that length: a run's
        # samples come from one seeded request, so they differ (n=1 requests with one seed would not).
        by_len: dict[int, list[tuple[int, int]]] = {}
        for start, n in runs:
            by_len.setdefault(n, []).append((start, n))
        samples: list[dict] = [{}] * len(prompts)
        for n, group in by_len.items():
            ids = [self._prompt_ids(prompts[start], examples[start]) for start, _ in group]
            out = await asyncio.to_thread(self.client.generate, ids, {**params, "n": n})
            for k, (start, _) in enumerate(group):
                samples[start : start + n] = out[k * n : (k + 1) * n]
        classes = input_batch["env_classes"]
        configs = [self._env_config(c) for c in classes]
        # One skyrl-gym env per sample, scored in a process pool sized by this node's CPUs (arctic_rl.rewards).
        rewards = await asyncio.to_thread(score_all, env_reward, classes, configs, extras, [s["text"] for s in samples])
        responses = [s["token_ids"] for s in samples]
        mean = sum(rewards) / max(1, len(rewards))
        return {
            "prompt_token_ids": [s["prompt_token_ids"] for s in samples],
            "response_ids": responses,
            "rewards": rewards,
            "loss_masks": [[1] * len(r) for r in responses],
            "stop_reasons": [s.get("finish_reason") or "stop" for s in samples],
            "rollout_metrics": {
                "generate/avg_num_tokens": sum(map(len, responses)) / max(1, len(responses)),
                "generate/reward_mean": mean,
            },
            "rollout_logprobs": [s["logprobs"] for s in samples],
            "trajectory_ids": input_batch.get("trajectory_ids"),
            "is_last_step": None,
        }
