"""verl's PPO/GRPO trainer with arctic-rl as actor, rollout and reference: a custom task runner for verl 0.9.1.

    python -m recipes.verl.main <verl overrides ...>     # same Hydra config and overrides as verl.trainer.main_ppo

It is verl's `main_ppo` with one difference in the role -> worker wiring: `Role.ActorRollout[Ref]` is
`ArcticActorRolloutRefWorker` (one process, no GPU of its own: arctic-rl places its engines), and the rollout /
weight-sync plug-ins point at arctic-rl (recipes/verl/rollout.py). Then verl's own `RayPPOTrainer.init_workers()`
and `fit()` run unchanged: verl's data loader, reward loop, advantage estimator, KL, metrics and logger.

MLflow: verl's logger opens the run (`trainer.project_name` is the experiment); the task runner adds the tags
`arctic-rl compare` groups by (framework=verl, backend=arctic-rl, recipe, model), and where arctic-rl's engines
run (`engine_hosts`, `placement`, as the reference loop's runs have them), through MLflow's own
`MLFLOW_RUN_CONTEXT` (a JSON dict of tags `mlflow.start_run` applies). Tags already in `MLFLOW_RUN_CONTEXT`
win; recipe defaults to `ARCTIC_RL_RECIPE`, else `trainer.project_name`.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import hydra
import ray
import verl
from omegaconf import OmegaConf, open_dict
from verl.trainer.main_ppo_v0 import BaseTaskRunner

import recipes.verl  # noqa: F401  registers the "arctic" rollout backend

VERL_CONFIG_DIR = str(Path(verl.__file__).parent / "trainer" / "config")
ARCTIC_DEFAULTS = {
    "actor_rollout_ref.rollout.name": "arctic",
    "actor_rollout_ref.rollout.agent.agent_loop_manager_class": "recipes.verl.rollout.ArcticAgentLoopManager",
    "actor_rollout_ref.rollout.checkpoint_manager_class": "recipes.verl.rollout.ArcticCheckpointManager",
}


def apply_arctic_defaults(config) -> None:
    with open_dict(config):
        for key, val in ARCTIC_DEFAULTS.items():
            OmegaConf.update(config, key, val, force_add=True)
        # The verl worker group is one CPU process; arctic-rl's deployment owns the accelerators.
        config.trainer.balance_batch = False
        # The server writes and reads checkpoints under verl's checkpoint folder only.
        key = "actor_rollout_ref.arctic.server.checkpoint_root"
        if OmegaConf.select(config, key) is None:
            OmegaConf.update(config, key, os.path.abspath(str(config.trainer.default_local_dir)), force_add=True)
        # The launcher's tag variables (nodes, GPUs, recipe, Slurm job id) are in this driver's environment only;
        # the TaskRunner that opens the MLflow run is a Ray actor, whose environment is its raylet's. verl's
        # ray_init runtime_env carries them to every actor of the job.
        from arctic_rl.tracking import ENV_DEFAULT_TAGS

        for var in ENV_DEFAULT_TAGS:
            if os.environ.get(var):
                OmegaConf.update(
                    config, f"ray_kwargs.ray_init.runtime_env.env_vars.{var}", os.environ[var], force_add=True
                )


def set_mlflow_run_context(config, backend: str = "arctic-rl", placement: dict | None = None) -> dict[str, str]:
    """The standard run tags (arctic_rl.tracking) for a verl run, put where verl's MLflow logger applies them;
    `placement`: arctic_rl.tracking.placement_tags of the deployment (where its engines run). The GPU count is
    arctic-rl's deployment's (verl's trainer.nnodes x n_gpus_per_node sizes its one-process client group here),
    unless a job launcher set it (ARCTIC_RL_GPUS)."""
    from arctic_rl.tracking import ENV_DEFAULT_TAGS, FRAMEWORK_VERL, TAG_GPUS, set_run_context
    from recipes.verl.worker import client_config_from_verl

    extra = dict(placement or {})
    gpus_env = next(env for env, tag in ENV_DEFAULT_TAGS.items() if tag == TAG_GPUS)
    if not os.environ.get(gpus_env):
        extra[TAG_GPUS] = str(client_config_from_verl(config.actor_rollout_ref).gpu_count)
    return set_run_context(
        FRAMEWORK_VERL, backend, str(config.trainer.project_name), str(config.actor_rollout_ref.model.path), extra
    )


class ArcticResourcePoolManager:
    """verl's ResourcePoolManager, with CPU bundles: the worker is a client, its engines are arctic-rl's."""

    @staticmethod
    def build(spec, mapping):
        from verl.single_controller.ray import RayResourcePool
        from verl.trainer.ppo.ray_trainer import ResourcePoolManager

        class _Mgr(ResourcePoolManager):
            def create_resource_pool(self):
                for name, procs in self.resource_pool_spec.items():
                    # One CPU per bundle: the worker is one client process (verl's default asks for
                    # max_colocate_count CPUs, 3, more than a small node of a job's Ray cluster may have).
                    self.resource_pool_dict[name] = RayResourcePool(
                        process_on_nodes=procs, use_gpu=False, max_colocate_count=1, name_prefix=name
                    )

        return _Mgr(resource_pool_spec=spec, mapping=mapping)


class _ArcticTaskRunner(BaseTaskRunner):
    def add_actor_rollout_worker(self, config):
        from verl.single_controller.ray import RayWorkerGroup
        from verl.trainer.ppo.ray_trainer import Role
        from verl.trainer.ppo.utils import need_reference_policy

        from recipes.verl.worker import ArcticActorRolloutRefWorker

        role = Role.ActorRolloutRef if need_reference_policy(config) else Role.ActorRollout
        self.role_worker_mapping[role] = ray.remote(ArcticActorRolloutRefWorker)
        self.mapping[role] = "global_pool"
        return ArcticActorRolloutRefWorker, RayWorkerGroup

    def init_resource_pool_mgr(self, config):
        return ArcticResourcePoolManager.build({"global_pool": [1]}, self.mapping)

    def run(self, config):
        from verl.trainer.ppo.ray_trainer import RayPPOTrainer
        from verl.trainer.ppo.utils import create_rl_dataset, create_rl_sampler
        from verl.utils.config import omega_conf_to_dataclass
        from verl.utils.dataset.rl_dataset import collate_fn
        from verl.workers.config import HFModelConfig

        print(f"arctic-rl verl TaskRunner on {socket.gethostname()} pid {os.getpid()}", flush=True)
        OmegaConf.resolve(config)
        _, wg_cls = self.add_actor_rollout_worker(config)
        model_config: HFModelConfig = omega_conf_to_dataclass(config.actor_rollout_ref.model)
        tokenizer, processor = model_config.tokenizer, model_config.processor
        train = create_rl_dataset(
            config.data.train_files,
            config.data,
            tokenizer,
            processor,
            is_train=True,
            max_samples=config.data.get("train_max_samples", -1),
        )
        val = create_rl_dataset(
            config.data.val_files,
            config.data,
            tokenizer,
            processor,
            is_train=False,
            max_samples=config.data.get("val_max_samples", -1),
        )
        trainer = RayPPOTrainer(
            config=config,
            tokenizer=tokenizer,
            processor=processor,
            role_worker_mapping=self.role_worker_mapping,
            resource_pool_manager=self.init_resource_pool_mgr(config),
            ray_worker_group_cls=wg_cls,
            train_dataset=train,
            val_dataset=val,
            collate_fn=collate_fn,
            train_sampler=create_rl_sampler(config.data, train),
        )
        trainer.init_workers()
        trainer.async_rollout_manager.attach(trainer.actor_rollout_wg)
        # The logger is opened in fit(), in this process; the engines' hosts come from the worker's deployment.
        set_mlflow_run_context(config, placement=trainer.actor_rollout_wg.arctic_placement()[0])
        try:
            trainer.fit()
        finally:
            trainer.actor_rollout_wg.arctic_shutdown()


ArcticTaskRunner = ray.remote(num_cpus=0)(_ArcticTaskRunner)


def run(config) -> None:
    from verl.trainer.main_ppo import run_ppo
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    apply_arctic_defaults(config)
    validate_config(config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    run_ppo(config, task_runner_class=ArcticTaskRunner)


@hydra.main(config_path=VERL_CONFIG_DIR, config_name="ppo_trainer", version_base=None)
def main(config):
    run(config)


if __name__ == "__main__":
    main()
