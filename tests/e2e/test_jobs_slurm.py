"""End to end on a real (one-node) Slurm: submit a tiny recipe through submitit and through
`torchx run -s slurm`, wait for it, and find its run and metrics in MLflow; preempt a submitit job and
check that the requeued job resumes from its checkpoint into the same MLflow run.

Needs Slurm with accounting up: `scripts/slurm_setup.sh` (as root). These tests fail, not skip, when it is
not, so CI cannot pass without exercising Slurm. They skip while the two-host Slurm of scripts/slurm_cluster.sh
is listed (as under `make test`): tests/e2e/test_jobs_multinode.py then runs the same flows on the real recipe.

The recipe is jobs/smoke.py (a stand-in with the command line of `arctic-rl run`: it connects to the job's
Ray cluster, logs timing_s/* steps through Tracker and checkpoints/resumes). The real recipe runs on two
hosts in tests/e2e/test_jobs_multinode.py.
"""

import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from frameworks import skip_if_run_on_two_hosts
from mlflow.tracking import MlflowClient
from repo_paths import REPO

from jobs import slurm

REPO = REPO
SMOKE = f"{sys.executable} -m jobs.smoke -"
RAY_ARGS = "--ray-args=--object-store-memory=100000000"
JOB_TIMEOUT_S = 420


@pytest.fixture(scope="module", autouse=True)
def slurm_up() -> None:
    skip_if_run_on_two_hosts("tests/e2e/test_jobs_multinode.py (submitit with a requeue, TorchX, on the real recipe)")
    for tool in ("sinfo", "sbatch", "sacct"):
        if shutil.which(tool) is None:
            pytest.fail(f"`{tool}` not on PATH: start Slurm with `sudo scripts/slurm_setup.sh`")
    states = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True)
    if states.returncode != 0 or not re.search(r"idle|mixed|allocated", states.stdout):
        pytest.fail(
            f"Slurm is not up (sinfo: {states.stdout.strip() or states.stderr.strip()}); run scripts/slurm_setup.sh"
        )
    if subprocess.run(["sacct", "-n", "-X"], capture_output=True).returncode != 0:
        pytest.fail("sacct does not answer (slurmdbd down?): run scripts/slurm_setup.sh")


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Submit from a fresh folder; its runs/mlflow.db is the default store the job inherits."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return tmp_path


def submit(recipe: str, *overrides: str, time_limit: str = "10") -> "slurm.submitit.Job":
    args, _ = slurm.build_parser().parse_known_args(
        [
            "submit",
            "--recipe",
            recipe,
            "--command",
            " ".join([SMOKE, *overrides]),
            RAY_ARGS,
            "--time",
            time_limit,
            "--cpus-per-node",
            "1",
        ]
    )
    args.overrides = []
    return slurm.submit(args)


def wait_done(job: "slurm.submitit.Job", timeout_s: float = JOB_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not job.done():
        assert time.monotonic() < deadline, f"job {job.job_id} not done after {timeout_s} s (state {job.state})"
        time.sleep(2)


def mlflow_run(workdir: Path, experiment: str, slurm_job_id: str):
    client = MlflowClient(f"sqlite:///{workdir / 'runs' / 'mlflow.db'}")
    exp = client.get_experiment_by_name(experiment)
    assert exp is not None, f"no MLflow experiment {experiment!r} in {workdir / 'runs'}"
    runs = client.search_runs([exp.experiment_id], filter_string=f"tags.slurm_job_id = '{slurm_job_id}'")
    assert len(runs) == 1, f"expected one run of Slurm job {slurm_job_id}, found {len(runs)}"
    return client, runs[0]


def step_values(client: MlflowClient, run_id: str, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


@pytest.mark.slow
def test_submitit_job_logs_to_mlflow(workdir: Path) -> None:
    job = submit("slurm-submitit", "steps=2")
    wait_done(job)
    assert job.result() == 0, job.stderr()
    client, run = mlflow_run(workdir, "slurm-submitit", job.job_id)
    assert run.info.status == "FINISHED"
    assert run.data.tags["recipe"] == "slurm-submitit" and run.data.tags["nodes"] == "1"
    assert [s for s, _ in step_values(client, run.info.run_id, "timing_s/step")] == [1, 2]
    assert "Ray stopped" in job.stdout()


@pytest.mark.slow
def test_torchx_slurm_job_logs_to_mlflow(workdir: Path) -> None:
    torchx = str(Path(sys.executable).with_name("torchx"))
    out = subprocess.run(
        [
            torchx,
            "run",
            "--wait",
            "-s",
            "slurm",
            "-cfg",
            "time=10",
            f"{REPO}/jobs/components.py:recipe",
            "--recipe",
            "slurm-torchx",
            "--command",
            f"{SMOKE} steps=2",
            f"--ray_args={RAY_ARGS.split('=', 1)[1]}",
        ],
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=JOB_TIMEOUT_S,
    )
    log = out.stdout + out.stderr
    match = re.search(r"slurm://[^/\s]+/(\d+)", log)
    assert out.returncode == 0 and match, log[-3000:]
    assert "Job finished: SUCCEEDED" in log, log[-3000:]
    client, run = mlflow_run(workdir, "slurm-torchx", match.group(1))
    assert run.info.status == "FINISHED"
    assert [s for s, _ in step_values(client, run.info.run_id, "timing_s/step")] == [1, 2]


@pytest.mark.slow
def test_preempted_job_requeues_and_resumes(workdir: Path) -> None:
    job = submit("slurm-preempt", "steps=6", "step_s=1")
    ckpts = lambda: sorted(workdir.glob("runs/jobs/slurm-preempt-*/checkpoints/step_*.json"))  # noqa: E731
    deadline = time.monotonic() + JOB_TIMEOUT_S
    while len(ckpts()) < 2:
        assert not job.done(), f"job ended before it was preempted: {job.stderr()}"
        assert time.monotonic() < deadline, "no checkpoints written"
        time.sleep(1)
    job._interrupt()  # what submitit's own tests do: SIGTERM then USR2, as a preemption
    # Slurm holds a requeued job ~2 min before it is eligible again; release it now to keep the test short.
    deadline = time.monotonic() + 60
    while "PENDING" not in job.state and not job.done() and time.monotonic() < deadline:
        time.sleep(1)
    subprocess.run(["scontrol", "update", f"JobId={job.job_id}", "StartTime=now"], check=False)
    wait_done(job)
    assert job.result() == 0, job.stderr()
    client, run = mlflow_run(workdir, "slurm-preempt", job.job_id)
    attempts = step_values(client, run.info.run_id, "cluster/attempt")
    assert [s for s, _ in attempts] == [1, 2, 3, 4, 5, 6]  # one history, no step repeated from scratch
    assert attempts[0][1] == 0 and attempts[-1][1] >= 1  # later steps ran in the requeued attempt
    assert "resume from step 0" in job.stdout() and re.search(r"resume from step [1-5]", job.stdout())
