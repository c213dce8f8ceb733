"""Environments for multi-turn RL: what answers the model's turns, and the registry that names them.

An environment plays one conversation. `reset(example)` starts it with the recipe's example (the prompt is the
example's messages, rendered by the loop as for a single-turn recipe); `step(turn)` takes the model's turn as
text (decoded for the environment to read; the tokens that train stay the sampler's own) and returns a `Step`:
an observation to show the model as the next message, or done with the episode's reward.

    @register_env("echo")
    class Echo:
        def reset(self, example): self.target = example["answer"]
        def step(self, turn):
            if self.target in turn:
                return Step(done=True, reward=1.0)
            return Step(observation=f"not yet: {turn[:40]}")

A recipe that provides an environment registers it when imported (recipes/<name>/__init__.py) and a run names
it in `env.name`; `make_env(name, options)` builds one per conversation (n per example). Environments run in
the loop's process, one conversation at a time per call, so they hold no locks; one that runs code the model
wrote (SQL) is as hostile to it as the single-turn reward is (recipes/text2sql/sandbox.py), and a child
process it starts for that code gets arctic_rl.child_env.scrubbed_env(). An environment that runs the model's
code without a sandbox takes the keyword `allow_unsandboxed_code` (the run's env.allow_unsandboxed_code, false
by default) and refuses to run that code without it (arctic_rl/envs/skyrl_gym.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from arctic_rl.errors import ConfigError, UnknownNameError


@dataclass(frozen=True)
class Step:
    """An environment's answer to one model turn: an observation for the next turn, or the end of the episode
    (done) with its reward. A reward before done is ignored: the episode's reward comes at the end."""

    observation: str | None = None
    done: bool = False
    reward: float | None = None

    def __post_init__(self):
        if self.done == (self.observation is not None):
            raise ValueError(
                f"Step: exactly one of observation (next turn) and done (end) must be given, got "
                f"observation={self.observation!r:.60}, done={self.done}"
            )
        if self.done and self.reward is None:
            raise ValueError("Step(done=True) needs the episode's reward (a float)")


class Env(Protocol):
    def reset(self, example: dict) -> None: ...

    def step(self, turn: str) -> Step: ...


ENVS: dict[str, Callable[..., Env]] = {}


def register_env(name: str):
    """Registers an environment class (or factory) under `name`; called with the run's env.options."""

    def deco(factory):
        if name in ENVS and ENVS[name] is not factory:
            raise ConfigError(f"environment {name!r} is registered twice ({ENVS[name]!r} and {factory!r})")
        ENVS[name] = factory
        return factory

    return deco


# Environments that come with arctic-rl, imported when first named (their own dependencies load only then).
BUILTIN = {"skyrl_gym": "arctic_rl.envs.skyrl_gym"}


UNSANDBOXED_FLAG = "allow_unsandboxed_code"


def make_env(name: str, options: dict[str, Any] | None = None, *, allow_unsandboxed_code: bool = False) -> Env:
    """A fresh environment `name` built with `options`; an unknown name is refused naming the registered ones.
    `allow_unsandboxed_code` (the run's env.allow_unsandboxed_code) reaches the environments whose factory takes
    that keyword (skyrl_gym: ids that run the model's code); it is never taken from `options`."""
    options = dict(options or {})
    if UNSANDBOXED_FLAG in options:
        raise ConfigError(
            f"env.options.{UNSANDBOXED_FLAG}={options[UNSANDBOXED_FLAG]!r}: the opt-in is env.{UNSANDBOXED_FLAG} "
            f"(a field of env, beside env.options); move it there"
        )
    if name not in ENVS and name in BUILTIN:
        import importlib

        importlib.import_module(BUILTIN[name])
    factory = ENVS.get(name)
    if factory is None:
        raise UnknownNameError(
            f"env.name={name!r} is not a registered environment; registered: {sorted(set(ENVS) | set(BUILTIN))} (a "
            "recipe registers "
            f"its environment when imported: @register_env in recipes/<name>/__init__.py)"
        )
    if UNSANDBOXED_FLAG in _keywords(factory):
        options[UNSANDBOXED_FLAG] = allow_unsandboxed_code
    try:
        return factory(**options)
    except TypeError as e:
        raise ConfigError(f"env.options={options!r} do not fit environment {name!r}: {e}") from None


def _keywords(factory: Callable) -> set[str]:
    import inspect

    try:
        return set(inspect.signature(factory).parameters)
    except (TypeError, ValueError):  # a builtin or C callable without a signature
        return set()
