"""Outcome advantages for the reference loop: GRPO, Dr.GRPO and RLOO, one scalar per sequence.

Semantics of verl 0.9.1 `compute_grpo_outcome_advantage` / `compute_rloo_outcome_advantage`, which
return the same value broadcast over the response tokens ([B, R]); ours return it per sequence ([B]):
multiply by response_mask for verl's layout, or pass [B] advantages to the `grpo` loss directly.

A group of size 1 follows verl's registered estimators: it has no baseline, so GRPO gives
score / (1 + eps) (mean 0, std 1), Dr.GRPO and RLOO give the raw score. (verl's `rloo_vectorized`
gives 0 instead; the registered `grpo` and `rloo` do not.)

    >>> grpo(torch.tensor([1.0, 0.0, 1.0, 1.0]), ["a", "a", "b", "b"])  # doctest: +SKIP
    tensor([ 0.7071, -0.7071,  0.0000,  0.0000])

Legend: B sequences.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import torch


def _groups(scores_B: torch.Tensor, uids: Sequence[Hashable]) -> list[torch.Tensor]:
    """Row indices of each uid group, groups in order of first appearance."""
    if not isinstance(scores_B, torch.Tensor) or scores_B.dim() != 1:
        got = list(scores_B.shape) if isinstance(scores_B, torch.Tensor) else type(scores_B).__name__
        raise ValueError(f"scores must be a [B] tensor, got {got}")
    if len(uids) != scores_B.shape[0]:
        raise ValueError(f"uids must have one entry per score (B={scores_B.shape[0]}), got {len(uids)}")
    rows: dict[Hashable, list[int]] = {}
    for i, u in enumerate(uids):
        rows.setdefault(u, []).append(i)
    return [torch.tensor(r, dtype=torch.long, device=scores_B.device) for r in rows.values()]


def grpo(scores_B: torch.Tensor, uids: Sequence[Hashable], norm_by_std: bool = True, eps: float = 1e-6) -> torch.Tensor:
    """(score - group mean) / (group std + eps); Dr.GRPO (norm_by_std=False) skips the division.

    std is the unbiased (n - 1) one, as torch.std and verl use.
    """
    scores_B = scores_B.detach().float()
    adv_B = torch.empty_like(scores_B)
    for idx in _groups(scores_B, uids):
        group = scores_B[idx]
        mean, std = (group.mean(), group.std()) if len(idx) > 1 else (0.0, 1.0)
        adv_B[idx] = (group - mean) / (std + eps) if norm_by_std else group - mean
    return adv_B


def rloo(scores_B: torch.Tensor, uids: Sequence[Hashable]) -> torch.Tensor:
    """Leave-one-out baseline: score_i - mean of the other scores of its group
    (= n / (n - 1) * (score_i - group mean))."""
    scores_B = scores_B.detach().float()
    adv_B = scores_B.clone()
    for idx in _groups(scores_B, uids):
        n = len(idx)
        if n > 1:
            group = scores_B[idx]
            adv_B[idx] = (group - group.mean()) * n / (n - 1)
    return adv_B
