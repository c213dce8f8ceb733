"""BIRD execution accuracy (EX), computed as BIRD's official evaluation computes it.

    python -m evals.bird --data DIR --split dev --predictions predict_dev.json [--out report.json]
    python -m evals.bird --data DIR --split dev --model exports/step_200 --predictions predict_dev.json \
        [--gpus 8 --tensor-parallel-size 2]

--predictions is BIRD's official prediction file: {"<question_id>": "<SQL>\\t----- bird -----\\t<db_id>"}.
A prediction is correct when it and the gold SQL both run on the question's database and their
results are equal as sets of rows (BIRD's `set(predicted_res) == set(ground_truth_res)`); an
error, a timeout (30 s, BIRD's meta_time_out) or a missing prediction counts as wrong. EX is
correct / count x 100, overall and per difficulty (simple / moderate / challenging), with
counts, as BIRD prints it. Predictions run through the same sandbox as the training reward
(read-only, out of process), so a hostile prediction file cannot change the databases.

With --model (a Hugging Face folder, e.g. from `arctic-rl export`), predictions are first generated
(greedy) with vLLM alone (evals/sampler.py: --gpus, --tensor-parallel-size, --max-model-len, ...) and
written to --predictions in the official format, then scored.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tqdm import tqdm

from evals.sampler import VLLMOptions, add_vllm_args
from recipes.text2sql.data import load_bird_split
from recipes.text2sql.reward import results_match
from recipes.text2sql.sandbox import SQLSandbox

BIRD_SEPARATOR = "\t----- bird -----\t"
DIFFICULTIES = ("simple", "moderate", "challenging")
BIRD_TIMEOUT_S = 30.0


def parse_predictions(path: Path) -> dict[int, tuple[str, str | None]]:
    """question_id -> (SQL, db_id or None) from an official BIRD prediction file."""
    try:
        raw = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ValueError(f"cannot read predictions file {path}: {e}") from e
    if not isinstance(raw, dict):
        raise ValueError(
            f"predictions file {path} must hold a JSON object "
            f'{{"<question_id>": "<SQL>{BIRD_SEPARATOR!r}<db_id>"}}, got {type(raw).__name__}'
        )
    out: dict[int, tuple[str, str | None]] = {}
    for key, value in raw.items():
        try:
            qid = int(key)
        except ValueError:
            raise ValueError(f"predictions file {path}: key {key!r} is not a question_id") from None
        if not isinstance(value, str):
            raise ValueError(f"predictions file {path}: value of {key!r} must be a string, got {value!r}")
        sql, sep, db_id = value.partition(BIRD_SEPARATOR)
        out[qid] = (sql.strip(), db_id.strip() if sep else None)
    return out


def format_prediction(sql: str, db_id: str) -> str:
    # BIRD's files hold one line per query: newlines inside the SQL become spaces.
    return " ".join(sql.split()) + BIRD_SEPARATOR + db_id


def evaluate(
    data_dir: Path,
    split: str,
    predictions: dict[int, tuple[str, str | None]],
    timeout_s: float = BIRD_TIMEOUT_S,
    num_workers: int | None = None,
) -> dict[str, Any]:
    """The EX report: {"ex", "count", "correct", "by_difficulty": {d: {"ex", "count", "correct"}},
    "missing": [...question ids without a prediction], "results": {qid: bool}}."""
    bird = load_bird_split(data_dir, split)
    records = bird.records
    by_id = {r["question_id"]: r for r in records}
    for qid, (_, db_id) in predictions.items():
        rec = by_id.get(qid)
        if rec is not None and db_id is not None and db_id != rec["db_id"]:
            raise ValueError(
                f"prediction for question_id {qid} names db_id {db_id!r}, but the question is on {rec['db_id']!r}"
            )
    queries = [(bird.db_path(r["db_id"]), r["SQL"]) for r in records]
    have = [r for r in records if r["question_id"] in predictions]
    queries += [(bird.db_path(r["db_id"]), predictions[r["question_id"]][0]) for r in have]
    with (
        SQLSandbox(num_workers=num_workers) as box,
        tqdm(total=len(queries), desc=f"BIRD {split} EX", unit="query") as bar,
    ):
        results = box.execute_many(queries, timeout_s=timeout_s, on_done=bar.update)
    gold = dict(zip((r["question_id"] for r in records), results[: len(records)]))
    pred = dict(zip((r["question_id"] for r in have), results[len(records) :]))
    correct = {
        r["question_id"]: r["question_id"] in pred and results_match(pred[r["question_id"]], gold[r["question_id"]])
        for r in records
    }
    missing = sorted(r["question_id"] for r in records if r["question_id"] not in predictions)
    return _report(records, correct, missing)


def _report(records: Sequence[dict], correct: dict[int, bool], missing: list[int]) -> dict[str, Any]:
    def summary(rows: Sequence[dict]) -> dict[str, Any]:
        n = len(rows)
        c = sum(correct[r["question_id"]] for r in rows)
        return {"ex": round(100.0 * c / n, 2) if n else 0.0, "count": n, "correct": c}

    report: dict[str, Any] = summary(records)
    report["by_difficulty"] = {d: summary([r for r in records if r["difficulty"] == d]) for d in DIFFICULTIES}
    others = sorted({r["difficulty"] for r in records} - set(DIFFICULTIES))
    for d in others:  # e.g. "unknown" for BIRD's train split, which has no difficulties
        report["by_difficulty"][d] = summary([r for r in records if r["difficulty"] == d])
    report["missing"] = missing
    report["results"] = {str(qid): ok for qid, ok in sorted(correct.items())}
    return report


def print_report(report: dict[str, Any], out: Any = None) -> None:
    """BIRD's table: one row of counts, one of accuracies, per difficulty and in total."""
    out = out or sys.stdout  # looked up per call, so redirected stdout is honoured
    cols = [*report["by_difficulty"], "total"]
    counts = [report["by_difficulty"][d]["count"] for d in report["by_difficulty"]] + [report["count"]]
    accs = [report["by_difficulty"][d]["ex"] for d in report["by_difficulty"]] + [report["ex"]]
    print("{:20} ".format("") + " ".join(f"{c:>12}" for c in cols), file=out)
    print("{:20} ".format("count") + " ".join(f"{c:>12}" for c in counts), file=out)
    print("=" * (21 + 13 * len(cols)), file=out)
    print("{:20} ".format("execution accuracy") + " ".join(f"{a:>12.2f}" for a in accs), file=out)


