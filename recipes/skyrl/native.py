"""Native SkyRL (its FSDP workers, vLLM engines and SkyRLGymGenerator), the baseline for SkyRL on arctic-rl.

    python -m recipes.skyrl.native <SkyRL overrides ...>     # in an environment with skyrl-train[vllm] (GPUs)

`skyrl_train.entrypoints.main_base` unchanged except that the worker process first registers env_class
"arctic" (recipes/skyrl/env.py), so arctic-rl recipe data (recipes/skyrl/data.py) is scored by the same
reward code in both runs; SkyRL's own envs (gsm8k) need nothing. The MLflow run gets the `compare` tags
framework=skyrl, backend=native. Pre-filled assistant turns are refused here: SkyRL's generator samples
from the plain generation prompt, so a prefix would be scored as if the model had written it.
"""

from __future__ import annotations

import json

import hydra
import ray
from omegaconf import DictConfig
from skyrl_train.entrypoints.main_base import BasePPOExp, config_dir
from skyrl_train.utils import validate_cfg
from skyrl_train.utils.utils import initialize_ray


def check_no_prefill(files) -> None:
    import datasets

    for path in files:
        if not str(path).endswith((".json", ".jsonl")):
            continue
        ds = datasets.load_dataset("json", data_files=str(path))["train"]
        if "arctic_example" not in ds.column_names:
            continue
        for i, ex in enumerate(ds["arctic_example"]):
            if json.loads(ex).get("assistant_prefix"):
                raise ValueError(
                    f"{path} row {i}: assistant_prefix is set (text2sql prefill: true); native SkyRL "
                    f"cannot pre-fill the assistant turn - write the data with prefill: false"
                )


class NativeExp(BasePPOExp):
    def get_tracker(self):
        from arctic_rl.tracking import BACKEND_NATIVE, FRAMEWORK_SKYRL, set_run_context

        set_run_context(
            FRAMEWORK_SKYRL, BACKEND_NATIVE, str(self.cfg.trainer.project_name), str(self.cfg.trainer.policy.model.path)
        )
        return super().get_tracker()


@ray.remote(num_cpus=1)
def native_entrypoint(cfg: DictConfig):
    from recipes.skyrl.env import register

    register()
    NativeExp(cfg).run()


@hydra.main(config_path=config_dir, config_name="ppo_base_config", version_base=None)
def main(cfg: DictConfig) -> None:
    validate_cfg(cfg)
    check_no_prefill(list(cfg.data.train_data) + list(cfg.data.val_data or []))
    initialize_ray(cfg)
    ray.get(native_entrypoint.remote(cfg))


if __name__ == "__main__":
    main()
