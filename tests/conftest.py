"""Shared fixtures. Nothing here downloads: models are tiny random ones built from configs."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
sys.path.insert(0, str(Path(__file__).parent))

from tiny_models import make_tiny_model  # noqa: E402

RAY = str(Path(sys.executable).parent / "ray")


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("models") / "tiny-llama", "llama")


@pytest.fixture(scope="session")
def ray_cluster(tmp_path_factory):
    """A real Ray head started with `ray start` (it outlives drivers, so reconnect can be tested);
    RAY_ADDRESS points every process of the session at it."""
    import ray

    state = tmp_path_factory.mktemp("arctic-state")
    os.environ["ARCTIC_RL_STATE_DIR"] = str(state)
    port = "6391"
    subprocess.run([RAY, "start", "--head", f"--port={port}", "--num-cpus=2", "--include-dashboard=false",
                    "--disable-usage-stats"], check=True, capture_output=True, env={**os.environ})
    os.environ["RAY_ADDRESS"] = f"127.0.0.1:{port}"
    yield os.environ["RAY_ADDRESS"]
    if ray.is_initialized():
        ray.shutdown()
    subprocess.run([RAY, "stop", "--force"], capture_output=True)
    os.environ.pop("RAY_ADDRESS", None)
