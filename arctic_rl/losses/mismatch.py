"""The training-inference mismatch of one batch: how far the sampler's log-probs are from the trainer's.

`mismatch_metrics(old_BR, rollout_BR, mask_BR)` -> python floats, for every step (sync and async) whatever
the loss corrects. old = the trainer's log-probs of the sampled tokens (pi_training: the recomputed old
log-probs), rollout = the sampler's (pi_rollout); r = pi_training / pi_rollout per response token.

verl 0.9.1's off-policy diagnostics (`rollout_corr_helper.compute_offpolicy_metrics`, which verl's trainer
logs every step under `rollout_corr/`), same names and values:
  kl                  token mean of log pi_rollout - log pi_training (KL(pi_rollout || pi_training), k1)
  k3_kl               token mean of r - 1 - log r (the same KL, k3: >= 0 per token, low variance)
  training_ppl        row mean of exp(-(row's token mean of log pi_training)); training_log_ppl: of the exponent
  rollout_ppl         the same for pi_rollout; rollout_log_ppl
  log_ppl_diff        row mean of (row's token mean of log pi_rollout - of log pi_training) = log(training_ppl_i
                      / rollout_ppl_i); log_ppl_abs_diff (mean of its absolute value), log_ppl_diff_max, _min
  ppl_ratio           row mean of exp(log_ppl_diff)
  chi2_token          token mean of r^2, minus 1 (log r clamped to +-20 before exp)
  chi2_seq            row mean of (prod of the row's r)^2, minus 1 (the row's sum of log r clamped to +-20)
As in verl, a row without response tokens counts as a row (its token means are 0) in the row means.
Ours besides (verl has no name for the untruncated ratio: its rollout_is_max / _mean are those of the weights
the loss applies, which the `grpo` loss logs when `rollout_is` is set):
  ratio_max, ratio_mean, ratio_min        r over response tokens (log r clamped to +-20)
  ratio_fraction_high, ratio_fraction_low the response tokens with r > upper or r < lower, the bounds of verl's
                      rollout_is_threshold spec (`threshold`; lower = 1 / upper unless "lo_hi"): the tokens a
                      token-level TIS would truncate (high) or IcePop zero, whether or not the loss corrects
Staleness (`staleness_B`, the policy versions between the weights that sampled each row and those that trained
on it; None = 0 for every row, the sync loop), over response tokens:
  staleness/mean, staleness/max, staleness/frac_<k> for k = 0 .. max(max_staleness, the largest seen)

An empty mask gives {} (nothing to measure; verl asserts instead). Inputs are computed in float64.

Legend: B rows, R response columns.
"""

from __future__ import annotations

import torch

from arctic_rl.losses.common import masked_mean
from arctic_rl.losses.config import is_threshold

PREFIX = "rollout_corr/"
SAFETY_BOUND = 20.0  # verl's bound on a log-ratio before exp


def _row_mean(x_BR: torch.Tensor, mask_BR: torch.Tensor) -> torch.Tensor:
    """verl's masked_mean along the response: [B], 0 for a row without tokens."""
    return torch.where(mask_BR, x_BR, 0.0).sum(-1) / (mask_BR.sum(-1) + 1e-8)


def offpolicy_metrics(old_BR: torch.Tensor, rollout_BR: torch.Tensor, mask_BR: torch.Tensor) -> dict[str, float]:
    """verl's compute_offpolicy_metrics (unprefixed names; see the module docstring)."""
    log_r_BR = old_BR - rollout_BR
    old_B, rollout_B = _row_mean(old_BR, mask_BR), _row_mean(rollout_BR, mask_BR)
    log_ppl_diff_B = rollout_B - old_B
    r_BR = log_r_BR.clamp(-SAFETY_BOUND, SAFETY_BOUND).exp()
    log_r_B = torch.where(mask_BR, log_r_BR, 0.0).sum(-1).clamp(-SAFETY_BOUND, SAFETY_BOUND)
    out = {
        "training_ppl": (-old_B).exp().mean(),
        "training_log_ppl": (-old_B).mean(),
        "kl": masked_mean(-log_r_BR, mask_BR),
        "k3_kl": masked_mean(log_r_BR.exp() - log_r_BR - 1.0, mask_BR),
        "rollout_ppl": (-rollout_B).exp().mean(),
        "rollout_log_ppl": (-rollout_B).mean(),
        "log_ppl_diff": log_ppl_diff_B.mean(),
        "log_ppl_abs_diff": log_ppl_diff_B.abs().mean(),
        "log_ppl_diff_max": log_ppl_diff_B.max(),
        "log_ppl_diff_min": log_ppl_diff_B.min(),
        "ppl_ratio": log_ppl_diff_B.exp().mean(),
        "chi2_token": masked_mean(r_BR.square(), mask_BR) - 1.0,
        "chi2_seq": (2.0 * log_r_B).exp().mean() - 1.0,
    }
    return {k: float(v) for k, v in out.items()}


