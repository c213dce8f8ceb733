"""`arctic-rl compare` on runs logged three ways into one MLflow store: verl's own tracking code
(verl.utils.tracking.Tracking, mlflow backend, installed --no-deps in .venv/verl-ref), SkyRL's metric names
(`timing/<Timer>`, logged as its mlflow adapter does: plain mlflow.log_metrics, config as params), and our
Tracker. The verl and SkyRL runs carry none of our tags: compare must recognise them from their own
params and metric names."""

import csv
import dataclasses
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from repo_paths import REPO

from arctic_rl import compare, tracking
from arctic_rl.tracking import (
    BACKEND_ARCTIC,
    FRAMEWORK_ARCTIC,
    FRAMEWORK_SKYRL,
    FRAMEWORK_VERL,
    TAG_BACKEND,
    TAG_FRAMEWORK,
    TAG_RECIPE,
    Tracker,
)

VERL_REF = REPO / ".venv" / "verl-ref"

# Per-step seconds; step 1 is a warm-up outlier that --skip-steps 1 must drop.
VERL_NATIVE = {
    "gen": [99, 10, 12, 11],
    "old_log_prob": [9, 2, 2, 2],
    "ref": [9, 1, 1, 1],
    "update_actor": [9, 8, 8, 8],
    "step": [199, 22, 24, 23],
}
VERL_ARCTIC = {
    "gen": [99, 5, 6, 4],
    "old_log_prob": [9, 1, 1, 1],
    "ref": [9, 0.5, 0.5, 0.5],
    "update_actor": [9, 4, 4, 4],
    "step": [199, 11, 12, 10],
}
LOOP = {"gen": [99, 4, 4, 4], "step": [199, 10, 10, 10]}
SKYRL_NATIVE = {
    "timing/generate": [99, 20, 20, 20],
    "timing/fwd_logprobs_values_reward": [9, 6, 6, 6],
    "timing/policy_train": [9, 10, 10, 10],
    "timing/step": [199, 40, 40, 40],
}
SKYRL_ARCTIC = {
    "timing/generate": [99, 10, 10, 10],
    "timing/fwd_logprobs_values_reward": [9, 2, 2, 2],
    "timing/policy_train": [9, 5, 5, 5],
    "timing/step": [199, 20, 20, 20],
}


def log_with_verl(uri: str, runs: list[tuple[str, dict[str, list[float]], dict[str, str] | None]]) -> None:
    """Runs verl's own Tracking in one child process (it keeps global mlflow state and reads the env URI), one
    run after the other: (run name, per-phase seconds, tags set as recipes/verl sets them or None)."""
    assert (VERL_REF / "verl" / "utils" / "tracking.py").exists(), (
        f"verl not installed in {VERL_REF} (scripts/setup_env.sh)"
    )
    runs_metrics = [(name, {f"timing_s/{p}": v for p, v in phases.items()}, tags) for name, phases, tags in runs]
    script = textwrap.dedent(f"""
        import sys; sys.path.insert(0, {str(VERL_REF)!r})
        import mlflow
        from verl.utils.tracking import Tracking
        config = {{"trainer": {{"nnodes": 1, "n_gpus_per_node": 8, "project_name": "text2sql"}},
                   "data": {{"train_batch_size": 64, "max_prompt_length": 1024, "max_response_length": 512}},
                   "actor_rollout_ref": {{"model": {{"path": "Qwen/Qwen3-4B"}}, "rollout": {{"n": 8}}}}}}
        for run_name, metrics, tags in {runs_metrics!r}:
            tracking = Tracking(project_name="text2sql", experiment_name=run_name, default_backend="mlflow", config=config)
            if tags:
                mlflow.set_tags(tags)  # what recipes/verl does for verl + arctic-rl runs
            for i in range(len(next(iter(metrics.values())))):
                tracking.log({{k: v[i] for k, v in metrics.items()}}, step=i + 1)
            tracking.finish()
    """)
    subprocess.run(
        [sys.executable, "-c", script], check=True, env={"MLFLOW_TRACKING_URI": uri, "PATH": "/usr/bin:/bin"}
    )


