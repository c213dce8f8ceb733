"""Text-to-SQL recipe (BIRD): data, prompt, execution-match reward. See README.md.

    from recipes import text2sql
    examples = text2sql.load_examples("train", schema_tables="relevant", num_shots=2, prefill=True)
    text2sql.reward(examples[0]["assistant_prefix"] + " COUNT(*) FROM Artist\\n", examples[0])

`load_examples(split, **options)` options (the run config's `recipe.options`):
    data_dir        a BIRD-layout folder; unset = the bundled mini set, built on first use
    cache_dir       where the mini set is built (default ~/.cache/arctic-rl/text2sql-mini)
    schema_tables   "all" (default) | "relevant": only the tables the gold SQL reads
    num_shots       worked examples from the train split before the question (default 0)
    prefill         pre-fill the assistant turn with "```sql\\nSELECT" (sample with stop "```")
    num_values      sample values shown per column (default 3)
    difficulties    keep only these difficulties, e.g. ["simple"]
    limit           keep the first N examples (after filtering)
    seed            picks the worked examples (default 0)
    multiturn       the system prompt says each query's result is shown and a repeated query submits it
                    (for env.name: text2sql, the multi-turn environment of env.py)
    execution_credit, format_credit, timeout_s, transpile   the reward's options (reward.py)
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any

from pydantic import BeforeValidator, ConfigDict, ValidationInfo, field_validator, model_validator

from arctic_rl.strict import Strict, parse

# Imported eagerly, before `def reward` below: importing a submodule sets it as an attribute of
# this package, so a lazy `import recipes.text2sql.reward` would replace the `reward` function
# with the module. Imported first, the function defined afterwards wins for good.
from recipes.text2sql.reward import RewardOptions, score

SCHEMA_TABLES = ("all", "relevant")


def _int_at_least(low: int, unset_ok: bool = False):
    def check(v: Any, info: ValidationInfo) -> Any:
        if v is None and unset_ok:
            return v
        if not isinstance(v, int) or isinstance(v, bool) or v < low:
            unset = " or unset" if unset_ok else ""
            raise ValueError(f"{info.field_name} must be an integer >= {low}{unset}, got {v!r}")
        return v

    return BeforeValidator(check)


class Text2SQLOptions(Strict):
    """The recipe's options (`recipe.options` of a run config); see the module docstring."""

    model_config = ConfigDict(frozen=True, validate_assignment=False)

    data_dir: str | Path | None = None
    cache_dir: str | Path | None = None
    schema_tables: str = "all"
    num_shots: Annotated[int, _int_at_least(0)] = 0
    prefill: bool = False
    num_values: Annotated[int, _int_at_least(0)] = 3
    difficulties: tuple[str, ...] | None = None
    limit: Annotated[int | None, _int_at_least(1, unset_ok=True)] = None
    seed: int = 0
    multiturn: bool = False
    execution_credit: float = 0.1
    format_credit: float = 0.0
    timeout_s: float = 30.0
    transpile: bool = True

    @field_validator("schema_tables")
    @classmethod
    def _schema_tables(cls, v: str) -> str:
        if v not in SCHEMA_TABLES:
            raise ValueError(f"schema_tables must be one of {SCHEMA_TABLES}, got {v!r}")
        return v

    @field_validator("prefill", mode="before")
    @classmethod
    def _prefill(cls, v: Any) -> Any:
        if not isinstance(v, bool):
            raise ValueError(f"prefill must be true or false, got {v!r}")
        return v

    @field_validator("difficulties", mode="before")
    @classmethod
    def _difficulties(cls, v: Any) -> Any:
        if isinstance(v, str):
            raise ValueError(f"difficulties must be a list, got the string {v!r}")
        return v

    @model_validator(mode="after")
    def _reward(self):
        self.reward_options()  # validates now, not at the first reward
        return self

    @classmethod
    def from_dict(cls, options: Mapping[str, Any]) -> Text2SQLOptions:
        """Raises ConfigError (a ValueError) naming the option and the value."""
        return parse(cls, dict(options), name="recipe.options", noun="text2sql recipe option")

    def reward_options(self) -> dict[str, Any]:
        opts = {name: getattr(self, name) for name in RewardOptions.model_fields}
        RewardOptions.from_dict(opts)
        return opts


parse_options = Text2SQLOptions.from_dict


