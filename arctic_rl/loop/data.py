"""What the reference loop (arctic_rl.loop) and its stages (SFT warm-up, eval) feed the engines: which examples
a step takes, its sampling seed, the prompt tokens of an example, a stage's recipe options.

The data order and the seeds are pure functions of (seed, step), so a resumed run needs no data state.
"""

from __future__ import annotations

import numpy as np


def step_indices(step: int, num_examples: int, per_step: int, seed: int, draw: int = 0) -> list[int]:
    """Example indices of `step` (1-based): a pure function of (seed, step), so resume needs no data state.
    Epoch e visits the examples in permutation(seed, e); steps run across epoch boundaries. Draw d > 0 is the
    step's d-th extra batch (dynamic sampling: arctic_rl.rollout.dynamic), drawn at random from (seed, step, d)
    outside the epoch order, so the steps after it take the prompts they would have taken without it."""
    if draw:
        return [int(i) for i in np.random.default_rng([seed, step, draw, 13]).integers(num_examples, size=per_step)]
    out = []
    for g in range((step - 1) * per_step, step * per_step):
        epoch, pos = divmod(g, num_examples)
        out.append(int(epoch_order(seed, epoch, num_examples)[pos]))
    return out


def epoch_order(seed: int, epoch: int, n: int) -> np.ndarray:
    return np.random.default_rng([seed, epoch]).permutation(n)


def step_seed(seed: int, step: int, draw: int = 0) -> int:
    """The sampling seed of a step (and of its extra draws): reproducible across resumes, different every step."""
    key = [seed, step, 7, draw] if draw else [seed, step, 7]
    return int(np.random.default_rng(key).integers(2**31 - 1))


def prompt_ids(tokenizer, example: dict) -> list[int]:
    # The template already holds any BOS: tokenize without adding special tokens again.
    return tokenizer(_prompt_text(tokenizer, example), add_special_tokens=False)["input_ids"]


def _prompt_text(tokenizer, example: dict) -> str:
    text = tokenizer.apply_chat_template(example["messages"], tokenize=False, add_generation_prompt=True)
    return text + example.get("assistant_prefix", "")


def fit_window(examples: list[dict], tokenizer, max_seq_len: int | None) -> tuple[list[dict], int]:
    """(the examples whose prompt the sampler can take: fewer than `max_seq_len` tokens, the number dropped).
    As verl's filter_overlong_prompts: one long prompt in a data set must not end a run at the step that
    draws it (the sampler refuses the whole request)."""
    if max_seq_len is None:
        return examples, 0
    kept = [ex for ex in examples if _prompt_len_below(tokenizer, ex, max_seq_len)]
    return kept, len(examples) - len(kept)


def _prompt_len_below(tokenizer, example: dict, limit: int) -> bool:
    text = _prompt_text(tokenizer, example)
    # A token covers at least one byte (a few more tokens for a prefix space or BOS): short texts need no
    # tokenizing, which for a large data set of long prompts is most of the cost.
    if len(text.encode()) + 8 < limit:
        return True
    return len(tokenizer(text, add_special_tokens=False)["input_ids"]) < limit
