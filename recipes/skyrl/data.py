"""SkyRL dataset files from an arctic-rl recipe's `load_examples(split, **options)` (toy, text2sql, longqa).

    python -m recipes.skyrl.data --recipe text2sql --out runs/skyrl-text2sql [--option difficulties=[simple]] \
        [--train-split train] [--val-split dev] [--max-train N] [--max-val N]
    python -m recipes.skyrl.data --recipe gsm8k --out runs/skyrl-gsm8k [--train FILE --test FILE]

Writes <out>/train.jsonl and <out>/validation.jsonl in the layout SkyRL's PromptDataset reads: `prompt` (the chat
messages), `env_class` ("arctic"), and two extra columns that SkyRL passes through as `env_extras`:
`arctic_recipe` (the recipe name) and `arctic_example` (the example minus `messages`, as JSON), which
recipes/skyrl/env.py scores with `recipes.<recipe>.reward`. On arctic-rl a pre-filled assistant turn (text2sql
`prefill: true`) is supported; native SkyRL refuses it (recipes/skyrl/native.py).

`--recipe gsm8k` is SkyRL's own GSM8K layout instead (env_class "gsm8k", `reward_spec.ground_truth`, scored by
skyrl-gym's gsm8k env): GSM8K jsonl from --train/--test, default the generated arithmetic set in GSM8K's format
that ships in recipes/verl/data (no download).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
from pathlib import Path
from typing import Any

import yaml

ENV_CLASS = "arctic"


def rows(recipe: str, split: str, options: dict[str, Any], limit: int | None = None) -> list[dict[str, Any]]:
    examples = importlib.import_module(f"recipes.{recipe}").load_examples(split, **options)[:limit]
    return [
        {
            "prompt": ex["messages"],
            "env_class": ENV_CLASS,
            "arctic_recipe": recipe,
            "arctic_example": json.dumps({k: v for k, v in ex.items() if k != "messages"}, default=str),
        }
        for ex in examples
    ]


def write_jsonl(records: list[dict[str, Any]], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
    os.replace(tmp, path)  # never a half-written dataset
    return path


def prepare(
    recipe: str,
    out: Path,
    options: dict[str, Any] | None = None,
    train_split: str = "train",
    val_split: str | None = None,
    max_train: int | None = None,
    max_val: int | None = None,
) -> dict[str, Path]:
    options = dict(options or {})
    paths = {"train": write_jsonl(rows(recipe, train_split, options, max_train), Path(out) / "train.jsonl")}
    if val_split:
        paths["validation"] = write_jsonl(rows(recipe, val_split, options, max_val), Path(out) / "validation.jsonl")
    return paths


def gsm8k_rows(path: Path | None, split: str, limit: int | None = None) -> list[dict[str, Any]]:
    from recipes.verl.gsm8k import DATA_DIR, INSTRUCTION, extract_solution, read_jsonl

    src = path or DATA_DIR / ("arith_train.jsonl" if split == "train" else "arith_test.jsonl")
    return [
        {
            "prompt": [{"role": "user", "content": r["question"] + " " + INSTRUCTION}],
            "env_class": "gsm8k",
            "reward_spec": {"method": "rule", "ground_truth": extract_solution(r["answer"])},
            "extra_info": {"split": split, "index": i},
        }
        for i, r in enumerate(read_jsonl(src)[:limit])
    ]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--recipe", required=True)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--option", action="append", default=[], metavar="KEY=VALUE", help="a recipe option (YAML value)")
    ap.add_argument("--train-split", default="train")
    ap.add_argument("--val-split", default=None)
    ap.add_argument("--max-train", type=int, default=None)
    ap.add_argument("--max-val", type=int, default=None)
    ap.add_argument("--train", type=Path, help="gsm8k: GSM8K-format train jsonl (default: the shipped set)")
    ap.add_argument("--test", type=Path, help="gsm8k: GSM8K-format test jsonl")
    a = ap.parse_args(argv)
    if a.recipe == "gsm8k":
        tr = write_jsonl(gsm8k_rows(a.train, "train", a.max_train), a.out / "train.jsonl")
        te = write_jsonl(gsm8k_rows(a.test, "test", a.max_val), a.out / "validation.jsonl")
        print(f"train: {tr} validation: {te}")
        return
    options = {}
    for item in a.option:
        key, sep, val = item.partition("=")
        if not sep or not key:
            ap.error(f"--option {item!r}: expected KEY=VALUE")
        options[key] = yaml.safe_load(val)
    paths = prepare(a.recipe, a.out, options, a.train_split, a.val_split, a.max_train, a.max_val)
    print(" ".join(f"{k}: {p}" for k, p in paths.items()))


if __name__ == "__main__":
    main()
