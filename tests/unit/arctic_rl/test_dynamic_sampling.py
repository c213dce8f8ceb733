"""Dynamic sampling and overlong handling (arctic_rl.rollout.dynamic) and the loop's use of them (arctic_rl.loop:
score, gather, the overlong loss mask): the punishment against verl 0.9.1's own DAPO reward manager, the group
filter and the refill, the extra draws' seeds, and what a step then trains on.

Legend: n samples per prompt group, prompt-major.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from repo_paths import verl_module

from arctic_rl.batch import from_samples
from arctic_rl.loop import grpo as loop
from arctic_rl.loop.data import epoch_order, step_indices, step_seed
from arctic_rl.rollout import dynamic
from arctic_rl.rollout.pipeline import Rollout
from arctic_rl.runconfig import parse_run_config

MAX_TOKENS, BUFFER, FACTOR = 12, 5, 0.7


def test_the_overlong_punishment_equals_verls_dapo_reward_manager():
    """verl's DAPORewardManager (reward_model.overlong_buffer) on responses of every length 0..max_tokens: its
    reward (score + punishment, at the last response token) equals the recipe's score + overlong_penalty."""
    dapo = verl_module("verl.workers.reward_manager.dapo")
    from verl.protocol import DataProto

    lengths = list(range(MAX_TOKENS + 1))
    scores = [0.25 * (i % 3) for i in lengths]
    P, B = 3, len(lengths)
    responses = torch.randint(5, 50, (B, MAX_TOKENS))
    attn = torch.zeros(B, P + MAX_TOKENS, dtype=torch.long)
    attn[:, :P] = 1
    for i, n in enumerate(lengths):
        attn[i, P : P + n] = 1
    data = DataProto.from_dict(
        tensors={"prompts": torch.randint(5, 50, (B, P)), "responses": responses, "attention_mask": attn},
        non_tensors={
            "data_source": np.array(["t"] * B, dtype=object),
            "reward_model": np.array([{"ground_truth": str(i)} for i in range(B)], dtype=object),
            "extra_info": np.array([{"i": i} for i in range(B)], dtype=object),
        },
    )
    tokenizer = SimpleNamespace(decode=lambda ids, skip_special_tokens=True: "x", eos_token="</s>")
    manager = dapo.DAPORewardManager(
        tokenizer,
        num_examine=0,
        compute_score=lambda data_source, solution_str, ground_truth, extra_info: scores[int(ground_truth)],
        max_resp_len=MAX_TOKENS,
        overlong_buffer_cfg=SimpleNamespace(enable=True, len=BUFFER, penalty_factor=FACTOR, log=False),
    )
    theirs = manager(data).sum(-1)
    ours = torch.tensor(scores) + torch.tensor(dynamic.overlong_penalty(lengths, MAX_TOKENS, BUFFER, FACTOR))
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-6)
    assert ours[-1] == scores[-1] - FACTOR and ours[MAX_TOKENS - BUFFER] == scores[MAX_TOKENS - BUFFER]
    assert dynamic.overlong_penalty(lengths, MAX_TOKENS, 0, FACTOR) == [0.0] * len(lengths)  # off


def test_groups_whose_rewards_all_match_have_no_signal():
    scores = [1, 0, 1, 0, 0, 0, 0.5, 0.5, 0.2]
    assert dynamic.groups_with_signal(scores, 3) == [0, 2]
    assert dynamic.groups_with_signal([0.0, 0.0], 1) == [0, 1]  # a group of one is kept (no baseline)


def draws_of(scores_by_draw: list[list[float]], n: int, version: int = 4):
    """Draws whose examples name (draw, group) and whose samples carry their score."""

    def make(d: int) -> dynamic.Draw:
        scores = scores_by_draw[d]
        groups = len(scores) // n
        return dynamic.Draw(
            [{"id": (d, g)} for g in range(groups)],
            [{"score": s} for s in scores],
            list(scores),
            version if d == 0 else version + 1,
        )

    return make


def test_the_step_refills_with_groups_that_have_signal_in_draw_order():
    n = 2
    make = draws_of([[1, 1, 0, 1, 0, 0], [1, 0, 1, 0, 0, 1], [1, 0, 1, 0, 1, 0]], n)
    asked = []
    f = dynamic.fill_groups(make(0), lambda d: asked.append(d) or make(d), want=3, n=n, max_batches=4)
    assert asked == [1]  # stopped once three groups had signal
    assert [ex["id"] for ex in f.examples] == [(0, 1), (1, 0), (1, 1)]  # the first three: (1, 2) left over
    assert f.scores == [0, 1, 1, 0, 1, 0] and [s["score"] for s in f.samples] == f.scores
    assert f.group_versions == [4, 5, 5]
    assert (f.gen_batches, f.groups_drawn, f.groups_with_signal) == (2, 6, 4)


def test_the_refill_stops_at_max_num_gen_batches_and_keeps_what_it_found():
    n = 2
    make = draws_of([[1, 1, 0, 1], [0, 0, 1, 1], [1, 0, 1, 0]], n)
    f = dynamic.fill_groups(make(0), make, want=2, n=n, max_batches=2)
    assert [ex["id"] for ex in f.examples] == [(0, 1)] and f.gen_batches == 2 and f.groups_drawn == 4
    # None with signal in any draw: the first batch as drawn (as without filtering)
    make = draws_of([[1, 1, 0, 0], [1, 1, 1, 1]], n)
    f = dynamic.fill_groups(make(0), make, want=2, n=n, max_batches=2)
    assert [ex["id"] for ex in f.examples] == [(0, 0), (0, 1)] and f.groups_with_signal == 0
    with pytest.raises(ValueError, match="max_num_gen_batches must be >= 1, got 0"):
        dynamic.fill_groups(make(0), make, want=2, n=n, max_batches=0)


