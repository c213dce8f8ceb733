"""recipes/verl/native/run.py: what native verl's driver hands verl, read back by Hydra's own override parser.

In a job (jobs/bootstrap.py, RAY_ADDRESS set) verl's workers start from their raylet's environment, not the
driver's: the stand-in variables and the MLflow tags reach them only through the runtime_env overrides, and a
quoting slip there drops them (the MLflow run context is JSON, PYTHONPATH a colon list)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from unittest import mock

import pytest

# verl and its Hydra are installed beside the main environment (scripts/setup_env.sh), as verl's tests here use them
for folder in ("verl-ref", "verl-trainer"):
    path = Path(sys.executable).parent.parent / folder
    if path.is_dir() and str(path) not in sys.path:
        sys.path.append(str(path))

from hydra.core.override_parser.overrides_parser import OverridesParser  # noqa: E402

from recipes.verl.native import run  # noqa: E402

ENV_KEY = "ray_kwargs.ray_init.runtime_env.env_vars."


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path):
    # prepare() sets its variables in os.environ (VERL_ENGINE_DEVICE=cuda among them), and monkeypatch restores
    # only what it set or deleted itself: a variable that was absent would stay set for every later test and its
    # subprocesses (vs_verl's verl then asked for CUDA). patch.dict puts the whole environment back.
    with mock.patch.dict(os.environ):
        for var in (*run.WORKER_ENV, "RAY_ADDRESS", "ARCTIC_RL_RECIPE", "ARCTIC_RL_NODES", "SLURM_JOB_ID"):
            os.environ.pop(var, None)
        os.environ["VERL_NATIVE_STATE"] = str(tmp_path)
        monkeypatch.setattr(run.sys, "path", list(run.sys.path))
        yield monkeypatch


def parsed(args: list[str]) -> dict[str, object]:
    return {o.key_or_group: o.value() for o in OverridesParser.create().parse_overrides(args)}


ARGV = [
    "trainer.nnodes=2",
    "trainer.n_gpus_per_node=1",
    "trainer.project_name=gsm8k",
    "actor_rollout_ref.model.path=/m",
]


def test_in_a_job_the_workers_get_the_stand_ins_and_tags_and_no_ray_of_their_own(clean_env) -> None:
    clean_env.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    clean_env.setenv("SLURM_JOB_ID", "42")
    clean_env.setenv("MLFLOW_TRACKING_URI", "sqlite:////runs/mlflow.db")
    values = parsed(run.prepare(list(ARGV)))
    worker = {k.removeprefix(ENV_KEY): v for k, v in values.items() if k.startswith(ENV_KEY)}
    assert worker["VERL_USE_EXTERNAL_MODULES"] == os.environ["VERL_USE_EXTERNAL_MODULES"]
    assert worker["VERL_PLATFORM"] == "cpu" and worker["VERL_ENGINE_DEVICE"] == "cuda"
    assert worker["PYTHONPATH"] == os.environ["PYTHONPATH"] and ":" in worker["PYTHONPATH"]
    assert worker["MLFLOW_TRACKING_URI"] == "sqlite:////runs/mlflow.db"
    tags = json.loads(worker["MLFLOW_RUN_CONTEXT"])
    assert tags["framework"] == "verl" and tags["backend"] == "native"
    assert tags["recipe"] == "gsm8k" and tags["model"] == "/m" and tags["slurm_job_id"] == "42"
    # The job's Ray brings the fake GPU slots (--ray-args "--num-gpus=1"); ray.init may not ask for any.
    assert "ray_kwargs.ray_init.num_gpus" not in values


def test_without_a_job_ray_gets_one_fake_gpu_per_rank(clean_env) -> None:
    values = parsed(run.prepare(list(ARGV)))
    assert values["ray_kwargs.ray_init.num_gpus"] == 2


def test_prepare_leaves_no_variable_behind_for_later_tests() -> None:
    """Runs after the two tests above (file order): nothing prepare() set in them is still set."""
    leaked = {
        v: os.environ[v]
        for v in ("VERL_ENGINE_DEVICE", "VERL_PLATFORM", "VERL_USE_EXTERNAL_MODULES")
        if v in os.environ
    }
    assert not leaked, leaked


def test_a_value_hydra_cannot_carry_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="MLFLOW_TRACKING_URI="):
        run.runtime_env_args({"MLFLOW_TRACKING_URI": "sqlite:///it's.db"})


# verl's own MLflow logger in a process set up as the launcher sets up every verl process (its environment, the
# external modules verl loads on import), logging the config that the launcher's overrides build.
LOG_CONFIG = """
import json, sys
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf
from verl.utils.tracking import Tracking

config = OmegaConf.create()
for o in OverridesParser.create().parse_overrides(json.loads(sys.argv[1])):
    OmegaConf.update(config, o.key_or_group, o.value(), force_add=True)
tracking = Tracking("gsm8k", "secrets", default_backend=["mlflow"], config=OmegaConf.to_container(config))
tracking.__del__()
"""


def test_verl_s_own_mlflow_logger_logs_no_secret_of_the_launcher(clean_env, tmp_path) -> None:
    """verl logs its whole config as MLflow params, and the launcher's config carries the workers' environment:
    MLFLOW_TRACKING_URI (a URL that may hold a password) must not become a param, and a password in any other
    URL of the config is redacted. Real verl Tracking, real MLflow on a sqlite store."""
    import subprocess

    db = tmp_path / "mlflow.db"
    clean_env.setenv("RAY_ADDRESS", "10.0.0.1:6379")  # a job's: every variable goes through the overrides
    clean_env.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{db}")
    args = run.prepare([*ARGV, "data.train_files='https://alice:s3cret@data.example/train.parquet'"])
    env = dict(os.environ)
    # The CPU-platform and vLLM stand-ins import vLLM (minutes on this machine) and log nothing: left out here.
    stand_ins = {"recipes.verl.native.cpu_platform", "recipes.verl.native.vllm_cpu"}
    env["VERL_USE_EXTERNAL_MODULES"] = ",".join(
        m for m in env["VERL_USE_EXTERNAL_MODULES"].split(",") if m not in stand_ins
    )
    subprocess.run([sys.executable, "-c", LOG_CONFIG, json.dumps(args)], env=env, cwd=run.ROOT, check=True)

    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{db}")
    (found,) = client.search_runs([client.get_experiment_by_name("gsm8k").experiment_id])
    params = found.data.params
    assert f"{ENV_KEY.replace('.', '/')}VERL_PLATFORM" in params  # the workers' environment is logged
    assert not [k for k in params if "MLFLOW_TRACKING_URI" in k], params
    assert params["data/train_files"] == "https://alice:***@data.example/train.parquet"
    assert not [v for v in params.values() if "s3cret" in v or str(db) in v], params