def log_like_skyrl(uri: str, run_name: str, metrics: dict[str, list[float]], tags: dict[str, str] | None) -> None:
    """SkyRL's _MlflowLoggingAdapter: set_experiment(project), start_run(run_name), log_params(flat config),
    then log_metrics({"timing/" + name: s}) per step. skyrl-train needs Python 3.12, so not imported."""
    import mlflow

    mlflow.set_tracking_uri(uri)
    experiment = mlflow.set_experiment("text2sql")
    with mlflow.start_run(experiment_id=experiment.experiment_id, run_name=run_name):
        mlflow.log_params(
            {
                "trainer/policy/model/path": "Qwen/Qwen3-4B",
                "trainer/placement/policy_num_nodes": 1,
                "trainer/placement/policy_num_gpus_per_node": 8,
                "generator/backend": "vllm",
                "trainer/train_batch_size": 64,
                "generator/n_samples_per_prompt": 8,
                "trainer/max_prompt_length": 1024,
                "generator/sampling_params/max_generate_length": 512,
            }
        )
        if tags:
            mlflow.set_tags(tags)
        for i in range(len(next(iter(metrics.values())))):
            mlflow.log_metrics({k: v[i] for k, v in metrics.items()}, step=i + 1)


# The setup all runs of the "text2sql" experiment share (the loop logs it as tags, verl and SkyRL as config).
SETUP = {
    "model": "/models/Qwen3-4B",
    "nodes": "1",
    "gpus": "8",
    "prompts_per_step": "64",
    "n": "8",
    "max_prompt_length": "1024",
    "max_response_length": "512",
}


def log_with_tracker(
    uri: str,
    phases: dict[str, list[float]],
    experiment: str = "text2sql",
    tags: dict[str, str] | None = None,
    params: dict | None = None,
    extra: dict[str, list[float]] | None = None,
) -> None:
    tags = tags or {TAG_FRAMEWORK: FRAMEWORK_ARCTIC, TAG_BACKEND: BACKEND_ARCTIC, **SETUP}
    with Tracker.start(
        experiment, run_name="loop", tags={TAG_RECIPE: "text2sql", **tags}, params=params, tracking_uri=uri
    ) as tracker:
        for i in range(len(phases["step"])):
            metrics = {f"timing_s/{p}": v[i] for p, v in phases.items()}
            tracker.log_metrics({**metrics, **{k: v[i] for k, v in (extra or {}).items()}}, step=i + 1)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory, mlflow_template: Path) -> str:
    path = tmp_path_factory.mktemp("mlflow") / "mlflow.db"
    shutil.copyfile(mlflow_template, path)
    uri = f"sqlite:///{path}"
    verl_arctic_tags = {TAG_FRAMEWORK: FRAMEWORK_VERL, TAG_BACKEND: BACKEND_ARCTIC}
    log_with_verl(uri, [("verl-native", VERL_NATIVE, None), ("verl-arctic", VERL_ARCTIC, verl_arctic_tags)])
    log_like_skyrl(uri, "skyrl-native", SKYRL_NATIVE, None)
    log_like_skyrl(uri, "skyrl-arctic", SKYRL_ARCTIC, {TAG_FRAMEWORK: FRAMEWORK_SKYRL, TAG_BACKEND: BACKEND_ARCTIC})
    log_with_tracker(uri, LOOP)
    return uri


def read_csv(path: Path) -> dict[tuple[str, str, str], dict[str, str]]:
    with open(path) as f:
        return {(r["framework"], r["backend"], r["phase"]): r for r in csv.DictReader(f)}


