"""SkyRL-gym's environments as arctic-rl environments: `env.name: skyrl_gym`, `env.options.id` the gym's id.

    env:
      name: skyrl_gym
      max_turns: 5
      options:
        id: gsm8k_multi_turn        # one of SAFE_IDS; any other id skyrl_gym.make knows needs the flag below
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

Which ids run. A gym environment runs in the loop's own process, which holds the Ray and arctic-rl tokens, the
client and the user's files. SAFE_IDS score the model's text with regular expressions (aime, gsm8k,
gsm8k_multi_turn) or send it as a query to the retrieval server `env_config.search_url` names (search). Every
other id is refused unless the run says `env.allow_unsandboxed_code: true` (RunConfig's EnvConfig): `searchcode`
runs the model's Python with `python -c` as the user, `lcb` runs it with `exec` in a process forked from the loop,
gym's `text2sql` runs the model's SQL on a read-write connection to the database (`ATTACH` creates files, a
`PRAGMA` changes it), and an id registered from elsewhere is code nobody here has read. The recipe's own
`env.name: text2sql` runs SQL in its sandbox instead. With the flag, the Python tool's child starts with
arctic_rl.child_env.scrubbed_env() (no tokens, keys or MLflow URI in its environment); that is not a sandbox.
"""

from __future__ import annotations

import subprocess
from typing import Any

from arctic_rl.child_env import scrubbed_env
from arctic_rl.envs import Step, register_env
from arctic_rl.errors import ConfigError

# Ids that run none of the model's text as code (reviewed in skyrl_gym 0.3.0).
SAFE_IDS = ("aime", "gsm8k", "gsm8k_multi_turn", "search")
# What the others do with the model's text, for the refusal.
UNSAFE_BECAUSE = {
    "searchcode": "runs the model's Python with `python -c` as this user",
    "lcb": "runs the model's Python with `exec` in a process forked from the loop",
    "text2sql": "runs the model's SQL on a read-write connection to the database file",
}


def check_id(id: Any, allow_unsandboxed_code: bool, known: bool = True) -> None:
    """Refuses a gym id that runs the model's text as code (or that nobody here has reviewed) unless
    `env.allow_unsandboxed_code` is true. With `known`, an id the gym's registry lacks is refused first, naming the
    registered ones (the run config checks without it: a recipe may register its own ids only when imported)."""
    if id in SAFE_IDS:
        return
    if known:
        import skyrl_gym.envs  # registers the gym's own environments

        registry = skyrl_gym.envs.registration.registry
        if id not in registry:
            raise ConfigError(f"env.options.id={id!r} is not a SkyRL-gym environment; known: {sorted(registry)}")
    if allow_unsandboxed_code:
        return
    why = UNSAFE_BECAUSE.get(id, "is not among the ids reviewed as running none of the model's text as code")
    raise ConfigError(
        f"env.options.id={id!r} {why}; a gym environment runs in the loop's process (and its children) with no "
        f"sandbox, so this id is refused while env.allow_unsandboxed_code is false. Fix: use an id that runs no "
        f"code ({', '.join(SAFE_IDS)}) or a sandboxed environment (env.name: text2sql with recipe.name: text2sql "
        "for SQL), or set env.allow_unsandboxed_code: true if you would let the model run code as this user on "
        "this machine (docs/security.md)"
    )


def _python_tool(code: str, timeout: float) -> str:
    """skyrl_gym's Python tool (tools/python.py), its child started with a scrubbed environment."""
    try:
        result = subprocess.run(
            ["python", "-c", code], capture_output=True, timeout=timeout, text=True, env=scrubbed_env()
        )
    except subprocess.TimeoutExpired:
        return f"Error executing Python code: Execution timed out after {timeout} seconds."
    if result.stderr:
        return f"Error executing Python code: {result.stderr.strip()}"
    return result.stdout.strip() if result.stdout else ""


def _scrub_tools(env: Any) -> None:
    """Points the gym environment's Python tools at _python_tool (same behaviour, no secrets in the child)."""
    from skyrl_gym.tools import PythonCodeExecutorToolGroup

    for group in getattr(env, "tool_groups", None) or []:
        if isinstance(group, PythonCodeExecutorToolGroup):
            group._tool_registry["python"] = lambda code, t=group.timeout: _python_tool(code, t)


@register_env("skyrl_gym")
class SkyRLGymEnv:
    def __init__(
        self,
        id: str,
        env_config: dict[str, Any] | None = None,
        ground_truth_key: str = "answer",
        *,
        allow_unsandboxed_code: bool = False,
    ):
        import skyrl_gym

        check_id(id, allow_unsandboxed_code)
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
        _scrub_tools(self.env)
        self.env.init(example.get("prompt") or [])
        self.total = 0.0

    def step(self, turn: str) -> Step:
        out = self.env.step(turn)
        self.total += float(out.get("reward") or 0.0)
        if out["done"]:
            self.env.close()
            return Step(done=True, reward=self.total)
        return Step(observation="\n".join(str(m.get("content", "")) for m in out.get("observations") or []))
