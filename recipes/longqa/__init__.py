"""Long-context multi-hop QA recipe: data (HotpotQA, 2Wiki, MuSiQue, LongBench v1, or the
synthetic default), substring-EM reward, YaRN configs.

    >>> from recipes import longqa
    >>> ex = longqa.load_examples("train", num_examples=2, context_tokens=800)[0]
    >>> sorted(ex)[:3], ex["messages"][0]["role"]
    (['all_classes', 'answers', 'id'], 'user')

Options (the run config's `recipe.options`):
  data_format    "synthetic" (default: generated in memory, see recipes.longqa.synth), "hotpotqa",
                 "2wikimqa", "musique" or "longbench"
  data_path      file (or LongBench folder of <task>.jsonl); may contain "{split}", or be a
                 {split: path} mapping. Required except for "synthetic".
  task           LongBench task ("hotpotqa", "2wikimqa", "musique", "narrativeqa", "qasper", ...)
  num_examples   keep the first N (synthetic: generate N; default 256 train / 64 otherwise)
  context_tokens passage budget: supporting passages, then distractors up to it (LongBench: the
                 whole prompt is cut in the middle to it, as LongBench's pred.py does).
                 Synthetic default 1536.
  pad_from_pool  fill the budget with passages of other questions of the split, then shuffle
  prompt_style   "longbench" (LongBench's own template; the answer is the first line) or "boxed"
                 (think, then \\boxed{answer}: for reasoning models with long responses)
  tokenizer      local tokenizer folder for exact token counts (default: whitespace estimate)
  reward_mode    "substring" (default), "exact" or "f1"
  seed           synthetic generation and pool padding (default 0)
  num_distractors, hops, question_types, filler   synthetic knobs (see recipes.longqa.synth)
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pydantic import ConfigDict, field_validator, model_validator

from arctic_rl.strict import Strict, parse
from recipes.longqa.prompts import (
    BOXED_PROMPT,
    LONGBENCH_PROMPTS,
    PROMPT_STYLES,
    fill_from_pool,
    format_passages,
    render,
    select_passages,
    truncate_middle,
    whitespace_length,
)
from recipes.longqa.reward import MODES, score
from recipes.longqa.schema import Passage, QAExample

_SPLIT_SEED_OFFSET = {"train": 0, "validation": 1, "dev": 1, "test": 2}
_SYNTH_KNOBS = ("num_distractors", "hops", "question_types", "filler")


class LongQAOptions(Strict):
    """The recipe's options (`recipe.options` of a run config); see the module docstring. load_examples reads
    the ones set (the synthetic knobs only apply when set), with the defaults there."""

    model_config = ConfigDict(frozen=True, validate_assignment=False)

    data_format: str = "synthetic"
    data_path: str | Mapping[str, Any] | None = None
    task: str | None = None
    num_examples: int | None = None
    context_tokens: int | None = None
    pad_from_pool: bool = False
    prompt_style: str = "longbench"
    tokenizer: str | None = None
    length_fn: Callable[[str], int] | None = None
    reward_mode: str = "substring"
    seed: int = 0
    cache_dir: str | Path | None = None
    num_distractors: int | None = None
    hops: int | None = None
    question_types: list[str] | None = None
    filler: str | None = None

    @field_validator("prompt_style")
    @classmethod
    def _style(cls, v: str) -> str:
        if v not in PROMPT_STYLES:
            raise ValueError(f"prompt_style must be one of {PROMPT_STYLES}, got {v!r}")
        return v

    @field_validator("reward_mode")
    @classmethod
    def _mode(cls, v: str) -> str:
        if v not in MODES:
            raise ValueError(f"reward_mode must be one of {MODES}, got {v!r}")
        return v

    @model_validator(mode="after")
    def _pool_needs_budget(self):
        if self.pad_from_pool and self.context_tokens is None:
            raise ValueError("recipe.options.pad_from_pool needs context_tokens (the budget to fill), got None")
        return self


_KNOWN_OPTIONS = frozenset(LongQAOptions.model_fields)


def parse_options(options: Mapping[str, Any]) -> LongQAOptions:
    """Raises ConfigError (a ValueError) naming the option and the value."""
    return parse(LongQAOptions, dict(options), name="recipe.options", noun="option")


def load_examples(split: str, **options: Any) -> list[dict]:
    """Examples in the recipe contract's shape: `messages`, `answers`, and what `reward` needs."""
    options = parse_options(options).model_dump(exclude_unset=True)  # the options set, validated
    style = options.get("prompt_style", "longbench")
    mode = options.get("reward_mode", "substring")
    tokenizer = _load_tokenizer(options.get("tokenizer"))
    length_fn = options.get("length_fn") or (
        (lambda text: len(tokenizer.encode(text, add_special_tokens=False))) if tokenizer else whitespace_length
    )
    examples = _load_raw(split, options)
    num = options.get("num_examples")
    if num is not None:
        examples = examples[:num]
    pool = [p for ex in examples for p in ex.passages] if options.get("pad_from_pool") else []
    seed = int(options.get("seed", 0))
    return [
        _to_contract(
            ex,
            i,
            style=style,
            mode=mode,
            context_tokens=options.get(
                "context_tokens", 1536 if options.get("data_format", "synthetic") == "synthetic" else None
            ),
            pool=pool,
            seed=seed,
            length_fn=length_fn,
            tokenizer=tokenizer,
        )
        for i, ex in enumerate(examples)
    ]


