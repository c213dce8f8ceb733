"""What a finished verl or SkyRL run driving arctic-rl must have logged, shared by the one-host tests
(test_verl_trainer.py, test_skyrl_trainer.py) and the two-host job test (test_jobs_multinode.py), so the same
assertions hold wherever the run happened. The one-host runs skip when the two-host Slurm is up: the two-host
job is then the same run with the same checks, and CI pays for it once."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from arctic_rl.compare import load_runs, summarize
from arctic_rl.tracking import (
    BACKEND_ARCTIC,
    FRAMEWORK_SKYRL,
    FRAMEWORK_VERL,
    TAG_BACKEND,
    TAG_FRAMEWORK,
    TAG_MODEL,
    TAG_RECIPE,
)

TWO_HOSTS = ("arctic-n1", "arctic-n2")
REFUSED = Path("/run/arctic-slurm-cluster.refused")
VERL_PHASES = ("gen", "reward", "old_log_prob", "ref", "adv", "update_actor", "update_weights", "step")


def two_host_slurm_listed() -> bool:
    """scripts/slurm_cluster.sh's two nodes are in this Slurm (`make test` brings them up before pytest)."""
    if REFUSED.exists() or shutil.which("sinfo") is None:
        return False
    out = subprocess.run(["sinfo", "-h", "-N", "-o", "%N"], capture_output=True, text=True, timeout=60)
    return out.returncode == 0 and all(node in out.stdout.split() for node in TWO_HOSTS)


def skip_if_run_on_two_hosts(where: str) -> None:
    if two_host_slurm_listed():
        pytest.skip(f"the same run and checks on two hosts: {where}")


def _steps(client: MlflowClient, run_id: str, key: str) -> list[int]:
    return sorted(m.step for m in client.get_metric_history(run_id, key))


def _the_run(client: MlflowClient, experiment: str, model: Path, framework: str, context: str):
    exp = client.get_experiment_by_name(experiment)
    assert exp is not None, context
    (run,) = client.search_runs([exp.experiment_id])
    assert run.info.status == "FINISHED", context
    tags = run.data.tags
    assert tags[TAG_FRAMEWORK] == framework and tags[TAG_BACKEND] == BACKEND_ARCTIC
    assert tags[TAG_RECIPE] == experiment and tags[TAG_MODEL] == str(model)
    return run


def check_verl_run(uri: str, experiment: str, model: Path, context: str = "") -> None:
    """verl's own loop ran 2 GRPO steps with arctic-rl as actor/rollout/ref, logged per phase."""
    client = MlflowClient(tracking_uri=uri)
    run = _the_run(client, experiment, model, FRAMEWORK_VERL, context)
    assert run.data.params["actor_rollout_ref/rollout/name"] == "arctic"
    for phase in VERL_PHASES:
        assert _steps(client, run.info.run_id, f"timing_s/{phase}") == [1, 2], phase
    assert _steps(client, run.info.run_id, "critic/rewards/mean") == [1, 2]
    # `arctic-rl compare` groups it as verl driving arctic-rl.
    (row,) = summarize(load_runs([experiment], uri), skip_steps=1)
    assert (row.recipe, row.framework, row.backend) == (experiment, FRAMEWORK_VERL, BACKEND_ARCTIC)
    assert row.label == "verl + arctic-rl" and row.medians["step"] > 0


def check_skyrl_run(uri: str, experiment: str, model: Path, out: Path, context: str = "") -> None:
    """SkyRL's own loop ran 2 GRPO steps with arctic-rl as policy, reference and sampler, and saved its
    checkpoints through arctic-rl under `out`."""
    client = MlflowClient(tracking_uri=uri)
    run = _the_run(client, experiment, model, FRAMEWORK_SKYRL, context)
    # SkyRL's own metrics, per step: its timers around our ops, its reward stats, our loss under its names.
    for key in (
        "timing/generate",
        "timing/fwd_logprobs_values_reward",
        "timing/policy_train",
        "timing/sync_weights",
        "policy/policy_loss",
        "policy/grad_norm",
        "reward/avg_raw_reward",
        "generate/avg_num_tokens",
    ):
        assert _steps(client, run.info.run_id, key) == [1, 2], key
    assert _steps(client, run.info.run_id, "policy/policy_kl") == [1, 2]  # use_kl_loss: the reference engine ran
    assert any(k.startswith("eval/") for k in run.data.metrics), sorted(run.data.metrics)
    # SkyRL's checkpoint layout, written through arctic-rl's save_checkpoint. ckpt_interval=2 saves after step 2;
    # SkyRL's loop then saves again after the last step, with its step counter already advanced to 3
    # (skyrl-train's own behaviour, kept).
    ckpts = out / "ckpts"
    assert (ckpts / "latest_ckpt_global_step.txt").read_text().strip() == "3"
    for step in (2, 3):
        assert (ckpts / f"global_step_{step}" / "arctic_rl.json").is_file(), sorted(ckpts.iterdir())
    (row,) = summarize(load_runs([experiment], uri), skip_steps=0)
    assert (row.framework, row.backend) == (FRAMEWORK_SKYRL, BACKEND_ARCTIC)
