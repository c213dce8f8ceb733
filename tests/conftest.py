"""Shared fixtures. Nothing here downloads: models are tiny random ones built from configs."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Ray's token authentication for the session's Ray (the ray_cluster head and every driver or subprocess that
# attaches to it), with a fresh token; embedded clusters make their own (arctic_rl/local_ray.py). Set before
# anything imports ray, which reads the mode once. SkyRL's Ray 2.51 has no token auth and ignores both.
os.environ["RAY_AUTH_MODE"] = "token"
os.environ["RAY_AUTH_TOKEN"] = secrets.token_hex(32)
os.environ.pop("RAY_AUTH_TOKEN_PATH", None)
sys.path.insert(0, str(Path(__file__).parent))

from tiny_models import make_tiny_model  # noqa: E402

from arctic_rl.local_ray import RAY_SYSTEM_CONFIG  # noqa: E402

RAY = str(Path(sys.executable).parent / "ray")


def compute_on_every_core() -> None:
    """make test exports OMP_NUM_THREADS=1 for what the suite deploys (engines and Slurm jobs read it: two
    deployments side by side on two cores). The test process's own torch (losses, ZoRRo, in-process engines)
    keeps every core it may run on: one thread there made tests/unit markedly slower (docs/setup.md)."""
    import torch

    torch.set_num_threads(len(os.sched_getaffinity(0)))


compute_on_every_core()

# The suite's peak on disk: Ray's and vLLM's session files, the Slurm jobs' folders, and the models, checkpoints,
# exports and stores of the tests running at that time.
FREE_DISK_GIB = 8


def pytest_sessionstart(session) -> None:
    """Refuse to start on a disk that cannot hold the suite: a run that fills it fails far from the cause
    (a save that says `No space left on device`, a Slurm job that just says FAILED)."""
    import tempfile

    if all(str(arg).startswith("tests/unit") for arg in session.config.args):
        return  # unit tests alone write little
    tmp = tempfile.gettempdir()
    free = shutil.disk_usage(tmp).free / 2**30
    if free < FREE_DISK_GIB:
        pytest.exit(
            f"{tmp} has {free:.1f} GiB free; the end-to-end tests need {FREE_DISK_GIB} GiB. Free some (old clones, "
            "model caches) or point TMPDIR at a larger disk.",
            returncode=3,
        )


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("models") / "tiny-llama", "llama")


@pytest.fixture(scope="session")
def mlflow_template(tmp_path_factory) -> Path:
    """An empty MLflow SQLite store, created once: creating one runs MLflow's schema migrations (seconds of
    CPU), which every test that wants a store of its own would otherwise pay again."""
    from mlflow.tracking import MlflowClient

    path = tmp_path_factory.mktemp("mlflow-template") / "mlflow.db"
    MlflowClient(f"sqlite:///{path}").search_experiments()
    return path


@pytest.fixture
def new_mlflow_store(mlflow_template):
    """new_mlflow_store(path) -> the tracking URI of a fresh, empty store at `path` (a copy of the template)."""

    def make(path: Path) -> str:
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(mlflow_template, path)
        return f"sqlite:///{path}"

    return make


@pytest.fixture(scope="session")
def ray_cluster(tmp_path_factory):
    """A real Ray head started with `ray start` (it outlives drivers, so reconnect can be tested);
    RAY_ADDRESS points every process of the session at it."""
    import ray

    state = tmp_path_factory.mktemp("arctic-state")
    os.environ["ARCTIC_RL_STATE_DIR"] = str(state)
    # Another checkout testing on the same machine sets its own port (ARCTIC_RL_TEST_RAY_PORT).
    port = os.environ.get("ARCTIC_RL_TEST_RAY_PORT", "6391")
    # `ray start --block` in its own session: teardown stops exactly this cluster (`ray stop` would
    # kill every Ray on the machine, other people's included).
    head = subprocess.Popen(
        [
            RAY,
            "start",
            "--head",
            "--block",
            f"--port={port}",
            "--num-cpus=2",
            "--include-dashboard=false",
            "--disable-usage-stats",
            f"--system-config={json.dumps(RAY_SYSTEM_CONFIG)}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        env={**os.environ},
    )
    address = f"127.0.0.1:{port}"
    deadline = time.time() + 120
    while subprocess.run([RAY, "status", f"--address={address}"], capture_output=True).returncode != 0:
        if head.poll() is not None or time.time() > deadline:
            raise RuntimeError(f"ray head did not come up on {address} (exit {head.poll()})")
        time.sleep(1)
    os.environ["RAY_ADDRESS"] = address
    yield address
    if ray.is_initialized():
        ray.shutdown()
    os.killpg(head.pid, signal.SIGTERM)
    try:
        head.wait(timeout=5)  # `ray start --block` can sit out a SIGTERM for 30 s; nothing of it is kept
    except subprocess.TimeoutExpired:
        os.killpg(head.pid, signal.SIGKILL)
    os.environ.pop("RAY_ADDRESS", None)
