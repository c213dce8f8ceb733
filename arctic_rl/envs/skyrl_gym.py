"""SkyRL-gym's environments as arctic-rl environments: `env.name: skyrl_gym`, `env.options.id` the gym's id.

    env:
      name: skyrl_gym
      max_turns: 5
      options:
        id: gsm8k_multi_turn        # any id skyrl_gym.make knows (gsm8k, text2sql, search, ...)
        env_config: {}              # the gym's env_config (SkyRL's environment.skyrl_gym.<id>)
        ground_truth_key: answer    # the example's field that becomes extras.reward_spec.ground_truth

A SkyRL-gym environment is built per conversation with `skyrl_gym.make(id, env_config=..., extras=...)`, where
extras is the example's `env_extras` when it has one (what recipes/skyrl/data.py writes for SkyRL), else
`{"reward_spec": {"method": "rule", "ground_truth": example[ground_truth_key]}, "extra_info": {}}` (the columns a
SkyRL dataset row carries). Each model turn goes to its
`step(action)`; its observations (chat messages) are joined into one observation, and the episode's reward is the
sum of the rewards of its steps: what GRPO in SkyRL scores a trajectory with per-turn rewards (its generator places
each turn's reward on that turn's last token, and the outcome is their sum). The gym's `max_turns` is the
environment's own; `env.max_turns` bounds the conversation on arctic-rl's side.
"""

from __future__ import annotations

from typing import Any

from arctic_rl.envs import Step, register_env


@register_env("skyrl_gym")
class SkyRLGymEnv:
    def __init__(self, id: str, env_config: dict[str, Any] | None = None, ground_truth_key: str = "answer"):
        import skyrl_gym
        import skyrl_gym.envs  # noqa: F401  (registers the gym's own environments)

        if id not in skyrl_gym.envs.registration.registry:
            known = sorted(skyrl_gym.envs.registration.registry)
            raise ValueError(f"env.options.id={id!r} is not a SkyRL-gym environment; known: {known}")
        self.id, self.env_config, self.ground_truth_key = id, dict(env_config or {}), ground_truth_key
        self._make = skyrl_gym.make

    def reset(self, example: dict) -> None:
        from omegaconf import OmegaConf

        extras = example.get("env_extras")
        if extras is None:
            if self.ground_truth_key not in example:
                raise ValueError(
                    f"the example has neither env_extras nor {self.ground_truth_key!r} "
                    f"(env.options.ground_truth_key); its keys: {sorted(example)}"
                )
            truth = example[self.ground_truth_key]
            extras = {"reward_spec": {"method": "rule", "ground_truth": truth}, "extra_info": {}}
        self.env = self._make(self.id, env_config=OmegaConf.create(self.env_config), extras=extras)
        self.env.init(example.get("prompt") or [])
        self.total = 0.0

    def step(self, turn: str) -> Step:
        out = self.env.step(turn)
        self.total += float(out.get("reward") or 0.0)
        if out["done"]:
            self.env.close()
            return Step(done=True, reward=self.total)
        return Step(observation="\n".join(str(m.get("content", "")) for m in out.get("observations") or []))
