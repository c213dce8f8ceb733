"""ZoRRo Train on prefix trees is exact: log-probs, entropy, loss and every parameter gradient equal the naive
batch's (the tolerances of test_zorro_train.py), and each shared prefix is packed once."""

from __future__ import annotations

import random

import pytest
import torch
from test_zorro_train import MODELS, assert_same, make_batch, tiny_model

from arctic_rl.engines.forward import naive_log_probs
from arctic_rl.zorro import train as zt
from arctic_rl.zorro.tree import build_tree_plan

VOCAB = 101


def tree_batch(groups, *, P: int, R: int, seed: int = 0):
    """groups: list of (prompt_len, [response token lists]); rows interleaved across groups."""
    return make_batch(groups, P=P, R=R, seed=seed)


# A multi-turn-shaped group: a shared first turn (5 tokens), then two branches that share a tool answer and
# split later, a row that is a prefix of another, an exact duplicate, a row that shares nothing and an empty one.
TURN = [11, 12, 13, 14, 15]
TREE = [
    (6, [TURN + [20, 21, 22, 30], TURN + [20, 21, 22, 31, 32], TURN + [20, 21], TURN + [20, 21, 22, 30], [40, 41], []]),
    (4, [[7, 8, 9], [7, 8, 5, 6]]),
    (3, [[50, 51, 52]]),
]


def unique_tokens(groups) -> int:
    """Prompt tokens plus the distinct (prefix) nodes of every group's responses: the packed length."""
    total = 0
    for plen, responses in groups:
        total += plen + len({tuple(r[: j + 1]) for r in responses for j in range(len(r))})
    return total


def random_tree_groups(rng: random.Random, n_groups: int, R: int):
    groups = []
    for _ in range(n_groups):
        rows: list[list[int]] = []
        for _ in range(rng.randint(1, 6)):
            if rows and rng.random() < 0.7:  # branch off an earlier row somewhere along it
                base = rng.choice(rows)
                cut = rng.randint(0, len(base))
                rows.append(base[:cut] + [rng.randint(1, VOCAB - 1) for _ in range(rng.randint(0, R - cut))])
            else:
                rows.append([rng.randint(1, VOCAB - 1) for _ in range(rng.randint(0, R))])
        groups.append((rng.randint(1, 5), rows))
    return groups


@pytest.mark.parametrize("name", sorted(MODELS))
def test_exact_on_a_prefix_tree(name):
    assert_same(tiny_model(name), tree_batch(TREE, P=6, R=10, seed=1), prefix_tree=True)


@pytest.mark.parametrize("seed", range(6))
def test_exact_on_random_trees(seed):
    groups = random_tree_groups(random.Random(seed), 3, R=7)
    assert_same(tiny_model("qwen3", seed=seed), tree_batch(groups, P=5, R=7, seed=seed), prefix_tree=True)


def test_nothing_shared_past_the_prompts_takes_the_flat_plan(monkeypatch):
    batch = make_batch([(9, [5, 3, 5, 1]), (4, [2, 6])], P=9, R=6)
    assert not build_tree_plan(batch).shares_past_prompts
    # a row that is a prefix of another, or a duplicate, is shared
    assert build_tree_plan(tree_batch([(3, [[4, 5, 6], [4, 5]])], P=3, R=3)).shares_past_prompts
    assert build_tree_plan(tree_batch([(3, [[4, 5], [4, 5]])], P=3, R=2)).shares_past_prompts
    flat = []
    monkeypatch.setattr(zt, "build_plan", lambda *a, **k: flat.append(1) or BUILD(*a, **k))
    assert_same(tiny_model("llama", seed=3), batch, prefix_tree=True)
    assert flat, "the flat plan was not used"


BUILD = zt.build_plan


def test_exact_with_checkpointing():
    model = tiny_model("qwen2", seed=4)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    assert_same(model, tree_batch(TREE, P=6, R=10, seed=4), prefix_tree=True)


def test_each_shared_prefix_is_packed_once():
    batch = tree_batch(TREE, P=6, R=10, seed=2)
    tree, flat = build_tree_plan(batch), zt.build_plan(batch)
    assert tree.num_tokens == unique_tokens(TREE) == (6 + 13) + (4 + 5) + (3 + 3)
    assert flat.num_tokens == sum(p + sum(len(r) for r in rs) for p, rs in TREE)
    assert len(tree.labels) == tree.num_tokens - (6 + 4 + 3)  # the head runs once per packed response token
    # the first turn's tokens sit once in the packed row, at consecutive positions after the prompt
    packed = tree.input_ids[0].tolist()
    assert sum(packed[i : i + 5] == TURN for i in range(len(packed))) == 1


def test_equal_tokens_at_other_positions_are_not_shared():
    batch = tree_batch([(4, [[7, 8, 9], [7, 8, 5]])], P=4, R=3, seed=5)
    model = tiny_model("llama", seed=5)
    assert build_tree_plan(batch).num_tokens == 4 + 2 + 1 + 1
    batch["position_ids"] = (batch["attention_mask"].cumsum(-1) - 1).clamp(min=0)
    batch["position_ids"][1, 4:] += 100  # row 1's response sits elsewhere: same tokens, other positions
    assert build_tree_plan(batch).num_tokens == 4 + 3 + 3
    with torch.no_grad():
        got = zt.zorro_log_probs(model, batch, prefix_tree=True)["log_probs"]
        want = naive_log_probs(model, batch)["log_probs"]
    torch.testing.assert_close(got, want, atol=2e-5, rtol=0)


def test_the_engines_log_prob_model_takes_the_tree_from_the_config(monkeypatch):
    """training_config.zorro_train.prefix_tree reaches the forward every engine pass runs (log-probs, reference,
    forward_backward: engines/training.py LogProbModel), and needs zorro_train.enable."""
    from pydantic import ValidationError

    from arctic_rl.config import ZorroTrainConfig
    from arctic_rl.engines.training import LogProbModel
    from arctic_rl.zorro import tree

    with pytest.raises(ValidationError, match="prefix_tree=true needs zorro_train.enable=true"):
        ZorroTrainConfig(prefix_tree=True)
    cfg = ZorroTrainConfig(enable=True, prefix_tree=True)
    calls = []
    monkeypatch.setattr(tree, "build_tree_plan", lambda *a, **k: calls.append(1) or build_tree_plan(*a, **k))
    model = tiny_model("llama", seed=6)
    batch = tree_batch(TREE, P=6, R=10, seed=6)
    with torch.no_grad():
        got = LogProbModel(model, cfg.enable, 16, prefix_tree=cfg.prefix_tree)(batch, {})["log_probs"]
        want = naive_log_probs(model, batch)["log_probs"]
    assert calls, "the engine's forward did not build a prefix tree"
    torch.testing.assert_close(got, want, atol=2e-5, rtol=0)
