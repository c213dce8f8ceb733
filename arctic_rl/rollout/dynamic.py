"""Which samples a step trains on: DAPO's dynamic sampling and overlong handling, as verl and SkyRL name them.

Dynamic sampling (`filter_groups.enable`; verl: `algorithm.filter_groups`). Under GRPO or RLOO a prompt group
whose rewards are all equal has advantage 0 on every token: it costs a forward and backward pass and teaches
nothing, and as a policy masters (or gives up on) its prompts, most groups become such groups. The step drops them
and draws another batch of `train.prompts_per_step` prompts, until it holds `prompts_per_step` groups with signal
or it has drawn `filter_groups.max_num_gen_batches` batches (the first one included). It then trains on the
groups it found; where it found none, on the first batch as drawn, exactly as without filtering (verl raises
instead; a run should not die at step 300 because one batch was all solved). Extra batches are seeded by
(seed, step, draw), so a resumed run draws the same ones. verl continues through its dataloader instead, which
shifts the prompts of every later step; here the steps' own prompts stay where they were.

Overlong handling (`overlong`): a response cut at `sampling.max_tokens` (finish_reason "length") was scored on a
text that never ended. `overlong.filter` masks it out of the loss (SkyRL: `generator.apply_overlong_filtering`);
its reward still counts in its group's baseline. `overlong.buffer_len` > 0 adds DAPO's soft overlong punishment
(verl: `reward_model.overlong_buffer`): 0 up to max_tokens - buffer_len tokens, then falling linearly to
-penalty_factor at max_tokens, added to the reward before advantages and before the group filter.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


def overlong_penalty(lengths: list[int], max_tokens: int, buffer_len: int, factor: float) -> list[float]:
    """DAPO's soft overlong punishment of each response length (0 while it is no penalty at all)."""
    if buffer_len <= 0:
        return [0.0] * len(lengths)
    expected = max_tokens - buffer_len
    return [min(-(length - expected) / buffer_len * factor, 0.0) for length in lengths]


def truncated(samples: list[dict]) -> list[bool]:
    """Which samples the sampler cut at max_tokens (vLLM's finish_reason "length")."""
    return [s.get("finish_reason") == "length" for s in samples]


def groups_with_signal(scores: list[float], n: int) -> list[int]:
    """Indices of the groups (n consecutive scores each, prompt-major) whose scores are not all equal. A group of
    one has no baseline to differ from and is kept, as verl keeps it."""
    if n == 1:
        return list(range(len(scores)))
    return [g for g in range(len(scores) // n) if len(set(scores[g * n : (g + 1) * n])) > 1]


@dataclass
class Draw:
    """One generate's prompt groups: examples, their samples (n per example, prompt-major), each sample's score,
    and the policy version that sampled them."""

    examples: list[dict]
    samples: list[dict]
    scores: list[float]
    version: int


@dataclass
class Filled:
    """The groups a step trains on, and how they were found (logged every step)."""

    examples: list[dict]
    samples: list[dict]
    scores: list[float]
    group_versions: list[int]  # the policy version of each group
    gen_batches: int  # batches drawn, the first included (verl's train/num_gen_batches)
    groups_drawn: int
    groups_with_signal: int  # among those drawn


def fill_groups(first: Draw, draw: Callable[[int], Draw], want: int, n: int, max_batches: int) -> Filled:
    """`want` groups with signal, from `first` and then `draw(1)`, `draw(2)`, ... up to `max_batches` draws in
    all; the first `want` found, in draw order. None found: `first` whole (see the module docstring)."""
    if max_batches < 1:
        raise ValueError(f"filter_groups.max_num_gen_batches must be >= 1, got {max_batches}")
    kept: list[tuple[Draw, int]] = []
    draws, current, found = 1, first, 0
    drawn = len(first.examples)
    while True:
        signal = groups_with_signal(current.scores, n)
        found += len(signal)
        kept += [(current, g) for g in signal][: want - len(kept)]
        if len(kept) >= want or draws >= max_batches:
            break
        current = draw(draws)
        draws += 1
        drawn += len(current.examples)
    if not kept:
        kept = [(first, g) for g in range(len(first.examples))]
    return Filled(
        examples=[d.examples[g] for d, g in kept],
        samples=[s for d, g in kept for s in d.samples[g * n : (g + 1) * n]],
        scores=[x for d, g in kept for x in d.scores[g * n : (g + 1) * n]],
        group_versions=[d.version for d, _ in kept],
        gen_batches=draws,
        groups_drawn=drawn,
        groups_with_signal=found,
    )