def load_examples(split: str, **options: Any) -> list[dict]:
    """Examples of `split` ("train" | "dev" | ...) with chat `messages`, optional
    `assistant_prefix`, and what the reward needs (`db_path`, `gold_sql`, `alt_sql`,
    `reward_options`), plus BIRD's `question_id`, `db_id`, `question`, `evidence`, `difficulty`."""
    from recipes.text2sql.build_data import ensure_mini_data
    from recipes.text2sql.data import load_bird_split
    from recipes.text2sql.prompt import PREFILL, Shot, build_messages
    from recipes.text2sql.schema import tables_in_sql

    opts = Text2SQLOptions.from_dict(options)
    data_dir = Path(opts.data_dir).expanduser() if opts.data_dir else ensure_mini_data(opts.cache_dir)
    bird = load_bird_split(data_dir, split)
    records = bird.records
    if opts.difficulties is not None:
        records = [r for r in records if r["difficulty"] in opts.difficulties]
    if opts.limit is not None:
        records = records[: opts.limit]
    shot_split = bird if (split == "train" or opts.num_shots == 0) else load_bird_split(data_dir, "train")
    shot_pool = _ShotPool(shot_split.records)
    reward_options = opts.reward_options()
    examples = []
    for rec in records:
        db_path = bird.db_path(rec["db_id"])
        tables = tables_in_sql(rec["SQL"], db_path) if opts.schema_tables == "relevant" else None
        shots = [
            Shot(s["question"], s["evidence"], s["SQL"], shot_split.db_path(s["db_id"]))
            for s in shot_pool.pick(rec, split, opts.num_shots, opts.seed)
        ]
        ex = {
            "messages": build_messages(
                rec["question"], rec["evidence"], db_path, tables, shots, opts.prefill, opts.num_values, opts.multiturn
            ),
            "question_id": rec["question_id"],
            "db_id": rec["db_id"],
            "db_path": str(db_path),
            "question": rec["question"],
            "evidence": rec["evidence"],
            "gold_sql": rec["SQL"],
            "alt_sql": rec["alt_SQL"],
            "difficulty": rec["difficulty"],
            "reward_options": reward_options,
        }
        if opts.prefill:
            ex["assistant_prefix"] = PREFILL
        examples.append(ex)
    return examples


class _ShotPool:
    """Worked-example candidates, indexed by database and difficulty (BIRD train has 9k rows)."""

    def __init__(self, records: Sequence[dict]) -> None:
        self.same_db_simple: dict[str, list[dict]] = {}
        self.same_db_other: dict[str, list[dict]] = {}
        self.records = list(records)
        for r in self.records:
            tier = self.same_db_simple if r["difficulty"] in ("simple", "unknown") else self.same_db_other
            tier.setdefault(r["db_id"], []).append(r)

    def pick(self, rec: dict, split: str, num_shots: int, seed: int) -> list[dict]:
        """`num_shots` worked examples for `rec`, never `rec` itself: simple questions on the same
        database first, then harder ones there, then any others; the same choice every run."""
        if num_shots == 0:
            return []
        rng = random.Random(f"{seed}:{split}:{rec['question_id']}")
        chosen: list[dict] = []
        tiers = (self.same_db_simple.get(rec["db_id"], []), self.same_db_other.get(rec["db_id"], []), self.records)
        for tier in tiers:
            # Sampling a few more than needed is enough to skip `rec` and earlier picks cheaply.
            for cand in rng.sample(tier, min(len(tier), num_shots + len(chosen) + 1)):
                if len(chosen) == num_shots:
                    return chosen
                if cand["question"] != rec["question"] and all(cand is not c for c in chosen):
                    chosen.append(cand)
        return chosen


def reward(completion: str, example: dict) -> float:
    """Execution match against the gold SQL (1.0), with small credits (see reward.py)."""
    return score(completion, example)


def sft_completion(example: dict) -> str | None:
    """The gold answer in the prompt's answer format, after the example's `assistant_prefix` (the SFT
    warm-up's target). None when the gold SQL cannot continue the pre-filled "SELECT" (e.g. WITH ...)."""
    from recipes.text2sql.prompt import assistant_answer

    full = assistant_answer(example["gold_sql"].strip(), Path(example["db_path"]), "assistant_prefix" in example)
    prefix = example.get("assistant_prefix", "")
    return full[len(prefix) :] if full.startswith(prefix) else None


__all__ = ["Text2SQLOptions", "load_examples", "parse_options", "reward", "sft_completion"]


# Registers the multi-turn environment "text2sql" (arctic_rl.envs) when the recipe is imported.
from recipes.text2sql import env as _env  # noqa: E402,F401
