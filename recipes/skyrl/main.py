"""SkyRL's PPO/GRPO trainer with arctic-rl as policy, reference and sampler: a SkyRL entrypoint (skyrl-train 0.3.1).

    .venv-skyrl/bin/python -m recipes.skyrl.main <SkyRL overrides ...>   # SkyRL's Hydra config (ppo_base_config)

This is SkyRL's documented extension point - a `BasePPOExp` subclass run by a `main` like
`skyrl_train.entrypoints.main_base.main` - with three differences in `_setup_trainer`:
  - no SkyRL inference engines or worker groups: an arctic-rl client (config from SkyRL's, `+trainer.arctic.*`
    on top) whose deployment places the DeepSpeed trainer, reference and vLLM samplers itself;
  - the generator is `ArcticGenerator` (samples through arctic-rl, scores with an arctic-rl recipe);
  - the trainer is `ArcticPPOTrainer` (SkyRL's `RayPPOTrainer.train()` unmodified, worker calls -> client ops).
SkyRL runs in its own environment (.venv-skyrl: Python 3.12, Ray 2.51); the arctic-rl server runs in .venv,
reached over HTTP (`+trainer.arctic.comm_protocol=http +trainer.arctic.server_python=.venv/bin/python`, the
defaults here). MLflow: SkyRL's own logger (`trainer.logger=[console,mlflow]`) with the `compare` tags
framework=skyrl, backend=arctic-rl, recipe (ARCTIC_RL_RECIPE, else trainer.project_name), model.
"""

from __future__ import annotations

import os
from pathlib import Path

import hydra
import ray
from omegaconf import DictConfig, OmegaConf, open_dict
from skyrl_train.dataset import PromptDataset
from skyrl_train.entrypoints.main_base import BasePPOExp, config_dir
from skyrl_train.utils import validate_cfg
from skyrl_train.utils.utils import initialize_ray

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_SERVER_PYTHON = ROOT / ".venv" / "bin" / "python"


def apply_arctic_defaults(cfg: DictConfig) -> None:
    """HTTP to an arctic-rl server in the main environment, unless `trainer.arctic` says otherwise."""
    with open_dict(cfg):
        arctic = cfg.trainer.get("arctic", None) or OmegaConf.create({})
        arctic.setdefault("comm_protocol", "http")
        if arctic.comm_protocol == "http" and DEFAULT_SERVER_PYTHON.exists():
            arctic.setdefault("server_python", str(DEFAULT_SERVER_PYTHON))
        cfg.trainer.arctic = arctic
        # SkyRL's placement groups and flash-attn checks are for its own workers; arctic-rl places its engines.
        cfg.trainer.flash_attn = False


class ArcticPPOExp(BasePPOExp):
    def get_colocate_pg(self, timeout: int = 0):
        return None  # no SkyRL workers to place

    def get_train_dataset(self):
        return self._dataset(self.cfg.data.train_data)

    def get_eval_dataset(self):
        if self.cfg.trainer.eval_interval > 0 and self.cfg.data.val_data:
            return self._dataset(self.cfg.data.val_data)
        return None

    def _dataset(self, files) -> PromptDataset:
        # SkyRL tokenizes with 8 processes; a small machine gets one per core.
        return PromptDataset(
            datasets=files,
            tokenizer=self.tokenizer,
            max_prompt_length=self.cfg.trainer.max_prompt_length,
            num_workers=max(1, min(8, os.cpu_count() or 1)),
        )

    def _setup_trainer(self):
        from arctic_rl import create_arctic_rl_client
        from arctic_rl.tracking import BACKEND_ARCTIC, FRAMEWORK_SKYRL, placement_tags, set_run_context
        from recipes.skyrl.generator import ArcticGenerator
        from recipes.skyrl.trainer import ArcticPPOTrainer, client_config_from_skyrl

        os.makedirs(self.cfg.trainer.export_path, exist_ok=True)
        os.makedirs(self.cfg.trainer.ckpt_path, exist_ok=True)
        client_config = client_config_from_skyrl(self.cfg)  # config errors before anything starts
        self.client = create_arctic_rl_client(client_config)
        placement = placement_tags(self.client.health())
        print(f"[arctic-rl] placement: {placement['placement']}", flush=True)
        # Before SkyRL's tracker opens the MLflow run: the run records where the engines run, too.
        set_run_context(
            FRAMEWORK_SKYRL,
            BACKEND_ARCTIC,
            str(self.cfg.trainer.project_name),
            str(self.cfg.trainer.policy.model.path),
            placement,
        )
        tracker = self.get_tracker()
        generator = ArcticGenerator(self.cfg, self.tokenizer, self.client)
        trainer = ArcticPPOTrainer(
            cfg=self.cfg,
            tracker=tracker,
            tokenizer=self.tokenizer,
            train_dataset=self.train_dataset,
            eval_dataset=self.eval_dataset,
            inference_engine_client=None,
            generator=generator,
            colocate_pg=None,
        )
        trainer.attach(self.client)
        trainer.build_models()
        return trainer

    def run(self):
        trainer = self._setup_trainer()
        try:
            trainer.train()
        finally:
            # SkyRL's Tracking ends its backends' runs in __del__ (mlflow.end_run, ...); called here so the
            # MLflow run is FINISHED before the process exits, not whenever the object is collected.
            trainer.tracker.__del__()
            self.client.shutdown()


@ray.remote(num_cpus=1)
def arctic_skyrl_entrypoint(cfg: DictConfig):
    ArcticPPOExp(cfg).run()


@hydra.main(config_path=config_dir, config_name="ppo_base_config", version_base=None)
def main(cfg: DictConfig) -> None:
    apply_arctic_defaults(cfg)
    validate_cfg(cfg)
    initialize_ray(cfg)
    ray.get(arctic_skyrl_entrypoint.remote(cfg))


if __name__ == "__main__":
    main()
