"""The documented job flows, run as written in docs/jobs.md, on the two-host Slurm of
scripts/slurm_cluster.sh (a network + UTS namespace per node, each with its own hostname and address):

- the submitit command: a 2-node text2sql job whose Ray cluster and engines span both hosts (DeepSpeed over
  gloo across hosts, sampler replicas on both), preempted mid-run with `scontrol requeue`; the requeued job
  resumes from its last checkpoint and the MLflow run has each step exactly once;
- the TorchX command: the same job through `torchx run -s slurm`, to the end;
- a compute node dying mid-step (every process of its namespace killed, slurmd included): the job ends
  within a bounded time, failing with an error that names the node, or is requeued.

The commands are the ones in docs/jobs.md's ```bash blocks, as written; the tests add only size overrides
(SIZE, and the tiny random model in place of the 135M demo model: two DeepSpeed ranks, a reference and two
vLLM replicas of the demo model on one 24 GiB machine came within 5% of its memory, and Ray's memory monitor
killed a worker) and point MLflow at a temporary store. All share the one cluster `make test` brings up; where this
kernel refuses network namespaces they skip, naming the reason scripts/slurm_cluster.sh wrote.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from frameworks import check_skyrl_run, check_verl_run
from mlflow.tracking import MlflowClient
from repo_paths import REPO
from skyrl_env import skyrl_python

from jobs import slurm

pytestmark = pytest.mark.slow
REPO = REPO
DOC = REPO / "docs" / "jobs.md"
BIN = Path(sys.executable).parent
NODES = ("arctic-n1", "arctic-n2")
REFUSED = Path("/run/arctic-slurm-cluster.refused")
# Size overrides only: fewer prompts per step and a third step, so a preemption can land between steps.
SIZE = ["train.steps=3", "train.prompts_per_step=2", "sampling.n=4"]
PREEMPT_STEPS = 8  # the default text2sql data: a prompt of step 12 is past the tiny model's 2,048-token window
JOB_TIMEOUT_S = 900


def doc_commands(path: Path = DOC) -> list[str]:
    """Every command of the ```bash blocks in `path`, continuation lines joined, comments dropped."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", path.read_text(), flags=re.S):
        for cmd in re.sub(r"\\\n\s*", " ", block).splitlines():
            cmd = re.sub(r"\s+#.*$", "", cmd).strip()
            if cmd and not cmd.startswith("#"):
                commands.append(cmd)
    return commands


def doc_command(prefix: str) -> list[str]:
    found = [c for c in doc_commands() if c.startswith(prefix)]
    assert found, f"docs/jobs.md has no command starting with {prefix!r}"
    return shlex.split(found[0])


def local_argv(argv: list[str]) -> list[str]:
    """The documented argv with `python`/`torchx`/`arctic-rl` taken from this environment (a user runs them
    with the project's virtualenv active) and `sudo` dropped (the tests run as root)."""
    argv = argv[1:] if argv[0] == "sudo" else argv
    head = {"python": sys.executable}.get(argv[0]) or (str(BIN / argv[0]) if (BIN / argv[0]).exists() else argv[0])
    return [head, *argv[1:]]


@pytest.fixture(scope="module")
def cluster() -> None:
    """The two-node cluster, up (idempotent: ~1 s when it already is)."""
    if REFUSED.exists():
        pytest.skip(f"multi-node Slurm unavailable: {REFUSED.read_text().strip()}")
    up = doc_command("sudo scripts/slurm_cluster.sh up")
    out = subprocess.run(local_argv(up), cwd=REPO, capture_output=True, text=True, timeout=300)
    if out.returncode == 3:
        pytest.skip(f"multi-node Slurm unavailable: {out.stderr.strip()}")
    assert out.returncode == 0, out.stdout + out.stderr
    nodes = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T"], capture_output=True, text=True).stdout
    assert all(n in nodes for n in NODES), nodes


@pytest.fixture(scope="module")
def size(tiny_llama: Path) -> list[str]:
    return [*SIZE, f"model.name_or_path={tiny_llama}", "model.dtype=float32", "backend.vllm_config.dtype=float32"]


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, new_mlflow_store) -> MlflowClient:
    uri = new_mlflow_store(tmp_path / "mlflow.db")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    return MlflowClient(uri)


def submit(argv: list[str]) -> tuple[str, Path, str]:
    """Runs a documented submit command; returns (Slurm job id, job folder, its output)."""
    out = subprocess.run(
        local_argv(argv),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    log = out.stdout + out.stderr
    assert out.returncode == 0, log
    job_id = re.search(r"submitted job (\d+)", log).group(1)
    return job_id, Path(re.search(r"job folder : (\S+)", log).group(1)), log


def slurm_state(job_id: str) -> str:
    out = subprocess.run(["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State"], capture_output=True, text=True)
    states = out.stdout.split()
    return states[-1] if states else "UNKNOWN"


def wait_state(job_id: str, done: set[str], timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while (state := slurm_state(job_id)).split()[0] not in done:
        assert time.monotonic() < deadline, f"job {job_id} still {state} after {timeout_s:.0f} s"
        time.sleep(3)
    return state


def the_run(client: MlflowClient, experiment: str, job_id: str):
    exp = client.get_experiment_by_name(experiment)
    assert exp is not None, f"no MLflow experiment {experiment!r}"
    runs = client.search_runs([exp.experiment_id], filter_string=f"tags.slurm_job_id = '{job_id}'")
    assert len(runs) == 1, f"expected one run of Slurm job {job_id}, found {len(runs)}"
    return runs[0]


def steps_of(client: MlflowClient, run_id: str, key: str = "timing_s/step") -> list[int]:
    return sorted(m.step for m in client.get_metric_history(run_id, key))


def assert_spans_both_hosts(run) -> None:
    tags = run.data.tags
    assert tags["nodes"] == "2" and tags["engine_hosts"] == ",".join(NODES), tags
    placement = dict(item.split("=") for item in tags["placement"].split(","))
    assert {placement["training[0]"], placement["training[1]"]} == set(NODES), placement
    assert {placement["sampling[0]"], placement["sampling[1]"]} == set(NODES), placement


def ray_addresses(job_dir: Path) -> set[str]:
    """The node addresses the job's Ray cluster reported, from the head's and workers' logs."""
    text = " ".join(p.read_text(errors="replace") for p in (job_dir / "logs").glob("ray-node*.log"))
    return set(re.findall(r"10\.213\.0\.\d+", text))


def test_submitit_two_nodes_preempted_resumes_each_step_once(cluster, store: MlflowClient, size: list[str]) -> None:
    # On a quiet machine a tiny-model step takes about a second: with 3 steps the job could finish before the
    # requeue landed. PREEMPT_STEPS steps leave the preemption a window of many seconds after step 1.
    job_id, job_dir, _ = submit([*doc_command("python -m jobs.slurm submit"), *size, f"train.steps={PREEMPT_STEPS}"])
    done = job_dir / "checkpoints" / "step_1" / "loop_state.json"
    deadline = time.monotonic() + JOB_TIMEOUT_S
    while not done.exists():
        # UNKNOWN: slurmdbd has not recorded the job yet (sacct lags sbatch by a moment).
        state = slurm_state(job_id)
        assert state in ("UNKNOWN", "PENDING", "RUNNING") or done.exists(), f"job ended before step 1: {state}"
        assert time.monotonic() < deadline, "no checkpoint of step 1"
        time.sleep(0.2)
    subprocess.run(["scontrol", "requeue", job_id], check=True)
    # Slurm holds a requeued job (BeginTime ~2 min ahead); release it now to keep the test short.
    deadline = time.monotonic() + 120
    while (
        "JobState=PENDING"
        not in subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True).stdout
    ):
        assert time.monotonic() < deadline, "the requeued job never became PENDING"
        time.sleep(1)
    subprocess.run(["scontrol", "update", f"JobId={job_id}", "StartTime=now"], check=True)
    state = wait_state(job_id, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"}, JOB_TIMEOUT_S)
    stdout = "".join(p.read_text(errors="replace") for p in (job_dir / "submitit").glob("*_0_log.out"))
    assert state == "COMPLETED", stdout[-4000:]
    run = the_run(store, "text2sql", job_id)
    assert run.info.status == "FINISHED"
    assert steps_of(store, run.info.run_id) == list(range(1, PREEMPT_STEPS + 1))  # no step lost or repeated
    assert_spans_both_hosts(run)
    assert ray_addresses(job_dir) >= {"10.213.0.11", "10.213.0.12"}
    assert (job_dir / "checkpoints" / f"step_{PREEMPT_STEPS}" / "loop_state.json").exists()
    assert "ray-head.1.json" in os.listdir(job_dir)  # the second attempt brought its own Ray up


def test_torchx_two_nodes(cluster, store: MlflowClient, size: list[str]) -> None:
    argv = doc_command("torchx run -s slurm")
    out = subprocess.run(
        [*local_argv(argv), *size[1:]],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    log = out.stdout + out.stderr
    match = re.search(r"slurm://[^/\s]+/(\d+)", log)
    assert out.returncode == 0 and match, log[-3000:]
    state = wait_state(match.group(1), {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"}, JOB_TIMEOUT_S)
    # torchx's Slurm scheduler writes each node's output beside the submit (slurm-<job>-node-<i>.err/.out)
    node_files = sorted(REPO.glob(f"slurm-{match.group(1)}-*"))
    node_logs = "".join(f"\n--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in node_files)
    assert state == "COMPLETED", log[-2000:] + node_logs
    for p in node_files:
        p.unlink()  # passed: nothing to look at
    run = the_run(store, "text2sql", match.group(1))
    assert run.info.status == "FINISHED" and steps_of(store, run.info.run_id) == [1, 2]
    assert_spans_both_hosts(run)


def kill_node(name: str) -> int:
    """What a node's death looks like from the cluster: every process of its namespace (slurmd, the job's
    task, its Ray node) killed at once."""
    pids = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True).stdout.split()
    for pid in pids:
        try:
            os.kill(int(pid), signal.SIGKILL)
        except ProcessLookupError:
            pass
    return len(pids)


def test_node_loss_ends_the_job_in_bounded_time_naming_the_node(cluster, store: MlflowClient) -> None:
    smoke = f"{sys.executable} -m jobs.smoke - steps=200 step_s=1 engines=2"
    argv = [
        "python",
        "-m",
        "jobs.slurm",
        "submit",
        "--recipe",
        "smoke",
        "--command",
        smoke,
        "--nodes",
        "2",
        "--time",
        "15",
        "--max-requeues",
        "0",
    ]
    job_id, job_dir, _ = submit(argv)
    out = lambda: "".join(p.read_text(errors="replace") for p in (job_dir / "submitit").glob("*_0_log.*"))  # noqa: E731
    deadline = time.monotonic() + 300
    while "[smoke] step 2/" not in out():
        assert time.monotonic() < deadline, f"smoke job never reached step 2: {out()[-3000:]}"
        time.sleep(1)
    try:
        assert kill_node(NODES[1]) > 0
        t0 = time.monotonic()
        state = wait_state(job_id, {"FAILED", "NODE_FAIL", "PENDING", "REQUEUED", "CANCELLED", "COMPLETED"}, 180)
        elapsed = time.monotonic() - t0
        assert state != "COMPLETED", out()[-3000:]
        # Whichever notices first ends the job, naming the node: the head's node watch (FAILED, its error in the
        # job's output) or Slurm (NODE_FAIL once slurmd stops answering; `--wait` names the node from sinfo).
        if state == "FAILED":
            assert f"node {NODES[1]} (rank 1) left the job's Ray cluster" in out(), out()[-3000:]
        elif state == "NODE_FAIL":
            assert NODES[1] in slurm.failed_nodes(job_id), subprocess.run(
                ["sinfo", "-N"], capture_output=True, text=True
            ).stdout
        print(f"node loss: job {job_id} {state} {elapsed:.0f} s after {NODES[1]} died")
    finally:
        subprocess.run(["scancel", job_id], check=False)
        # The node "reboots": its slurmd comes back and the node returns to service.
        up = subprocess.run(
            local_argv(doc_command("sudo scripts/slurm_cluster.sh up")),
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert up.returncode == 0, up.stdout + up.stderr


def placement_from_log(text: str) -> dict[str, str]:
    """The `[arctic-rl] placement: training[0]=host,...` line the verl worker and the SkyRL entry print."""
    match = re.search(r"\[arctic-rl\] placement: (\S+)", text)
    assert match, text[-3000:]
    return dict(item.split("=") for item in match.group(1).split(","))


@pytest.mark.parametrize("framework", ["verl", "skyrl"])
def test_framework_path_on_two_nodes(
    cluster, store: MlflowClient, tiny_llama: Path, tmp_path: Path, framework: str
) -> None:
    """verl's own trainer (recipes/verl/run_tiny.sh) and SkyRL's (recipes/skyrl/run_tiny.sh: SkyRL in its own
    Python and Ray, the arctic-rl server it starts over HTTP joining the job's Ray) as a 2-node job through the
    same launcher (`--command`, run as given): arctic-rl's engines span both hosts."""
    if framework == "skyrl":
        skyrl_python()
    arctic = "+actor_rollout_ref.arctic" if framework == "verl" else "+trainer.arctic"
    project = f"{framework}-2nodes"
    command = (
        f"bash {REPO}/recipes/{framework}/run_tiny.sh {tiny_llama} {arctic}.training_gpus=2 "
        f"{arctic}.sampling_gpus=2 trainer.project_name={project}"
    )
    env_out = {"verl": "VERL_OUT", "skyrl": "SKYRL_OUT"}[framework]
    os.environ[env_out] = str(tmp_path / "out")  # read by run_tiny.sh inside the job (sbatch exports the env)
    try:
        job_id, job_dir, _ = submit(
            [
                "python",
                "-m",
                "jobs.slurm",
                "submit",
                "--recipe",
                project,
                "--command",
                command,
                "--nodes",
                "2",
                "--time",
                "20",
            ]
        )
    finally:
        del os.environ[env_out]
    state = wait_state(job_id, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"}, JOB_TIMEOUT_S)
    log = "".join(p.read_text(errors="replace") for p in sorted((job_dir / "submitit").glob("*_0_log.*")))
    assert state == "COMPLETED", log[-5000:]
    placement = placement_from_log(log)
    assert {placement["training[0]"], placement["training[1]"]} == set(NODES), placement
    assert {placement["sampling[0]"], placement["sampling[1]"]} == set(NODES), placement
    exp = store.get_experiment_by_name(project)
    assert exp is not None, log[-3000:]
    (run,) = store.search_runs([exp.experiment_id])
    assert run.info.status == "FINISHED"
    assert run.data.tags["framework"] == framework and run.data.tags["backend"] == "arctic-rl"
    # The one-host framework tests' checks, here on two hosts (they skip while this cluster is up).
    uri = os.environ["MLFLOW_TRACKING_URI"]
    if framework == "verl":
        check_verl_run(uri, project, tiny_llama, log[-3000:])
    else:
        check_skyrl_run(uri, project, tiny_llama, tmp_path / "out", log[-3000:])
