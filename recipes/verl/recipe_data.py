"""verl parquet from an arctic-rl recipe's `load_examples(split, **options)` (text2sql, longqa, ...).

    python -m recipes.verl.recipe_data --recipe text2sql --out runs/verl-text2sql \
        [--config recipes/text2sql/configs/bird_qwen3_32b.yaml] [--option data_dir=/data/bird ...] \
        [--train-split train] [--val-split dev] [--max-train N] [--max-val N]

Writes <out>/train.parquet and <out>/val.parquet, one row per example, in the layout verl's RLHFDataset reads:
`data_source` "arctic_rl/<recipe>", `prompt` the chat messages, `reward_model.ground_truth` (gold SQL / answers,
informational), `extra_info` {recipe, split, index, example: the example minus `messages`, as JSON}: what
recipes/verl/reward_fn.py hands to `recipes.<recipe>.reward`. Options come from the run config's
`recipe.options` (--config), then --option key=value (YAML values) on top.

An example with `assistant_prefix` (text2sql `prefill: true`) is refused: verl's rollout samples from the
generation prompt, with no assistant pre-fill, so the reward would score text the model never saw.
Paths in examples (text2sql `db_path`) must be readable where verl's reward workers run.
"""

from __future__ import annotations

import argparse
import importlib
import json
from pathlib import Path
from typing import Any

import yaml

from recipes.verl.gsm8k import write_parquet
from recipes.verl.reward_fn import DATA_SOURCE_PREFIX

ABILITY = {"text2sql": "sql", "longqa": "qa"}


def ground_truth(recipe: str, ex: dict) -> str:
    if "gold_sql" in ex:
        return str(ex["gold_sql"])
    if "answers" in ex:
        return json.dumps(list(ex["answers"]))
    return ""


def to_verl_rows(recipe: str, examples: list[dict], split: str) -> list[dict]:
    rows = []
    for i, ex in enumerate(examples):
        if ex.get("assistant_prefix"):
            raise ValueError(
                f"{recipe} example {i} has assistant_prefix {ex['assistant_prefix']!r} (prefill): "
                "verl's rollout does not pre-fill the assistant turn; set the recipe option prefill=false"
            )
        rest = {k: v for k, v in ex.items() if k != "messages"}
        rows.append(
            {
                "data_source": DATA_SOURCE_PREFIX + recipe,
                "prompt": [{"role": m["role"], "content": m["content"]} for m in ex["messages"]],
                "ability": ABILITY.get(recipe, recipe),
                "reward_model": {"style": "rule", "ground_truth": ground_truth(recipe, ex)},
                "extra_info": {"recipe": recipe, "split": split, "index": i, "example": json.dumps(rest, default=str)},
            }
        )
    return rows


def recipe_options(config: str | Path | None, overrides: list[str] = ()) -> dict[str, Any]:
    opts: dict[str, Any] = {}
    if config:
        cfg = yaml.safe_load(Path(config).read_text()) or {}
        opts.update(((cfg.get("recipe") or {}).get("options")) or {})
    for item in overrides:
        key, sep, val = item.partition("=")
        if not sep:
            raise ValueError(f"--option {item!r}: expected key=value")
        opts[key] = yaml.safe_load(val)
    return opts


def prepare(
    recipe: str,
    out: str | Path,
    options: dict[str, Any] | None = None,
    train_split: str = "train",
    val_split: str = "dev",
    max_train: int | None = None,
    max_val: int | None = None,
) -> tuple[Path, Path]:
    module = importlib.import_module(f"recipes.{recipe}")
    out = Path(out)
    paths = []
    for split, name, cap in ((train_split, "train", max_train), (val_split, "val", max_val)):
        examples = module.load_examples(split, **(options or {}))[:cap]
        if not examples:
            raise ValueError(f"recipe {recipe} split {split!r} has no examples")
        paths.append(write_parquet(to_verl_rows(recipe, examples, split), out / f"{name}.parquet"))
    return paths[0], paths[1]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipe", required=True, help="text2sql, longqa, or another recipes.<name> module")
    ap.add_argument("--out", required=True)
    ap.add_argument("--config", help="an arctic-rl run config: its recipe.options are the defaults")
    ap.add_argument("--option", action="append", default=[], help="recipe option key=value (YAML value)")
    ap.add_argument("--train-split", default="train")
    ap.add_argument("--val-split", default=None, help="default: dev for text2sql, validation otherwise")
    ap.add_argument("--max-train", type=int)
    ap.add_argument("--max-val", type=int)
    a = ap.parse_args(argv)
    val_split = a.val_split or ("dev" if a.recipe == "text2sql" else "validation")
    tr, va = prepare(
        a.recipe, a.out, recipe_options(a.config, a.option), a.train_split, val_split, a.max_train, a.max_val
    )
    print(f"verl data for {a.recipe}: {tr} {va}")


if __name__ == "__main__":
    main()