def test_extra_draws_are_seeded_by_step_and_draw_and_leave_the_epoch_order_alone():
    """Draw 0 is the epoch order (unchanged); draw d > 0 is a function of (seed, step, d): a resumed run draws the
    same batches, and the steps after it take the prompts they would have taken without it."""
    first = step_indices(3, 10, 4, seed=5)
    assert first == [int(x) for x in np.concatenate([epoch_order(5, 0, 10)[8:10], epoch_order(5, 1, 10)[0:2]])]
    extra = step_indices(3, 10, 4, seed=5, draw=1)
    assert extra == step_indices(3, 10, 4, seed=5, draw=1) and len(extra) == 4
    assert extra != step_indices(3, 10, 4, seed=5, draw=2) and extra != step_indices(4, 10, 4, seed=5, draw=1)
    assert step_seed(5, 3) == step_seed(5, 3, draw=0) != step_seed(5, 3, draw=1) == step_seed(5, 3, draw=1)


def run_config(**sections) -> object:
    data = {
        "model": {"name_or_path": "org/model"},
        "recipe": {"name": "toy"},
        "sampling": {"n": 2, "max_tokens": MAX_TOKENS},
        "train": {"steps": 2, "prompts_per_step": 2},
        **sections,
    }
    return parse_run_config(data)


class Generator:
    """The client's generate op, answering every prompt with n samples of lengths 3, 4, ...; it records the
    requests."""

    def __init__(self):
        self.requests = []

    def generate(self, prompts, params):
        self.requests.append((prompts, params))
        return [
            {"prompt_token_ids": p, "token_ids": [1] * (3 + k), "text": "", "logprobs": [-0.1] * (3 + k)}
            for p in prompts
            for k in range(params["n"])
        ]


def test_gather_draws_more_until_the_step_has_groups_with_signal(monkeypatch):
    """The loop's gather with filter_groups on: the scores come from the recipe (here a stand-in whose reward is
    the example's own list), groups without signal are dropped, the extra draw asks for (step, draw 1) with its
    own seed, and the metrics say what happened."""
    cfg = run_config(filter_groups={"enable": True, "max_num_gen_batches": 3})
    client = Generator()
    recipe = SimpleNamespace(reward=None)
    spread = {"a": [1.0, 0.0], "b": [1.0, 1.0], "c": [0.0, 1.0], "d": [0.5, 0.5]}

    def make_request(step, draw=0):
        names = ["b", "d"] if draw == 0 else ["c", "a"]
        return [[ord(x)] for x in names], {"n": 2, "seed": 100 + draw}, [{"name": x} for x in names]

    monkeypatch.setattr(
        loop,
        "score_all",
        lambda reward, completions, examples: [spread[ex["name"]][i % 2] for i, ex in enumerate(examples)],
    )
    first = Rollout(2, [{"name": "b"}, {"name": "d"}], client.generate([[98], [100]], {"n": 2}), 0, 1.0, 1.0)
    got, scores, m = loop.gather(cfg, client, recipe, first, make_request)
    assert [ex["name"] for ex in got.examples] == ["c", "a"] and scores == [0.0, 1.0, 1.0, 0.0]
    assert client.requests[-1][1]["seed"] == 101 and got.group_versions == [1, 1]
    assert m["train/num_gen_batches"] == 2 and m["dynamic/groups_drawn"] == 4 and m["dynamic/groups_trained"] == 2
    assert m["gen"] > 1.0  # the extra generate's time is the step's gen time too
    # Off: the rollout as it came, one draw
    same, _, m = loop.gather(run_config(), client, recipe, first, make_request)
    assert same is first and "train/num_gen_batches" not in m


def test_a_truncated_response_gets_no_loss_with_overlong_filter():
    samples = [
        {"prompt_token_ids": [1, 2], "token_ids": [3] * MAX_TOKENS, "finish_reason": "length"},
        {"prompt_token_ids": [1, 2], "token_ids": [3, 4], "finish_reason": "stop"},
    ]
    batch = from_samples(samples, ["u", "u"])
    assert dynamic.truncated(samples) == [True, False]
    loop.mask_truncated(run_config(overlong={"filter": True}), batch, samples)
    assert batch["response_mask"].sum(-1).tolist() == [0, 2]
    batch = from_samples(samples, ["u", "u"])
    loop.mask_truncated(run_config(), batch, samples)  # off
    assert batch["response_mask"].sum(-1).tolist() == [MAX_TOKENS, 2]


def test_the_overlong_buffer_must_fit_below_max_tokens():
    from arctic_rl.errors import ConfigError

    with pytest.raises(ConfigError, match="overlong.buffer_len=12 must be below sampling.max_tokens=12"):
        run_config(overlong={"buffer_len": MAX_TOKENS})
    with pytest.raises(ConfigError, match="filter_groups.max_num_gen_batches"):
        run_config(filter_groups={"enable": True, "max_num_gen_batches": 0})
