"""LongBench v1 scoring on a hand-written prediction folder; expected numbers worked by hand
(token F1 after LongBench's normalize_answer, best over answers, mean x100, 2 decimals)."""

import json
import shutil
import subprocess
import sys

import pytest
from repo_paths import REPO, TESTS

from evals import longbench

PRED = TESTS / "data" / "longqa" / "longbench_pred"
ROOT = REPO

# hotpotqa: 1.0 (articles dropped) + 2/3 ([paris, france] vs [paris]) + 0 + 2/3 (not cut to its
#   first line: [new, york, city, extra] vs [new, york]) -> 2.3333 / 4 = 58.33
# 2wikimqa: 1.0 + 2/3 ("1,000 people" -> [1000, people]) -> 83.33
# musique: 1.0 ("an apple a day" -> "apple day") + 0.5 (são != sao) + 0 (empty) -> 50.00
# narrativeqa: max(2/3 vs "he killed dragon", 0.4 vs "dragon dies") -> 66.67
# qasper: 1.0 + max(1/3·1 -> 0.5 for "bert", 0.5 for "elmo") + 0 (curly quotes are kept) -> 50.00
EXPECTED = {"hotpotqa": 58.33, "2wikimqa": 83.33, "musique": 50.0, "narrativeqa": 66.67, "qasper": 50.0}


def test_default_tasks_and_average():
    report = longbench.evaluate(PRED, progress=False)
    assert report["tasks"] == list(longbench.DEFAULT_TASKS)
    assert report["scores"] == EXPECTED
    assert report["num_examples"] == {"hotpotqa": 4, "2wikimqa": 2, "musique": 3, "narrativeqa": 1, "qasper": 3}
    assert report["average"] == 61.67  # (58.33 + 83.33 + 50 + 66.67 + 50) / 5 = 61.666


def test_first_line_rule_for_triviaqa():
    # "\n\nParis\n..." -> "Paris" (1.0); "Lyon\nParis" -> "Lyon" (0.0)
    report = longbench.evaluate(PRED, ["triviaqa"], progress=False)
    assert report["scores"] == {"triviaqa": 50.0} and report["average"] == 50.0


def test_length_buckets():
    report = longbench.evaluate(PRED, ["hotpotqa"], by_length=True, progress=False)
    # lengths 3000 / 3999 -> 0-4k (1.0, 2/3); 5000 -> 4-8k (2/3); 9000 -> 8k+ (0)
    assert report["scores_by_length"]["hotpotqa"] == {"0-4k": 83.33, "4-8k": 66.67, "8k+": 0.0}


def test_all_tasks_found_in_the_folder():
    report = longbench.evaluate(PRED, ["all"], progress=False)
    assert set(report["tasks"]) == set(EXPECTED) | {"triviaqa"}


def test_empty_bucket_is_none():
    assert longbench.task_score_by_length("hotpotqa", ["x"], [["x"]], [10]) == {
        "0-4k": 100.0,
        "4-8k": None,
        "8k+": None,
    }


def test_bad_inputs_are_named(tmp_path):
    with pytest.raises(ValueError, match="gov_report"):
        longbench.evaluate(PRED, ["gov_report"], progress=False)
    with pytest.raises(FileNotFoundError, match="hotpotqa.jsonl"):
        longbench.evaluate(tmp_path, progress=False)
    (tmp_path / "hotpotqa.jsonl").write_text(json.dumps({"answers": ["x"]}) + "\n")
    with pytest.raises(ValueError, match="'pred'"):
        longbench.evaluate(tmp_path, ["hotpotqa"], progress=False)


def test_cli_writes_report_and_summary(tmp_path):
    pred_dir = tmp_path / "pred"
    shutil.copytree(PRED, pred_dir)
    done = subprocess.run(
        [sys.executable, "-m", "evals.longbench", "--pred-dir", str(pred_dir)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    summary = done.stdout.strip().splitlines()[-1]
    assert summary.startswith("LongBench QA average 61.67 over 5 tasks (hotpotqa 58.33, 2wikimqa 83.33")
    report = json.loads((pred_dir / "result.json").read_text())
    assert report["scores"] == EXPECTED
