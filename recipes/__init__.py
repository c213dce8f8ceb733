"""Recipes: data + reward + config. A recipe is the package `recipes.<name>` and exposes

    load_examples(split: str, **options) -> list[dict]
        Each example holds `messages` (chat turns, ending with the user turn), optionally
        `assistant_prefix` (text the assistant turn is pre-filled with, e.g. "```sql\\nSELECT"),
        and whatever its reward needs. `options` come from the run config's `recipe.options`.
    reward(completion: str, example: dict) -> float
        `completion` is assistant_prefix + the sampled text.
    parse_options(options: dict) -> a strict model of the options (optional)
        Raises ConfigError naming a bad option and the allowed ones (arctic_rl.strict.parse). The run config
        calls it when it parses, on `recipe.options` and on the eval / sft_warmup options merged over them.

The reference loop (`arctic_rl.loop`, `arctic-rl run`) applies the model's chat template to
`messages`, appends `assistant_prefix`, samples, and scores with `reward`.
"""
