"""Tracker: default URI, params, metrics, statuses, and continuing a run across a requeue."""

from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from arctic_rl import tracking
from arctic_rl.tracking import TIMING_GEN, TIMING_STEP, Tracker


@pytest.fixture
def uri(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.chdir(tmp_path)
    for env in ("MLFLOW_TRACKING_URI", tracking.ENV_RESUME_KEY, *tracking.ENV_DEFAULT_TAGS):
        monkeypatch.delenv(env, raising=False)
    return tracking.default_tracking_uri()


def test_default_uri_is_sqlite_under_cwd_runs(uri: str, tmp_path: Path) -> None:
    assert uri == f"sqlite:///{tmp_path.resolve() / 'runs' / 'mlflow.db'}"
    assert (tmp_path / "runs").is_dir()


def test_env_uri_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow:5000")
    assert tracking.default_tracking_uri() == "http://mlflow:5000"


def test_logs_params_metrics_tags_and_artifacts(uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ARCTIC_RL_NODES", "2")  # what jobs/bootstrap.py exports for the recipe
    params = {"optimizer": {"lr": 1e-5, "betas": [0.9, 0.99]}, "model": "tiny"}
    with Tracker.start("text2sql", run_name="r", tags={"framework": "arctic-rl"}, params=params) as tracker:
        tracker.log_metrics({TIMING_GEN: 1.5, TIMING_STEP: 3}, step=1)
        tracker.log_metrics({TIMING_GEN: 1.25}, step=2)
        (tmp_path / "note.txt").write_text("hi")
        tracker.log_artifact(tmp_path / "note.txt")
    client = MlflowClient(uri)
    run = client.get_run(tracker.run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "r"
    assert run.data.params == {"optimizer/lr": "1e-05", "optimizer/betas": "[0.9, 0.99]", "model": "tiny"}
    assert run.data.tags["framework"] == "arctic-rl" and run.data.tags["nodes"] == "2"
    assert [(m.step, m.value) for m in client.get_metric_history(tracker.run_id, TIMING_GEN)] == [(1, 1.5), (2, 1.25)]
    assert [a.path for a in client.list_artifacts(tracker.run_id)] == ["note.txt"]


def test_failure_marks_run_failed_and_bad_metric_names_key(uri: str) -> None:
    with pytest.raises(ValueError, match="'loss' has value 'nan-ish'"):
        with Tracker.start("exp") as tracker:
            tracker.log_metrics({"loss": "nan-ish"}, step=0)
    assert MlflowClient(uri).get_run(tracker.run_id).info.status == "FAILED"


def test_requeued_job_continues_its_run(uri: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(tracking.ENV_RESUME_KEY, "/shared/jobs/text2sql-1")
    first = Tracker.start("exp", run_name="job", params={"a": 1})
    first.log_metrics({TIMING_STEP: 1.0}, step=1)
    first.end("KILLED")  # preempted
    second = Tracker.start("exp", run_name="job", params={"a": 1, "b": 2})
    assert second.run_id == first.run_id
    second.log_metrics({TIMING_STEP: 2.0}, step=2)
    second.end()
    # a finished run is never reopened: the next job with the same key gets a new one
    third = Tracker.start("exp", run_name="job")
    assert third.run_id != first.run_id
    client = MlflowClient(uri)
    assert [m.step for m in client.get_metric_history(first.run_id, TIMING_STEP)] == [1, 2]
    assert client.get_run(first.run_id).data.params == {"a": "1", "b": "2"}


def test_empty_experiment_is_refused(uri: str) -> None:
    with pytest.raises(ValueError, match="experiment=''"):
        Tracker.start("")


def test_reward_curve_draws_per_step_rolling_mean_and_evals() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    rewards = [0.0, 0.3, 0.6, 0.3, 0.9]
    drawn = tracking.draw_reward_curve(ax, rewards, evals={-1: 0.05, 0: 0.1, 5: 0.25}, window=3)
    plt.close(fig)
    assert list(drawn["reward"].get_xdata()) == [1, 2, 3, 4, 5]
    assert list(drawn["reward"].get_ydata()) == rewards
    assert list(drawn["rolling"].get_xdata()) == [1, 2, 3, 4, 5]
    assert drawn["rolling"].get_ydata() == pytest.approx([0.0, 0.15, 0.3, 0.4, 0.6])
    assert drawn["eval"].get_offsets().tolist() == [[0.0, 0.1], [5.0, 0.25]]
    assert drawn["eval_before_sft"].get_offsets().tolist() == [[0.0, 0.05]]
    assert drawn["rolling"].get_color() == drawn["reward"].get_color()  # one run, one colour


def test_reward_curve_png_has_every_run_and_none_without_rewards(tmp_path: Path) -> None:
    # into a folder not made yet (a report's folder is made when the report is written, after its plot)
    path = tracking.plot_reward_runs({"a": ([0.1, 0.2], {0: 0.0}), "b": ([0.3], None)}, tmp_path / "new" / "curve.png")
    assert path == tmp_path / "new" / "curve.png" and path.read_bytes()[:4] == b"\x89PNG"
    assert [p.name for p in path.parent.iterdir()] == ["curve.png"]  # no temporary file left behind
    assert tracking.plot_rewards([], tmp_path / "none.png") is None
    with pytest.raises(ValueError, match="window=0"):
        tracking.rolling_mean([1.0], window=0)


# A framework's own logger (verl's, SkyRL's) in a process where the integration called set_run_context first: it logs
# the framework's whole config through MLflow's fluent API, never through flatten_params.
FRAMEWORK_LOGGER = """
import sys
if sys.argv[2] == "mlflow first":
    import mlflow
from arctic_rl.tracking import set_run_context
set_run_context("skyrl", "arctic-rl", "toy", "tiny")
import mlflow
mlflow.set_tracking_uri(sys.argv[1])
mlflow.set_experiment("toy")
with mlflow.start_run():
    mlflow.log_params({
        "generator/backend/auth_token": "tok-1",
        "ray_kwargs/ray_init/runtime_env/env_vars/MLFLOW_TRACKING_URI": "https://alice:s3cret@mlflow.example",
        "ray_kwargs/ray_init/runtime_env/env_vars/RAY_AUTH_TOKEN": "tok-2",
        "trainer/hf/HF_TOKEN": "tok-3",
        "data/train_files": "https://bob:tok-4@data.example/train.parquet",
        "trainer/lr": "1e-06",
        "generator/max_tokens": "64",
        "generator/pad_token": "<pad>",
    })
    mlflow.log_param("generator.api_key", "tok-5")
"""


@pytest.mark.parametrize("order", ["filter first", "mlflow first"])
def test_a_framework_s_own_logger_logs_no_secret(uri: str, order: str) -> None:
    import subprocess
    import sys

    subprocess.run([sys.executable, "-c", FRAMEWORK_LOGGER, uri, order], check=True)
    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("toy").experiment_id])
    assert run.data.params == {
        "data/train_files": "https://bob:***@data.example/train.parquet",
        "trainer/lr": "1e-06",
        "generator/max_tokens": "64",
        "generator/pad_token": "<pad>",
    }
