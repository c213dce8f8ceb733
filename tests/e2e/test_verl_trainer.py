"""verl 0.9.1's own trainer loop (RayPPOTrainer.fit, unmodified) with arctic-rl as actor/rollout/ref:
2 GRPO steps on the tiny model (CPU), through recipes/verl/run_tiny.sh, then the MLflow run verl logged.

Needs verl in $VENV/verl-ref and its trainer deps in $VENV/verl-trainer (scripts/setup_env.sh installs both)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from repo_paths import REPO

ROOT = REPO
VENV = Path(sys.executable).parent.parent
PHASES = ("gen", "reward", "old_log_prob", "ref", "adv", "update_actor", "update_weights", "step")


@pytest.mark.slow
def test_verl_trainer_two_grpo_steps_on_arctic(tiny_llama, tmp_path):
    from mlflow.tracking import MlflowClient

    from arctic_rl.compare import load_runs, summarize
    from arctic_rl.tracking import BACKEND_ARCTIC, FRAMEWORK_VERL, TAG_BACKEND, TAG_FRAMEWORK, TAG_MODEL, TAG_RECIPE
    from recipes.verl.gsm8k import prepare

    missing = [d for d in ("verl-ref", "verl-trainer") if not (VENV / d).is_dir()]
    assert not missing, f"{missing} not in {VENV}: run scripts/setup_env.sh"
    data = tmp_path / "data"
    prepare(data, max_train=8, max_test=2)
    db = tmp_path / "mlflow.db"
    uri = f"sqlite:///{db}"
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

    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("verl-ci")
    assert exp is not None, tail
    (run,) = client.search_runs([exp.experiment_id])
    assert run.info.status == "FINISHED"
    tags = run.data.tags
    assert tags[TAG_FRAMEWORK] == FRAMEWORK_VERL and tags[TAG_BACKEND] == BACKEND_ARCTIC
    assert tags[TAG_RECIPE] == "verl-ci" and tags[TAG_MODEL] == str(tiny_llama)
    assert run.data.params["actor_rollout_ref/rollout/name"] == "arctic"
    for phase in PHASES:
        steps = sorted(m.step for m in client.get_metric_history(run.info.run_id, f"timing_s/{phase}"))
        assert steps == [1, 2], (phase, steps)
    assert [m.step for m in client.get_metric_history(run.info.run_id, "critic/rewards/mean")] == [1, 2]

    # `arctic-rl compare` groups it as verl driving arctic-rl.
    (row,) = summarize(load_runs(["verl-ci"], uri), skip_steps=1)
    assert (row.recipe, row.framework, row.backend) == ("verl-ci", FRAMEWORK_VERL, BACKEND_ARCTIC)
    assert row.label == "verl + arctic-rl" and row.medians["step"] > 0
