"""LongBench v1 QA scores, computed exactly as LongBench's eval.py does.

    python -m evals.longbench --pred-dir pred/my_model --out result.json
    python -m evals.longbench --model exports/step_200 --data-dir longbench/data --pred-dir pred/step_200 \
        [--gpus 8 --tensor-parallel-size 4 --max-model-len 32768]

--pred-dir holds LongBench's prediction layout: one `<task>.jsonl` per task, each line
{"pred", "answers", "all_classes", "length"}. Per task: the best token F1 (LongBench's
qa_f1_score and normalize_answer) of each prediction over its answers, averaged, x100, rounded
to 2 decimals; trec/triviaqa/samsum/lsht predictions are cut to their first line first, as in
eval.py. `--by-length` adds LongBench-E's 0-4k / 4-8k / 8k+ buckets (by the `length` field).
The report's `average` is the mean of the task scores (the recipe's five QA tasks by default).

With --model (a Hugging Face folder, e.g. from `arctic-rl export`), predictions are first generated
with vLLM alone (greedy, LongBench's per-task max new tokens, prompts cut in the middle to
--max-prompt-tokens as pred.py does; evals/sampler.py: --gpus, --tensor-parallel-size, --max-model-len).
Known limit: only the English QA tasks (token-F1 metric) are scored; summarization, code and
Chinese tasks need rouge/fuzzywuzzy/jieba and are refused by name.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from evals.sampler import VLLMOptions, add_vllm_args
from recipes.longqa.reward import token_f1

DEFAULT_TASKS: tuple[str, ...] = ("hotpotqa", "2wikimqa", "musique", "narrativeqa", "qasper")
# Tasks scored with qa_f1_score in LongBench's eval.py (English).
QA_F1_TASKS: tuple[str, ...] = (
    "narrativeqa",
    "qasper",
    "multifieldqa_en",
    "hotpotqa",
    "2wikimqa",
    "musique",
    "triviaqa",
)
FIRST_LINE_TASKS = frozenset({"trec", "triviaqa", "samsum", "lsht"})
LENGTH_BUCKETS: tuple[tuple[str, float], ...] = (("0-4k", 4000), ("4-8k", 8000), ("8k+", float("inf")))


def qa_f1_score(prediction: str, ground_truth: str) -> float:
    """LongBench's qa_f1_score: token F1 after the official (ASCII) normalize_answer."""
    return token_f1(prediction, ground_truth, unicode=False)


def example_score(task: str, prediction: str, answers: Sequence[str]) -> float:
    _check_task(task)
    if task in FIRST_LINE_TASKS:
        prediction = prediction.lstrip("\n").split("\n")[0]
    return max([0.0] + [qa_f1_score(prediction, truth) for truth in answers])


def task_score(task: str, predictions: Sequence[str], answers: Sequence[Sequence[str]]) -> float:
    if not predictions:
        raise ValueError(f"task {task!r} has no predictions to score")
    total = sum(example_score(task, p, a) for p, a in zip(predictions, answers, strict=True))
    return round(100 * total / len(predictions), 2)


def task_score_by_length(
    task: str, predictions: Sequence[str], answers: Sequence[Sequence[str]], lengths: Sequence[int]
) -> dict[str, float | None]:
    """LongBench-E's buckets; an empty bucket is None (LongBench's numpy mean gives nan)."""
    buckets: dict[str, list[float]] = {name: [] for name, _ in LENGTH_BUCKETS}
    for prediction, truths, length in zip(predictions, answers, lengths, strict=True):
        name = next(n for n, upper in LENGTH_BUCKETS if length < upper)
        buckets[name].append(example_score(task, prediction, truths))
    return {name: round(100 * sum(s) / len(s), 2) if s else None for name, s in buckets.items()}


def _check_task(task: str) -> None:
    if task not in QA_F1_TASKS:
        raise ValueError(f"task {task!r} is not scored here; supported: {list(QA_F1_TASKS)}")


