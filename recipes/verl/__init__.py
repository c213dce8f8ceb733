"""verl integration: verl 0.9.1's own PPO/GRPO trainer (`RayPPOTrainer.fit`) with arctic-rl as actor, rollout
and reference. See docs/frameworks.md. Importing this package (e.g. through verl's
`VERL_USE_EXTERNAL_MODULES=recipes.verl`) registers the rollout backend name "arctic" in verl's
`RolloutReplicaRegistry`; `python -m recipes.verl.main` is the task runner that wires the worker classes."""

from __future__ import annotations


def register() -> None:
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    def _load():
        from recipes.verl.rollout import ArcticReplica

        return ArcticReplica

    RolloutReplicaRegistry.register("arctic", _load)


try:
    register()
except ImportError:  # verl is not installed: the layout helpers stay importable
    pass
