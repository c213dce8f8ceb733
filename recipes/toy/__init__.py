"""Toy recipe: short prompts, a reward any model can climb. For tests and benchmarks only.

The reward is the fraction of the completion's non-space characters that are in `target`
(default the vowels). A tiny random model starts around the vowel share of its vocabulary and GRPO
moves it up within a few steps, so the loop's plumbing shows a learning signal in seconds.

    load_examples("train", num_examples=32, prompt_words=4, seed=0)
    reward("aeiou x", {"target": "aeiou"}) == 5 / 6
"""

from __future__ import annotations

import random
from typing import Any

from pydantic import Field

from arctic_rl.strict import Strict, parse

WORDS = [
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "lazy",
    "dog",
    "select",
    "count",
    "from",
    "tracks",
    "where",
    "genre",
    "rock",
    "albums",
    "artist",
    "answer",
    "paris",
    "born",
    "plus",
    "minus",
    "times",
]
SPLITS = ("train", "test")


class ToyOptions(Strict):
    """The recipe's options (`recipe.options` of a run config): load_examples' keyword arguments."""

    num_examples: int = Field(64, ge=1)
    prompt_words: int = Field(4, ge=1)
    target: str = Field("aeiou", min_length=1, description="the characters the reward counts")
    seed: int = 0
    filler_words: int = Field(0, ge=0)


def parse_options(options: dict[str, Any]) -> ToyOptions:
    """Raises ConfigError (a ValueError) naming the option and the value."""
    return parse(ToyOptions, options, name="recipe.options", noun="toy recipe option")


def load_examples(
    split: str,
    num_examples: int = 64,
    prompt_words: int = 4,
    target: str = "aeiou",
    seed: int = 0,
    filler_words: int = 0,
) -> list[dict]:
    """`filler_words` > 0 prepends that many words of shared context to every prompt (long-prompt
    benchmarks: the G responses of a prompt share it)."""
    if split not in SPLITS:
        raise ValueError(f"toy: split={split!r}; expected one of {list(SPLITS)}")
    parse_options(
        {
            "num_examples": num_examples,
            "prompt_words": prompt_words,
            "target": target,
            "seed": seed,
            "filler_words": filler_words,
        }
    )
    rng = random.Random(f"{seed}-{split}")
    out = []
    for i in range(num_examples):
        words = " ".join(rng.choice(WORDS) for _ in range(prompt_words))
        filler = " ".join(rng.choice(WORDS) for _ in range(filler_words))
        content = (filler + "\n" if filler else "") + f"repeat: {words}"
        out.append(
            {
                "id": f"toy-{split}-{i}",
                "messages": [{"role": "user", "content": content}],
                "assistant_prefix": "",
                "target": target,
            }
        )
    return out


def reward(completion: str, example: dict[str, Any]) -> float:
    chars = [c for c in completion if not c.isspace()]
    if not chars:
        return 0.0
    target = set(example.get("target", "aeiou"))
    return sum(c in target for c in chars) / len(chars)


def sft_completion(example: dict[str, Any]) -> str:
    """A full-reward completion (the target characters), for the loop's SFT warm-up tests."""
    return " ".join(example.get("target", "aeiou"))
