"""The Ray bootstrap with two Ray nodes on one machine: two bootstrap processes (rank 0 and rank 1) share a
job folder as two Slurm nodes would, each node with its own custom resource. The smoke recipe spreads two
engine actors and reports the node ranks they landed on; the run's MLflow tags must show both nodes."""

import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

RAY_ARGS = "--ray-args=--object-store-memory=100000000"


def bootstrap_argv(job_dir: Path, rank: int, num_nodes: int, resource: str, timeout_s: float) -> list[str]:
    return [
        sys.executable,
        "-m",
        "jobs.bootstrap",
        f"--job-dir={job_dir}",
        f"--nnodes={num_nodes}",
        f"--rank={rank}",
        "--num-cpus=1",
        f'--resources={{"{resource}": 1}}',
        RAY_ARGS,
        f"--register-timeout-s={timeout_s}",
    ]


@pytest.mark.slow
def test_two_node_bootstrap_spreads_engines(tmp_path: Path, new_mlflow_store) -> None:
    job_dir, uri = tmp_path / "job", new_mlflow_store(tmp_path / "mlflow.db")
    worker = subprocess.Popen(
        bootstrap_argv(job_dir, 1, 2, "node_b", 180), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    head_argv = bootstrap_argv(job_dir, 0, 2, "node_a", 180) + [
        "--recipe=twonode",
        f"--tracking-uri={uri}",
        "--",
        sys.executable,
        "-m",
        "jobs.smoke",
        "-",
        "steps=1",
        "engines=2",
    ]
    head = subprocess.run(head_argv, capture_output=True, text=True, timeout=400)
    worker_out, _ = worker.communicate(timeout=120)
    assert head.returncode == 0, head.stdout[-3000:] + head.stderr[-3000:]
    assert "all 2 node(s) registered" in head.stdout
    assert worker.returncode == 0, worker_out[-3000:]
    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("twonode").experiment_id])
    assert sorted(run.data.tags["engine_nodes"].split(",")) == ["0", "1"]  # one engine on each node
    assert run.data.tags["nodes"] == "2"
    assert client.get_metric_history(run.info.run_id, "cluster/nodes")[0].value == 2
    assert f"job-dir={job_dir}" not in subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout


@pytest.mark.slow
def test_missing_node_times_out_naming_it(tmp_path: Path) -> None:
    argv = bootstrap_argv(tmp_path / "job", 0, 2, "node_a", 20) + ["--", sys.executable, "-c", "print('never')"]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert out.returncode != 0
    assert "1 of 2 nodes registered; missing rank 1" in out.stderr, out.stderr[-3000:]
    assert "never" not in out.stdout
    assert "Ray stopped" in out.stdout  # torn down on the error path too


WORKER_ENV = r"""
import os, sys
import ray
ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)

@ray.remote(num_cpus=0)
def token_in_worker():
    return os.environ.get("ARCTIC_RL_TOKEN")

print("driver:", os.environ.get("ARCTIC_RL_TOKEN"), "worker:", ray.get(token_in_worker.remote(), timeout=180))
"""


@pytest.mark.slow
def test_ray_workers_of_a_job_never_see_the_bearer_token(tmp_path: Path, monkeypatch) -> None:
    """A real `ray start` head of a job whose launcher holds ARCTIC_RL_TOKEN; the recipe command (a driver, which
    keeps the token for the HTTP server it starts) runs a task, and the task's worker has no token."""
    from jobs import bootstrap

    monkeypatch.setenv("ARCTIC_RL_TOKEN", "job-bearer-s3cret")
    cfg = bootstrap.BootstrapConfig(
        command=["true"], job_dir=tmp_path / "job", num_cpus=1, ray_args=["--object-store-memory=100000000"]
    )
    bootstrap.make_job_dir(cfg.job_dir)
    bootstrap.write_token(cfg)
    node = bootstrap.RayNode(cfg, head_address=None)
    try:
        node.start()
        address = node.wait_head_ready()
        env = bootstrap.command_env(cfg, address)  # the recipe command's: Ray address, job token, bearer token
        out = subprocess.run(
            [sys.executable, "-c", WORKER_ENV, address], env=env, capture_output=True, text=True, timeout=300
        )
    finally:
        node.stop()
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "driver: job-bearer-s3cret worker: None", out.stdout
