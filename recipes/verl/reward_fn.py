"""verl `custom_reward_function` for arctic-rl recipes (text2sql, longqa, any module with the recipe contract):

    reward.custom_reward_function.path=recipes/verl/reward_fn.py reward.custom_reward_function.name=compute_score

Rows come from `python -m recipes.verl.recipe_data` (data_source "arctic_rl/<recipe>"; extra_info carries the
recipe name and the example, JSON, minus its chat messages). The score is `recipes.<recipe>.reward(solution_str,
example)`: the same function the arctic-rl loop uses, scored in arctic_rl.rewards' process pool. Used the same way by verl on arctic-rl and by native verl.
"""

from __future__ import annotations

import importlib
import json
from typing import Any

from arctic_rl.rewards import score_one

DATA_SOURCE_PREFIX = "arctic_rl/"


def example_of(extra_info: Any) -> tuple[str, dict]:
    """(recipe name, example dict) stored in a row's extra_info by recipes.verl.recipe_data."""
    if not isinstance(extra_info, dict) or "recipe" not in extra_info or "example" not in extra_info:
        raise ValueError(
            "extra_info has no recipe/example: write the parquet with `python -m recipes.verl.recipe_data`"
            f" (got {type(extra_info).__name__} {sorted(extra_info) if isinstance(extra_info, dict) else ''})"
        )
    example = extra_info["example"]
    return str(extra_info["recipe"]), json.loads(example) if isinstance(example, str) else dict(example)


def compute_score(
    data_source: str, solution_str: str, ground_truth: Any = None, extra_info: Any = None, **kwargs: Any
) -> float:
    recipe, example = example_of(extra_info)
    if data_source and data_source.startswith(DATA_SOURCE_PREFIX) and data_source[len(DATA_SOURCE_PREFIX) :] != recipe:
        raise ValueError(f"data_source {data_source!r} does not match extra_info recipe {recipe!r}")
    module = importlib.import_module(f"recipes.{recipe}")
    # verl's reward loop calls this from a thread per sample: each call takes a worker process of the pool
    # (sized by this node's CPUs), so CPU-bound scoring runs in parallel; the score is the same.
    return score_one(module.reward, solution_str, example)
