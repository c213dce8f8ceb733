"""Recipes: data + reward + config. A recipe is the package `recipes.<name>` and exposes

    load_examples(split: str, **options) -> list[dict]
        Each example holds `messages` (chat turns, ending with the user turn), optionally
        `assistant_prefix` (text the assistant turn is pre-filled with, e.g. "```sql\\nSELECT"),
        and whatever its reward needs. `options` come from the run config's `recipe.options`.
    reward(completion: str, example: dict) -> float
        `completion` is assistant_prefix + the sampled text.

The reference loop (`arctic_rl.loop`, `arctic-rl run`) applies the model's chat template to
`messages`, appends `assistant_prefix`, samples, and scores with `reward`.
"""