def ratio_metrics(
    old_BR: torch.Tensor, rollout_BR: torch.Tensor, mask_BR: torch.Tensor, threshold: float | str = 2.0
) -> dict[str, float]:
    """The untruncated per-token ratio r = pi_training / pi_rollout: max, mean, min, and the fractions of tokens
    beyond the bounds of a rollout_is_threshold spec (unprefixed names)."""
    upper, lower = is_threshold(threshold)
    lower = 1.0 / upper if lower is None else lower
    r_BR = (old_BR - rollout_BR).clamp(-SAFETY_BOUND, SAFETY_BOUND).exp()
    r_N = r_BR[mask_BR]
    return {
        "ratio_max": float(r_N.max()),
        "ratio_mean": float(r_N.mean()),
        "ratio_min": float(r_N.min()),
        "ratio_fraction_high": float((r_N > upper).double().mean()),
        "ratio_fraction_low": float((r_N < lower).double().mean()),
    }


def staleness_metrics(staleness_B: torch.Tensor, mask_BR: torch.Tensor, max_staleness: int = 0) -> dict[str, float]:
    """The per-token staleness histogram: each response token has its row's staleness (unprefixed names)."""
    n_B = mask_BR.sum(-1).double()
    stale_B = staleness_B.long()
    tokens = n_B.sum()
    top = max(max_staleness, int(stale_B[n_B > 0].max()))
    out = {
        "staleness/mean": float((stale_B.double() * n_B).sum() / tokens),
        "staleness/max": float(stale_B[n_B > 0].max()),
    }
    for k in range(top + 1):
        out[f"staleness/frac_{k}"] = float(n_B[stale_B == k].sum() / tokens)
    return out


def mismatch_metrics(
    old_BR: torch.Tensor,
    rollout_BR: torch.Tensor,
    mask_BR: torch.Tensor,
    *,
    threshold: float | str = 2.0,
    staleness_B: torch.Tensor | None = None,
    max_staleness: int = 0,
) -> dict[str, float]:
    """Every `rollout_corr/` mismatch metric of the module docstring, as python floats ({} for an empty mask).
    `threshold`: the loss's rollout_is_threshold spec (verl's default 2.0); `staleness_B`: per-row policy
    versions behind (None: 0 for every row)."""
    if old_BR.shape != rollout_BR.shape or old_BR.shape != mask_BR.shape:
        raise ValueError(
            f"old {list(old_BR.shape)}, rollout {list(rollout_BR.shape)} and mask {list(mask_BR.shape)} log-probs "
            "must have one [B, R] shape"
        )
    mask_BR = mask_BR.bool()
    if not mask_BR.any():
        return {}
    old_BR, rollout_BR = old_BR.detach().double().cpu(), rollout_BR.detach().double().cpu()
    mask_BR = mask_BR.cpu()
    if staleness_B is None:
        staleness_B = torch.zeros(mask_BR.shape[0], dtype=torch.long)
    elif staleness_B.shape != mask_BR.shape[:1]:
        raise ValueError(f"staleness must have shape [{mask_BR.shape[0]}] (one per row), got {list(staleness_B.shape)}")
    out = {
        **offpolicy_metrics(old_BR, rollout_BR, mask_BR),
        **ratio_metrics(old_BR, rollout_BR, mask_BR, threshold),
        **staleness_metrics(staleness_B.cpu(), mask_BR, max_staleness),
    }
    return {PREFIX + k: v for k, v in out.items()}