def generate_predictions(
    examples: Sequence[dict], model_path: str, *, max_tokens: int = 4096, options: VLLMOptions | None = None
) -> dict[int, str]:
    """question_id -> SQL, by greedy generation with vLLM (evals.sampler: no trainer is deployed). Prompts
    are the examples' messages with the model's chat template applied, plus the example's assistant_prefix;
    generation stops at the closing fence when the prefix opened one."""
    from transformers import AutoTokenizer

    from evals.sampler import generate
    from recipes.text2sql.extract import extract_sql

    tokenizer = AutoTokenizer.from_pretrained(model_path, local_files_only=True)
    prefixes = [ex.get("assistant_prefix", "") for ex in examples]
    prompts = [
        tokenizer.apply_chat_template(ex["messages"], tokenize=False, add_generation_prompt=True) + p
        for ex, p in zip(examples, prefixes)
    ]
    # The template already holds any BOS: no special tokens added again.
    ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
    stop = ["```"] if any(prefixes) else []
    texts = generate(
        model_path, ids, {"max_tokens": max_tokens, "temperature": 0.0, "stop": stop}, options or VLLMOptions()
    )
    # An answer without SQL still gets an entry (an empty query is wrong, not missing).
    return {ex["question_id"]: extract_sql(p + t) or "" for ex, p, t in zip(examples, prefixes, texts)}


def write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", type=Path, required=True, help="BIRD-layout folder (dev.json, dev_databases/)")
    parser.add_argument("--split", default="dev")
    parser.add_argument(
        "--predictions", type=Path, required=True, help="official prediction file (read; written first with --model)"
    )
    parser.add_argument("--out", type=Path, help="write the report as JSON here")
    parser.add_argument("--model", help="generate the predictions with this model first")
    parser.add_argument("--max-tokens", type=int, default=4096, help="with --model: tokens per answer")
    parser.add_argument(
        "--recipe-options",
        default="{}",
        help="with --model: JSON of text2sql prompt options, e.g. '{\"num_shots\": 2}'",
    )
    parser.add_argument("--timeout-s", type=float, default=BIRD_TIMEOUT_S)
    parser.add_argument("--num-workers", type=int, default=None, help="sandbox worker processes")
    add_vllm_args(parser)
    args = parser.parse_args(argv)
    if args.model:
        try:
            vllm_options = VLLMOptions.from_args(args)
        except ValueError as e:
            parser.error(str(e))
        from recipes.text2sql import load_examples

        options = {**json.loads(args.recipe_options), "data_dir": str(args.data)}
        examples = load_examples(args.split, **options)
        sqls = generate_predictions(examples, args.model, max_tokens=args.max_tokens, options=vllm_options)
        preds = {str(ex["question_id"]): format_prediction(sqls[ex["question_id"]], ex["db_id"]) for ex in examples}
        write_atomic(args.predictions, json.dumps(preds, indent=4, ensure_ascii=False) + "\n")
    report = evaluate(args.data, args.split, parse_predictions(args.predictions), args.timeout_s, args.num_workers)
    print_report(report)
    if args.out:
        write_atomic(args.out, json.dumps(report, indent=2) + "\n")
    print(
        f"[bird] EX {report['ex']:.2f}% ({report['correct']}/{report['count']}) on {args.split}; "
        f"{len(report['missing'])} without a prediction",
        file=sys.stderr,
    )
    return report


if __name__ == "__main__":
    main()