def test_compare_reads_verl_skyrl_and_tracker_runs(store: str, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert compare.main(["--experiment", "text2sql", "--tracking-uri", store, "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert "verl (native)" in printed and "skyrl + arctic-rl" in printed and "arctic-rl loop" in printed
    assert "speedup verl + arctic-rl vs verl (native)" in printed
    rows = read_csv(tmp_path / "compare.csv")
    # verl, medians of steps 2-4: native gen 11, arctic gen 5 -> 2.2x; step 23 vs 11 -> ~2.09x
    assert float(rows[("verl", "native", "gen")]["median_s"]) == pytest.approx(11)
    assert float(rows[("verl", "arctic-rl", "gen")]["speedup"]) == pytest.approx(11 / 5, rel=1e-3)
    assert float(rows[("verl", "arctic-rl", "step")]["speedup"]) == pytest.approx(23 / 11, rel=1e-3)
    # log_probs = old_log_prob + ref for verl; SkyRL's one combined timer
    assert float(rows[("verl", "native", "log_probs")]["median_s"]) == pytest.approx(3)
    assert float(rows[("skyrl", "native", "log_probs")]["median_s"]) == pytest.approx(6)
    assert float(rows[("skyrl", "arctic-rl", "update_actor")]["speedup"]) == pytest.approx(2)
    assert float(rows[("skyrl", "arctic-rl", "step")]["speedup"]) == pytest.approx(2)
    assert rows[("skyrl", "arctic-rl", "step")]["baseline"] == "skyrl (native)"
    # the reference loop is measured against native verl
    assert rows[("arctic-rl", "arctic-rl", "step")]["baseline"] == "verl (native)"
    assert float(rows[("arctic-rl", "arctic-rl", "step")]["speedup"]) == pytest.approx(2.3)
    png = (tmp_path / "compare.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


def test_compare_infers_model_and_topology_from_native_params(store: str) -> None:
    runs = compare.load_runs(["text2sql"], store)
    native = [r for r in runs if r.backend == "native"]
    assert {r.framework for r in native} == {"verl", "skyrl"}
    # a hub name and a local folder of the same model are one model
    assert all(r.setup == {**SETUP, "model": "Qwen3-4B"} for r in runs), [r.setup for r in runs]


def test_compare_unknown_experiment_names_the_known_ones(store: str, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        compare.main(["--experiment", "nope", "--tracking-uri", store])
    assert "'nope' not found" in capsys.readouterr().err


def test_skip_steps_keeps_short_runs() -> None:
    run = compare.RunTimings("r", "x", "verl", "native", dict(SETUP), phases={"step": {1: 5.0}})
    (row,) = compare.summarize([run], skip_steps=1)
    assert row.medians["step"] == 5.0 and row.seconds["step"].iqr == 0.0


# Two matched runs: the loop logs its tokens per step, verl only perf/throughput (tokens / s / GPU, 8 GPUs).
MATCHED_LOOP = {"gen": [9, 5, 5, 5, 5], "step": [99, 10, 20, 10, 20]}
MATCHED_VERL = {"gen": [9, 10, 10, 10, 10], "step": [99, 20, 40, 20, 40]}
VERL_PARAMS = {
    "trainer": {"nnodes": 1, "n_gpus_per_node": 8},
    "data": {"train_batch_size": 64, "max_prompt_length": 1024, "max_response_length": 512},
    "actor_rollout_ref": {"model": {"path": "Qwen/Qwen3-4B"}, "rollout": {"n": 8}},
}


def test_compare_matched_runs_median_iqr_and_tokens_per_s(
    tmp_path: Path, capsys: pytest.CaptureFixture, new_mlflow_store
) -> None:
    uri = new_mlflow_store(tmp_path / "mlflow.db")
    log_with_tracker(uri, MATCHED_LOOP, "matched", extra={"perf/total_num_tokens": [2000] * 5})
    log_with_tracker(
        uri,
        MATCHED_VERL,
        "matched",
        tags={TAG_FRAMEWORK: FRAMEWORK_VERL},
        params=VERL_PARAMS,
        extra={"perf/throughput": [2000 / s / 8 for s in MATCHED_VERL["step"]]},
    )
    assert compare.main(["--experiment", "matched", "--tracking-uri", uri, "--out", str(tmp_path)]) == 0
    out = capsys.readouterr()
    # steps 2-5 of the loop: 10, 20, 10, 20 s -> median 15, IQR 10; 2000 tokens -> 100 or 200 tokens/s
    assert "== recipe text2sql | model=Qwen3-4B nodes=1 gpus=8 prompts_per_step=64 n=8" in out.out
    assert "15.000 (10.000)" in out.out and "150 (100)" in out.out and "2.00x" in out.out
    assert "refused" not in out.err and "0 refused" in out.out
    rows = read_csv(tmp_path / "compare.csv")
    loop, verl = rows[("arctic-rl", "arctic-rl", "step")], rows[("verl", "native", "step")]
    assert (float(loop["median_s"]), float(loop["iqr_s"])) == (15, 10)
    assert (float(loop["median_tokens_per_s"]), float(loop["iqr_tokens_per_s"])) == (150, 100)
    assert (float(verl["median_s"]), float(verl["iqr_s"])) == (30, 20)
    assert float(verl["median_tokens_per_s"]) == pytest.approx(75)
    assert float(verl["iqr_tokens_per_s"]) == pytest.approx(50)
    assert float(loop["speedup"]) == 2 and float(rows[("arctic-rl", "arctic-rl", "gen")]["speedup"]) == 2
    assert loop["nodes"] == "1" and loop["max_response_length"] == "512"
    assert (tmp_path / "compare.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_compare_refuses_runs_of_different_setups(
    tmp_path: Path, capsys: pytest.CaptureFixture, new_mlflow_store
) -> None:
    uri = new_mlflow_store(tmp_path / "mlflow.db")
    two_nodes = {TAG_FRAMEWORK: FRAMEWORK_ARCTIC, TAG_BACKEND: BACKEND_ARCTIC, **SETUP, "nodes": "2", "gpus": "16"}
    log_with_tracker(uri, MATCHED_LOOP, "mixed", tags=two_nodes)
    log_with_tracker(uri, MATCHED_VERL, "mixed", tags={TAG_FRAMEWORK: FRAMEWORK_VERL}, params=VERL_PARAMS)
    assert compare.main(["--experiment", "mixed", "--tracking-uri", uri, "--out", str(tmp_path)]) == 0
    out = capsys.readouterr()
    assert (
        "not comparing arctic-rl loop with verl (native) on text2sql: setups differ in nodes: 2 vs 1; gpus: 16 vs 8"
    ) in out.err
    assert "speedup" not in out.out and "1 refused" in out.out
    rows = read_csv(tmp_path / "compare.csv")
    loop = rows[("arctic-rl", "arctic-rl", "step")]
    assert loop["speedup"] == "" and loop["nodes"] == "2"


def test_a_setup_nobody_logged_is_not_comparable() -> None:
    runs = [
        compare.RunTimings("a", "x", FRAMEWORK_ARCTIC, BACKEND_ARCTIC, {**SETUP, "n": "?"}, {"step": {1: 1.0}}),
        compare.RunTimings("b", "x", FRAMEWORK_VERL, "native", {**SETUP, "n": "?"}, {"step": {1: 2.0}}),
    ]
    rows = compare.summarize(runs)
    assert all(compare.baseline_for(r, rows) is None for r in rows)
    assert compare.refusals(rows) == [
        "not comparing arctic-rl loop with verl (native) on x: setups differ in n: ? (not logged) vs ? (not logged)"
    ]


def test_the_loop_is_measured_against_trl_when_there_is_no_verl_or_skyrl_run() -> None:
    runs = [
        compare.RunTimings("a", "x", FRAMEWORK_ARCTIC, BACKEND_ARCTIC, dict(SETUP), {"step": {1: 9.0, 2: 1.0}}),
        compare.RunTimings("b", "x", tracking.FRAMEWORK_TRL, "native", dict(SETUP), {"step": {1: 9.0, 2: 4.0}}),
    ]
    loop, trl = sorted(compare.summarize(runs), key=lambda r: r.framework)
    assert (loop.framework, trl.label) == (FRAMEWORK_ARCTIC, "trl (native)")
    assert compare.baseline_for(loop, [loop, trl]) is trl
    assert compare.speedups(loop, trl)["step"] == 4.0


def test_png_says_when_no_run_logged_tokens(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SkyRL logs no tokens per step: the tokens/s panel says so instead of an empty log-scale axis, and
    the seconds panel still has its bars."""
    figures = []
    monkeypatch.setattr(compare, "save_figure", lambda fig, path, dpi: figures.append(fig))
    setup = (("model", "tiny"),)
    rows = [
        compare.GroupRow("toy", setup, "skyrl", backend, 1, {"step": compare.Spread(s, s, s)}, {}, 5)
        for backend, s in (("arctic-rl", 0.3), ("native", 0.45))
    ]
    compare.write_png(rows, tmp_path / "compare.png")
    seconds, tokens = figures[0].axes
    assert [t.get_text() for t in tokens.texts] == [compare.NO_TOKENS_TEXT] and not tokens.patches
    assert len(seconds.patches) == 2
    with_tokens = [dataclasses.replace(r, tokens_per_s={"step": compare.Spread(9, 9, 9)}) for r in rows]
    compare.write_png(with_tokens, tmp_path / "compare.png")
    assert not figures[1].axes[1].texts and len(figures[1].axes[1].patches) == 2
