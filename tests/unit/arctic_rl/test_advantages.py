"""GRPO / Dr.GRPO / RLOO advantages against a plain reference and verl 0.9.1's estimators."""

from __future__ import annotations

import statistics

import numpy as np
import pytest
import torch
from repo_paths import verl_module

from arctic_rl.advantages import grpo, rloo

UIDS = ["a", "a", "a", "b", "b", "c", 7, 7, 7, 7, "d", "d"]  # "c" is a group of one; "d" has equal scores
SCORES = torch.tensor([1.0, 0.0, 0.5, 2.0, -1.0, 3.0, 0.0, 1.0, 1.0, 0.25, 0.5, 0.5])


@pytest.fixture(scope="module")
def verl_core():
    return verl_module("verl.trainer.ppo.core_algos")


def groups() -> dict:
    out: dict = {}
    for u, s in zip(UIDS, SCORES.tolist()):
        out.setdefault(u, []).append(s)
    return out


@pytest.mark.parametrize("norm_by_std", [True, False])
def test_grpo_plain_reference(norm_by_std):
    adv = grpo(SCORES, UIDS, norm_by_std=norm_by_std, eps=1e-6)
    g = groups()
    for i, (u, s) in enumerate(zip(UIDS, SCORES.tolist())):
        mean, std = (statistics.mean(g[u]), statistics.stdev(g[u])) if len(g[u]) > 1 else (0.0, 1.0)
        want = (s - mean) / (std + 1e-6) if norm_by_std else s - mean
        assert float(adv[i]) == pytest.approx(want, rel=1e-5, abs=1e-6), (i, u)
    assert adv.shape == SCORES.shape and adv[10] == 0 and adv[11] == 0  # equal scores: no signal


def test_rloo_plain_reference():
    adv = rloo(SCORES, UIDS)
    g = groups()
    for i, (u, s) in enumerate(zip(UIDS, SCORES.tolist())):
        others = list(g[u])
        others.remove(s)
        want = s - statistics.mean(others) if others else s  # no others: verl keeps the raw score
        assert float(adv[i]) == pytest.approx(want, rel=1e-6, abs=1e-6), (i, u)


@pytest.mark.parametrize("norm_by_std", [True, False])
def test_grpo_matches_verl(verl_core, norm_by_std):
    R = 5
    mask_BR = (torch.arange(R)[None] < torch.tensor([5, 3, 1, 4, 5, 2, 5, 5, 3, 1, 2, 4])[:, None]).float()
    rewards_BR = torch.zeros(len(UIDS), R)
    rewards_BR[:, 0] = SCORES  # outcome reward: verl sums it over tokens
    index = np.array([str(u) for u in UIDS], dtype=object)
    want_BR, _ = verl_core.compute_grpo_outcome_advantage(
        rewards_BR, mask_BR, index, epsilon=1e-6, norm_adv_by_std_in_grpo=norm_by_std
    )
    got_B = grpo(SCORES, UIDS, norm_by_std=norm_by_std, eps=1e-6)
    torch.testing.assert_close(got_B.unsqueeze(-1) * mask_BR, want_BR)


def test_rloo_matches_verl(verl_core):
    mask_BR = torch.ones(len(UIDS), 3)
    rewards_BR = torch.zeros(len(UIDS), 3)
    rewards_BR[:, -1] = SCORES
    index = np.array([str(u) for u in UIDS], dtype=object)
    want_BR, _ = verl_core.compute_rloo_outcome_advantage(rewards_BR, mask_BR, index)
    torch.testing.assert_close(rloo(SCORES, UIDS).unsqueeze(-1) * mask_BR, want_BR)


def test_inputs_are_not_modified_and_need_no_grad():
    scores = SCORES.clone().requires_grad_()
    adv = grpo(scores, UIDS)
    assert not adv.requires_grad and torch.equal(scores.detach(), SCORES)


def test_bad_inputs_name_the_argument():
    with pytest.raises(ValueError, match=r"uids must have one entry per score \(B=12\), got 3"):
        grpo(SCORES, ["a", "b", "c"])
    with pytest.raises(ValueError, match=r"scores must be a \[B\] tensor, got \[12, 1\]"):
        rloo(SCORES[:, None], UIDS)
