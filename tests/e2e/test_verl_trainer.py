"""verl 0.9.1's own trainer loop (RayPPOTrainer.fit, unmodified) with arctic-rl as actor/rollout/ref:
2 GRPO steps on the tiny model (CPU), through recipes/verl/run_tiny.sh, then the MLflow run verl logged.

Needs verl in $VENV/verl-ref and its trainer deps in $VENV/verl-trainer (scripts/setup_env.sh installs both)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from frameworks import check_verl_run, skip_if_run_on_two_hosts
from repo_paths import REPO

ROOT = REPO
VENV = Path(sys.executable).parent.parent


@pytest.mark.slow
def test_verl_trainer_two_grpo_steps_on_arctic(tiny_llama, tmp_path, new_mlflow_store):
    from recipes.verl.gsm8k import prepare

    skip_if_run_on_two_hosts("tests/e2e/test_jobs_multinode.py::test_framework_path_on_two_nodes[verl]")

    missing = [d for d in ("verl-ref", "verl-trainer") if not (VENV / d).is_dir()]
    assert not missing, f"{missing} not in {VENV}: run scripts/setup_env.sh"
    data = tmp_path / "data"
    prepare(data, max_train=8, max_test=2)
    db = tmp_path / "mlflow.db"
    uri = new_mlflow_store(db)
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "MLFLOW_RUN_ID", "MLFLOW_RUN_CONTEXT")}
    env.update(
        VERL_DATA=str(data),
        VERL_OUT=str(tmp_path / "out"),
        MLFLOW_TRACKING_URI=uri,
        VENV=str(VENV),
        PYTHON=sys.executable,
        ARCTIC_RL_STATE_DIR=str(tmp_path / "state"),
    )
    log = tmp_path / "verl.log"
    with open(log, "w") as out:
        proc = subprocess.run(
            [
                "bash",
                str(ROOT / "recipes/verl/run_tiny.sh"),
                str(tiny_llama),
                "trainer.project_name=verl-ci",
                "trainer.experiment_name=tiny",
            ],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=900,
        )
    tail = "\n".join(log.read_text(errors="replace").splitlines()[-60:])
    assert proc.returncode == 0, f"verl run failed (exit {proc.returncode}):\n{tail}"

    check_verl_run(uri, "verl-ci", tiny_llama, tail)
