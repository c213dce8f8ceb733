"""`ArcticRecipeEnv`: an arctic-rl recipe's reward as a single-turn skyrl-gym environment (env_class "arctic").

Both SkyRL paths score through skyrl-gym environments, so a comparison uses the same reward code:
native SkyRL (its SkyRLGymGenerator makes the env per trajectory) and SkyRL on arctic-rl (ArcticGenerator
does the same). A dataset row's `env_extras` carry `arctic_recipe` and `arctic_example` (recipes/skyrl/data.py);
the reward is `recipes.<arctic_recipe>.reward(assistant_prefix + action, example)`. SkyRL's own envs
(gsm8k, ...) work the same way with their own extras.
"""

from __future__ import annotations

import importlib
import json
from typing import Any

from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput

ENV_ID = "arctic"


class ArcticRecipeEnv(BaseTextEnv):
    def __init__(self, env_config: Any = None, extras: dict[str, Any] | None = None):
        super().__init__()
        extras = extras or {}
        for key in ("arctic_recipe", "arctic_example"):
            if key not in extras:
                raise ValueError(
                    f"env_class {ENV_ID!r} needs the dataset column {key!r} "
                    f"(write the data with recipes.skyrl.data); got {sorted(extras)}"
                )
        self.recipe = importlib.import_module(f"recipes.{extras['arctic_recipe']}")
        ex = extras["arctic_example"]
        self.example = json.loads(ex) if isinstance(ex, str) else dict(ex)
        self.prefix = self.example.get("assistant_prefix", "")

    def step(self, action: str) -> BaseTextEnvStepOutput:
        reward = float(self.recipe.reward(self.prefix + action, self.example))
        return BaseTextEnvStepOutput(observations=[], reward=reward, done=True, metadata={})


def register() -> None:
    """Registers env_class "arctic" in skyrl-gym (idempotent; call it in the process that makes envs)."""
    from skyrl_gym.envs.registration import register as gym_register
    from skyrl_gym.envs.registration import registry

    if ENV_ID not in registry:
        gym_register(id=ENV_ID, entry_point="recipes.skyrl.env:ArcticRecipeEnv")