def reward(completion: str, example: dict) -> float:
    return score(
        completion,
        example["answers"],
        mode=example.get("reward_mode", "substring"),
        wrong_answers=example.get("wrong_answers") or (),
    )


def _load_tokenizer(path: str | None) -> Any:
    if path is None:
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path, local_files_only=True)


def _data_path(split: str, data_path: Any) -> str:
    if isinstance(data_path, Mapping):
        if split not in data_path:
            raise ValueError(f"recipe.options.data_path has no entry for split {split!r}; it has {sorted(data_path)}")
        return str(data_path[split])
    if not isinstance(data_path, str) or not data_path:
        raise ValueError(
            f"recipe.options.data_path must be a path, a '{{split}}' pattern or a mapping, got {data_path!r}"
        )
    return data_path.replace("{split}", split)


def _load_raw(split: str, options: Mapping[str, Any]) -> list[QAExample]:
    from recipes.longqa import data, synth  # data imports `datasets` lazily; keep reward imports light

    data_format = options.get("data_format", "synthetic")
    if data_format == "synthetic" and options.get("data_path") is None:
        if split not in _SPLIT_SEED_OFFSET:
            raise ValueError(f"split must be one of {sorted(_SPLIT_SEED_OFFSET)} for synthetic data, got {split!r}")
        knobs = {k: options[k] for k in _SYNTH_KNOBS if options.get(k) is not None}
        num = options.get("num_examples") or (256 if split == "train" else 64)
        # Each split its own seed, so test questions are not train questions.
        seed = int(options.get("seed", 0)) * 10 + _SPLIT_SEED_OFFSET[split]
        records = synth.generate(num, seed=seed, context_tokens=int(options.get("context_tokens") or 1536), **knobs)
        return [data.from_hotpotqa_record(r, i, source="synthetic") for i, r in enumerate(records)]
    if data_format == "synthetic":
        unused = [k for k in _SYNTH_KNOBS if k in options]
        if unused:
            raise ValueError(
                f"recipe.options {unused} only apply when generating; data_path "
                f"{options['data_path']!r} was given, so the file's questions are used as written"
            )
    return data.load_file(
        data_format,
        _data_path(split, options.get("data_path")),
        task=options.get("task"),
        cache_dir=options.get("cache_dir"),
    )


def _to_contract(
    ex: QAExample,
    index: int,
    *,
    style: str,
    mode: str,
    context_tokens: int | None,
    pool: list[Passage],
    seed: int,
    length_fn: Callable[[str], int],
    tokenizer: Any,
) -> dict:
    if ex.context is not None:  # LongBench: a finished context, cut in the middle like pred.py
        task = ex.source.split("/", 1)[1]
        template = LONGBENCH_PROMPTS[task] if style == "longbench" else BOXED_PROMPT
        prompt = render(template, ex.context, ex.question)
        if context_tokens is not None:
            prompt = truncate_middle(prompt, context_tokens, length_fn, tokenizer)
    else:
        passages = select_passages(ex.passages, context_tokens, length_fn)
        if pool and context_tokens is not None:
            passages = fill_from_pool(passages, pool, context_tokens, random.Random(f"{seed}:{ex.id}"), length_fn)
        template = LONGBENCH_PROMPTS["hotpotqa"] if style == "longbench" else BOXED_PROMPT
        prompt = render(template, format_passages(passages), ex.question)
    return {
        "messages": [{"role": "user", "content": prompt}],
        "answers": list(ex.answers),
        "id": ex.id,
        "source": ex.source,
        "type": ex.type,
        "reward_mode": mode,
        "length": ex.length,
        "all_classes": ex.all_classes,
        "wrong_answers": list(ex.wrong_answers),
    }
