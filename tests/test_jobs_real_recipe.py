"""The real reference loop (`arctic-rl run`, real Ray + DeepSpeed + vLLM engines) as a Slurm batch job,
through submitit and through `torchx run -s slurm`; its run and metrics are then found in MLflow."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from jobs import slurm
from test_jobs_slurm import JOB_TIMEOUT_S, RAY_ARGS, mlflow_run, slurm_up, step_values, wait_done  # noqa: F401

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parent.parent
CONFIG = str(REPO / "tests" / "configs" / "tiny_loop.yaml")
ARCTIC = str(Path(sys.executable).with_name("arctic-rl"))


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    return tmp_path


def overrides(model: Path, experiment: str) -> list[str]:
    return [f"model.name_or_path={model}", "train.steps=2", f"tracking.experiment={experiment}"]


def test_real_loop_via_submitit(workdir: Path, tiny_llama: Path) -> None:
    args, _ = slurm.build_parser().parse_known_args(
        ["submit", "--recipe", "toy", "--config", CONFIG, "--command", f"{ARCTIC} run", RAY_ARGS, "--time", "15",
         "--cpus-per-node", "2"])
    args.overrides = overrides(tiny_llama, "slurm-real-submitit")
    job = slurm.submit(args)
    wait_done(job, timeout_s=2 * JOB_TIMEOUT_S)
    assert job.result() == 0, job.stderr()[-4000:]
    client, run = mlflow_run(workdir, "slurm-real-submitit", job.job_id)
    assert run.info.status == "FINISHED"
    assert [s for s, _ in step_values(client, run.info.run_id, "timing_s/step")] == [1, 2]
    assert step_values(client, run.info.run_id, "critic/rewards/mean")


def test_real_loop_via_torchx(workdir: Path, tiny_llama: Path) -> None:
    torchx = str(Path(sys.executable).with_name("torchx"))
    out = subprocess.run(
        [torchx, "run", "--wait", "-s", "slurm", "-cfg", "time=15", f"{REPO}/jobs/components.py:recipe",
         "--recipe", "toy", "--config", CONFIG, "--command", f"{ARCTIC} run", "--cpus_per_node", "2",
         f"--ray_args={RAY_ARGS.split('=', 1)[1]}", "--", *overrides(tiny_llama, "slurm-real-torchx")],
        cwd=workdir, capture_output=True, text=True, timeout=2 * JOB_TIMEOUT_S)
    log = out.stdout + out.stderr
    match = re.search(r"slurm://[^/\s]+/(\d+)", log)
    assert out.returncode == 0 and match and "Job finished: SUCCEEDED" in log, log[-4000:]
    client, run = mlflow_run(workdir, "slurm-real-torchx", match.group(1))
    assert run.info.status == "FINISHED"
    assert [s for s, _ in step_values(client, run.info.run_id, "timing_s/step")] == [1, 2]