def read_predictions(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        raise FileNotFoundError(f"prediction file {str(path)!r} does not exist")
    rows = []
    with path.open(encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            row = json.loads(line)
            for key in ("pred", "answers"):
                if key not in row:
                    raise ValueError(f"{path}:{number}: field {key!r} is missing")
            if not isinstance(row["answers"], list):
                raise ValueError(f"{path}:{number}: field 'answers' must be a list, got {row['answers']!r}")
            rows.append(row)
    return rows


def resolve_tasks(pred_dir: Path, tasks: Sequence[str] | None) -> list[str]:
    """None: the five default tasks; ["all"]: every supported task with a file in pred_dir."""
    if not tasks:
        return list(DEFAULT_TASKS)
    if list(tasks) == ["all"]:
        found = [t for t in QA_F1_TASKS if (pred_dir / f"{t}.jsonl").is_file()]
        if not found:
            raise FileNotFoundError(f"no <task>.jsonl for any of {list(QA_F1_TASKS)} in {str(pred_dir)!r}")
        return found
    for task in tasks:
        _check_task(task)
    return list(tasks)


def evaluate(
    pred_dir: Path, tasks: Sequence[str] | None = None, by_length: bool = False, progress: bool = True
) -> dict[str, Any]:
    from tqdm import tqdm

    names = resolve_tasks(pred_dir, tasks)
    report: dict[str, Any] = {"pred_dir": str(pred_dir), "tasks": names, "scores": {}, "num_examples": {}}
    if by_length:
        report["scores_by_length"] = {}
    for task in tqdm(names, desc="longbench", unit="task", disable=not progress):
        rows = read_predictions(pred_dir / f"{task}.jsonl")
        predictions, answers = [r["pred"] for r in rows], [r["answers"] for r in rows]
        report["scores"][task] = task_score(task, predictions, answers)
        report["num_examples"][task] = len(rows)
        if by_length:
            missing = [i for i, r in enumerate(rows) if "length" not in r]
            if missing:
                raise ValueError(f"{task}.jsonl: --by-length needs field 'length'; line {missing[0] + 1} has none")
            report["scores_by_length"][task] = task_score_by_length(
                task, predictions, answers, [r["length"] for r in rows]
            )
    report["average"] = round(sum(report["scores"].values()) / len(names), 2)
    return report


def write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def generate_predictions(
    model: str,
    data_dir: Path,
    pred_dir: Path,
    tasks: Iterable[str],
    *,
    max_prompt_tokens: int = 31500,
    options: VLLMOptions | None = None,
) -> None:
    """Writes `<pred_dir>/<task>.jsonl` for each task by greedy generation with vLLM (evals.sampler: no
    trainer is deployed). A YaRN model needs its rope scaling in its config (an export has it) or in
    `options.hf_overrides`."""
    from transformers import AutoTokenizer

    from evals.sampler import generate
    from recipes.longqa import load_examples
    from recipes.longqa.prompts import LONGBENCH_MAX_NEW_TOKENS, LONGBENCH_NO_CHAT_TEMPLATE

    tokenizer = AutoTokenizer.from_pretrained(model, local_files_only=True)
    per_task: dict[str, list[dict]] = {}
    prompts: list[list[int]] = []
    sampling: list[dict[str, Any]] = []
    for task in tasks:
        _check_task(task)
        # Cut to the budget like pred.py, with the model's own tokenizer.
        per_task[task] = load_examples(
            "test",
            data_format="longbench",
            data_path=str(data_dir),
            task=task,
            context_tokens=max_prompt_tokens,
            tokenizer=model,
        )
        templated = task not in LONGBENCH_NO_CHAT_TEMPLATE
        # A chat template already holds any BOS; a raw prompt gets the tokenizer's own.
        prompts += [
            tokenizer(_chat_prompt(tokenizer, ex["messages"], templated), add_special_tokens=not templated)["input_ids"]
            for ex in per_task[task]
        ]
        sampling += [{"max_tokens": LONGBENCH_MAX_NEW_TOKENS[task], "temperature": 0.0}] * len(per_task[task])
    texts = iter(generate(model, prompts, sampling, options or VLLMOptions()))  # one engine for all tasks
    for task, examples in per_task.items():
        lines = [
            json.dumps(
                {
                    "pred": next(texts),
                    "answers": ex["answers"],
                    "all_classes": ex["all_classes"],
                    "length": ex["length"],
                },
                ensure_ascii=False,
            )
            for ex in examples
        ]
        write_atomic(pred_dir / f"{task}.jsonl", "".join(line + "\n" for line in lines))


def _chat_prompt(tokenizer: Any, messages: list[dict[str, str]], use_template: bool) -> str:
    if not use_template:
        return messages[-1]["content"]
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Score LongBench v1 QA predictions (as LongBench's eval.py).")
    parser.add_argument("--pred-dir", required=True, type=Path, help="folder of <task>.jsonl predictions")
    parser.add_argument("--out", type=Path, default=None, help="JSON report (default: <pred-dir>/result.json)")
    parser.add_argument("--tasks", nargs="+", default=None, help=f"default {list(DEFAULT_TASKS)}; 'all': every file")
    parser.add_argument("--by-length", action="store_true", help="also LongBench-E length buckets")
    parser.add_argument("--model", default=None, help="generate predictions with this model first")
    parser.add_argument("--data-dir", type=Path, default=None, help="LongBench data folder (<task>.jsonl), for --model")
    parser.add_argument("--max-prompt-tokens", type=int, default=31500)
    add_vllm_args(parser)
    args = parser.parse_args(argv)
    if args.model is not None:
        if args.data_dir is None:
            parser.error("--model needs --data-dir (LongBench's <task>.jsonl files)")
        try:
            options = VLLMOptions.from_args(args)
        except ValueError as e:
            parser.error(str(e))
        # "all" here means every supported task that has a data file.
        generate_predictions(
            args.model,
            args.data_dir,
            args.pred_dir,
            resolve_tasks(args.data_dir, args.tasks),
            max_prompt_tokens=args.max_prompt_tokens,
            options=options,
        )
    report = evaluate(args.pred_dir, args.tasks, by_length=args.by_length)
    out = args.out or args.pred_dir / "result.json"
    write_atomic(out, json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    per_task = ", ".join(f"{t} {s:.2f}" for t, s in report["scores"].items())
    print(f"LongBench QA average {report['average']:.2f} over {len(report['tasks'])} tasks ({per_task}) -> {out}")


if __name__ == "__main__":
    main()
