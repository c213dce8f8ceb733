"""The GRPO / PPO loss family, with verl 0.9.1 (`verl/trainer/ppo/core_algos.py`) semantics.

`grpo(outputs, batch, config) -> (loss, metrics)`; every option is a key of `config` (the user's
`loss_config`), with verl's defaults:

  key                      default        meaning
  policy_loss              "ppo"          "ppo" (verl "vanilla": clipped ratio + dual clip), "gspo"
                                          (sequence-level geometric-mean ratio), "cispo" (clipped,
                                          stop-gradient IS weight on log-prob), "m2po" (see below)
  clip_ratio               0.2            PPO epsilon
  clip_ratio_low/_high     = clip_ratio   asymmetric bounds: ratio clipped to [1-low, 1+high]
                                          (verl's ActorConfig defaults both to 0.2 whatever clip_ratio
                                          is; the same numbers unless clip_ratio alone is changed)
  clip_ratio_c             3.0            dual-clip bound for A < 0 ("ppo" only); must be > 1
  m2_threshold             0.04           "m2po": bound on the second moment of log-ratios
  loss_agg_mode            "token-mean"   token-mean | token-sum | seq-mean-token-sum |
                                          seq-mean-token-mean | seq-mean-token-sum-norm
  loss_scale_factor        None (= R)     divisor of seq-mean-token-sum-norm (Dr.GRPO constant)
  entropy_coeff            0.0            loss -= entropy_coeff * agg(entropy); needs outputs["entropy"]
  use_kl_loss              False          loss += kl_loss_coef * agg(KL(pi || ref)); needs ref_log_prob
  kl_loss_coef             0.001
  kl_loss_type             "low_var_kl"   k1|kl, abs, k2|mse, k3|low_var_kl; a "+" suffix (k3+) keeps
                                          the value but takes the gradient of k2 (straight-through)
  rollout_is               None           off-policy IS weights (see below): None | "token" | "sequence"
  rollout_is_threshold     2.0            float: truncate weights at it (TIS); "lo_hi" string, e.g.
                                          "0.5_2.0": zero weights outside [lo, hi] (IcePop)
  rollout_is_batch_normalize  False       divide the weights by their mean over the mini-batch
  rollout_rs               None           rejection: comma-separated options from config.RS_OPTIONS
                                          (token_k1..k3, seq_sum_k1..k3, seq_mean_k1..k3, seq_max_k2/k3);
                                          a token or row any option rejects gets no loss
  rollout_rs_threshold     None           required with rollout_rs: one spec, or one per option (commas);
                                          k1: "lo_hi" ratio bounds or u (= "1/u_u"); k2/k3: an upper bound
  bypass_mode              False          rollout_log_probs are the old log-probs (no recompute pass)
  loss_type                "ppo_clip"     bypass_mode only: "ppo_clip" | "reinforce"
  prox_logp_method         "recompute"    where the proximal policy comes from (see below)
  prox_alpha / prox_staleness  -          "loglinear" only: the interpolation weight (exactly one)
  global_num_tokens        (engine)       response tokens in the whole global batch (decoupled
                                          rollout_rs: the tokens it keeps)
  global_num_seqs          (engine)       rows with >= 1 response token in the whole global batch (idem)
  rollout_is_batch_mean    (engine)       rollout_is_batch_normalize: the weights' mean over the whole
                                          mini-batch (grpo_global_keys); without it, this call's mean

The keys are checked by the model arctic_rl.losses.config.GRPOConfig: unknown keys and bad values raise
ConfigError, a ValueError (a typo must not silently fall back to a default); `temperature` and
`compute_entropy` are accepted and ignored: the engine's post-processor reads them.

Off-policy data (decoupled PPO, as verl's "decoupled" rollout-correction mode): three policies,
behaviour pi_b = batch["rollout_log_probs"] (the sampler), proximal pi_prox, current pi_theta.
The policy loss clips pi_theta / pi_prox, and with `rollout_is` each token's loss is multiplied by
the truncated, detached weight w = pi_prox / pi_b (per token, or per row as exp(sum of log-ratios)).
  prox_logp_method="recompute": pi_prox = batch["old_log_probs"] (the engine recomputed them).
  prox_logp_method="loglinear": no recompute pass (AReaL's approximation); per token
      log pi_prox = log pi_b + alpha * (sg(log pi_theta) - log pi_b)
  with alpha = prox_alpha in [0, 1], or alpha = (s - 1) / s for prox_staleness = s >= 1 policy
  versions between the sampler and the current policy (the proximal policy is the one of version
  current - 1, interpolated log-linearly in the version number). sg = stop-gradient: the proximal
  policy is a fixed anchor; without it the ratio's gradient would shrink by (1 - alpha).
  batch["old_log_probs"] is not read in this mode.

Rollout correction (verl's `algorithm.rollout_correction`, `rollout_corr_helper.py`; flat keys here). The
anchor pi_a is pi_prox in decoupled mode and the current policy (detached) in bypass mode; r = pi_a / pi_b.
  rollout_is: w = r per token, or exp(sum of log r) per row, computed in log space (clamped at verl's
      bound before exp), truncated (TIS) or zeroed outside [lo, hi] (IcePop), detached.
      rollout_is_batch_normalize: w / mean(w), the mean over response tokens ("token") or over rows with
      response tokens ("sequence"), taken before rejection, as verl does.
  rollout_rs: per option a statistic of log r: k1 = -log r, k2 = (log r)^2 / 2, k3 = r - 1 - log r; per
      token (token_*), or the sum / mean / max over a row's tokens (seq_sum_*, seq_mean_*, seq_max_*);
      a k1 statistic must lie in [log lo, log hi] (verl compares -log r, so "lo_hi" bounds 1 / r), a
      k2/k3 statistic be <= its bound. seq_mean_k1 is verl's geometric-mean rejection ("Geo-RS").
  Decoupled mode: the policy loss (any policy_loss) is multiplied by w; rejected tokens leave the batch,
      as verl's trainer drops them from response_mask: no pg, entropy or KL term, and they do not count
      in the local normalizers; the engine's global counts leave them out too (grpo_global_keys).
  bypass_mode: pi_old = pi_b = batch["rollout_log_probs"]; batch["old_log_probs"] is not read.
      loss_type "ppo_clip": verl's vanilla PPO loss of pi_theta / pi_b on the kept tokens; IS weights are
      computed for the metrics only (the ratio is the correction already). "reinforce": per token
      -A * log pi_theta * w (w = 1 without rollout_is), no clipping. The rejection mask applies to the
      policy term only (entropy and KL keep response_mask), and the engine's counts include rejected
      tokens, as in verl's bypass training. policy_loss must stay "ppo".
  Micro-batching: the weights and the mask are per token or per row, so micro-batch invariant, except
  rollout_is_batch_normalize, whose mean is the mini-batch's through rollout_is_batch_mean. The engine
  fills it only where the weights depend on batch tensors alone (decoupled, recompute); with bypass_mode
  or prox_logp_method="loglinear" they depend on the current log-probs, known after each forward pass,
  so each call normalizes by its own mean (verl's bypass mode normalizes per micro-batch too) unless the
  caller passes rollout_is_batch_mean.

M2PO (Zheng et al. 2025, "Prosperity before Collapse", final version; AReaL/Trinity `m2_threshold`;
verl has no M2PO): no clipping; the surrogate is -A * ratio on the tokens it keeps. Candidates are the
tokens where clipping would act (A > 0 and ratio > 1, or A < 0 and ratio < 1); the candidates with the
largest (log ratio)^2 are dropped until the mean (log ratio)^2 of the kept candidates is <= m2_threshold.
Dropped tokens still count in the normalizer. The ratio is pi_theta / pi_old (pi_prox in decoupled
mode): pass the sampler's log-probs as old_log_probs to get the paper's pi_theta / pi_behav.
Known limit: the selection sorts the tokens of *this call*, so it is not micro-batch invariant; for
the paper's batch-level mask the engine must pass a whole mini-batch in one call.

Global normalization: with `global_num_tokens` / `global_num_seqs` each micro-batch loss is divided by
the global counts, so the sum of the micro-batch losses (and gradients) equals the full-batch loss,
whatever the split. Without them the local counts are used (the call is the whole batch). This is
verl's `agg_loss(..., batch_num_tokens, global_batch_size, dp_size=1)`: the engine must *sum* (not
average) gradients over micro-batches and workers. seq-mean-token-sum-norm also divides by
`loss_scale_factor`; its default R is this call's response width, so set it to a constant when
micro-batches are padded to different widths.

Metrics (python floats). SUM_METRICS (actor/pg_loss, actor/kl_loss, actor/entropy) are normalized like
the loss: with global counts, sum them over micro-batches to get the global value; every other metric
(actor/pg_clipfrac, actor/pg_clipfrac_lower, actor/ppo_kl, actor/m2po_*, rollout_corr/*) is a token mean
over this micro-batch (verl averages those over micro-batches). actor/kl_coef is a constant. verl's names:
rollout_corr/rollout_is_mean (before normalization), rollout_is_ratio_fraction_high,
rollout_is_oob_ratio (IcePop), rollout_is_batch_norm_factor; rollout_corr/rollout_rs_<option>_mean (the statistic's token mean),
_masked_fraction (tokens), _seq_masked_fraction (rows with response tokens), and over all options
rollout_rs_masked_fraction and rollout_rs_seq_masked_fraction (over all rows of the call, as verl).
"loss_type": "reinforce" reports actor/ppo_kl alone, as verl.

Legend: B rows, R response columns.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import cast

import torch
from torch import Tensor

from arctic_rl.losses import register_global_keys, register_loss_fn
from arctic_rl.losses.common import agg_loss, agg_options, batch_tensor, masked_mean, output_log_probs
from arctic_rl.losses.config import (
    AGG_MODES,
    KL_TYPES,
    POLICY_LOSS_NAMES,
    POST_PROCESSOR_KEYS,
    GRPOConfig,
    is_threshold,
    parse_loss_config,
)

__all__ = [
    "AGG_MODES",
    "KL_TYPES",
    "POST_PROCESSOR_KEYS",
    "SUM_METRICS",
    "GRPOConfig",
    "agg_loss",
    "grpo_loss",
    "masked_mean",
    "parse_config",
]

# ("loss:sum": the Tinker losses' metric, arctic_rl/losses/tinker.py)
SUM_METRICS = frozenset({"actor/pg_loss", "actor/kl_loss", "actor/entropy", "actor/sft_loss", "loss:sum"})
LOG_RATIO_BOUND = 20.0  # verl clamps log-ratios to +-20 before exp (exp(20) ~ 5e8)
GSPO_LOG_RATIO_MAX = 10.0


def parse_config(config: dict | None) -> GRPOConfig:
    """Validates a loss_config dict (arctic_rl.losses.config.GRPOConfig); raises ConfigError, a ValueError,
    naming the key, the value and what is allowed."""
    return cast(GRPOConfig, parse_loss_config("grpo", config))  # a built-in loss: never None


# ---------------------------------------------------------------------------------------------
# policy losses: (logp_BR, old_BR, adv_BR, mask_BR, cfg) -> (per-token loss_BR, metric tensors)

PolicyLoss = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, GRPOConfig], tuple[torch.Tensor, dict[str, torch.Tensor]]
]


def ppo_policy_loss(
    logp_BR: Tensor, old_BR: Tensor, adv_BR: Tensor, mask_BR: Tensor, cfg: GRPOConfig
) -> tuple[Tensor, dict[str, Tensor]]:
    """Clipped surrogate, plus dual clip: for A < 0 the loss is capped at -A * clip_ratio_c."""
    log_ratio_BR = (logp_BR - old_BR).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    ratio_BR = log_ratio_BR.exp()
    surr_BR = -adv_BR * ratio_BR
    surr_clip_BR = -adv_BR * ratio_BR.clamp(1 - cfg.clip_low, 1 + cfg.clip_high)
    clipped_BR = torch.maximum(surr_BR, surr_clip_BR)
    cap_BR = -adv_BR * cfg.clip_ratio_c
    loss_BR = torch.where(adv_BR < 0, torch.minimum(clipped_BR, cap_BR), clipped_BR)
    return loss_BR, {
        "actor/pg_clipfrac": masked_mean((surr_clip_BR > surr_BR).float(), mask_BR),
        "actor/pg_clipfrac_lower": masked_mean(((clipped_BR > cap_BR) & (adv_BR < 0)).float(), mask_BR),
        "actor/ppo_kl": masked_mean(-log_ratio_BR, mask_BR),
    }


def gspo_policy_loss(
    logp_BR: Tensor, old_BR: Tensor, adv_BR: Tensor, mask_BR: Tensor, cfg: GRPOConfig
) -> tuple[Tensor, dict[str, Tensor]]:
    """GSPO: every token of row i uses s_i = exp(mean_t log-ratio) as value, and the gradient of its
    own log-prob (log s_it = sg(log s_i) + logp - sg(logp)), clipped like PPO, no dual clip."""
    log_ratio_BR = logp_BR - old_BR
    n_B = mask_BR.sum(-1).clamp(min=1)
    seq_log_ratio_B = torch.where(mask_BR.bool(), log_ratio_BR, 0.0).sum(-1) / n_B
    log_s_BR = logp_BR - logp_BR.detach() + seq_log_ratio_B.detach().unsqueeze(-1)
    s_BR = log_s_BR.clamp(max=GSPO_LOG_RATIO_MAX).exp()
    surr_BR = -adv_BR * s_BR
    surr_clip_BR = -adv_BR * s_BR.clamp(1 - cfg.clip_low, 1 + cfg.clip_high)
    return torch.maximum(surr_BR, surr_clip_BR), {
        "actor/pg_clipfrac": masked_mean((surr_clip_BR > surr_BR).float(), mask_BR),
        "actor/pg_clipfrac_lower": torch.zeros(()),
        "actor/ppo_kl": masked_mean(-log_ratio_BR, mask_BR),
    }


def cispo_policy_loss(
    logp_BR: Tensor, old_BR: Tensor, adv_BR: Tensor, mask_BR: Tensor, cfg: GRPOConfig
) -> tuple[Tensor, dict[str, Tensor]]:
    """CISPO: REINFORCE on log-prob weighted by the clipped ratio, the weight stop-gradient, so
    clipped tokens still get a gradient (PPO would zero it)."""
    log_ratio_BR = (logp_BR - old_BR).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    ratio_BR = log_ratio_BR.exp()
    weight_BR = ratio_BR.clamp(1 - cfg.clip_low, 1 + cfg.clip_high)
    return -weight_BR.detach() * adv_BR * logp_BR, {
        "actor/pg_clipfrac": masked_mean((ratio_BR != weight_BR).float(), mask_BR),
        "actor/pg_clipfrac_lower": torch.zeros(()),
        "actor/ppo_kl": masked_mean(-log_ratio_BR, mask_BR),
    }


def m2po_keep_mask(
    log_ratio_BR: torch.Tensor, adv_BR: torch.Tensor, mask_BR: torch.Tensor, threshold: float
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Tokens M2PO keeps: drop the largest (log r)^2 among the would-be-clipped tokens until their
    mean (log r)^2 is <= threshold."""
    with torch.no_grad():
        lr_BR = log_ratio_BR.detach().float()
        cand_BR = mask_BR.bool() & (((adv_BR > 0) & (lr_BR > 0)) | ((adv_BR < 0) & (lr_BR < 0)))
        m2_N = lr_BR[cand_BR].square()
        keep_BR = mask_BR.bool().clone()
        m2_before = m2_N.mean() if m2_N.numel() else torch.zeros(())
        m2_after = m2_before
        if m2_N.numel() and m2_before > threshold:
            sorted_N, order_N = torch.sort(m2_N)
            prefix_mean_N = sorted_N.cumsum(0) / torch.arange(1, len(sorted_N) + 1, dtype=sorted_N.dtype)
            num_keep = int((prefix_mean_N <= threshold).sum())  # prefix means only grow: a prefix is kept
            kept_N = torch.ones_like(m2_N, dtype=torch.bool)
            kept_N[order_N[num_keep:]] = False
            keep_BR[cand_BR] = kept_N
            m2_after = sorted_N[:num_keep].mean() if num_keep else torch.zeros(())
    return keep_BR, {"actor/m2po_m2_before": m2_before, "actor/m2po_m2_after": m2_after}


def m2po_policy_loss(
    logp_BR: Tensor, old_BR: Tensor, adv_BR: Tensor, mask_BR: Tensor, cfg: GRPOConfig
) -> tuple[Tensor, dict[str, Tensor]]:
    """M2PO: unclipped -A * ratio on the tokens `m2po_keep_mask` keeps (dropped ones give 0)."""
    log_ratio_BR = logp_BR - old_BR
    keep_BR, stats = m2po_keep_mask(log_ratio_BR, adv_BR, mask_BR, cfg.m2_threshold)
    ratio_BR = log_ratio_BR.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND).exp()
    dropped_BR = mask_BR.bool() & ~keep_BR
    return torch.where(keep_BR, -adv_BR * ratio_BR, 0.0), {
        **stats,
        # the tokens whose gradient M2PO cuts play the role of PPO's clipped tokens
        "actor/pg_clipfrac": masked_mean(dropped_BR.float(), mask_BR),
        "actor/pg_clipfrac_lower": torch.zeros(()),
        "actor/ppo_kl": masked_mean(-log_ratio_BR, mask_BR),
    }


POLICY_LOSSES: dict[str, PolicyLoss] = {
    "ppo": ppo_policy_loss,
    "gspo": gspo_policy_loss,
    "cispo": cispo_policy_loss,
    "m2po": m2po_policy_loss,
}
assert tuple(POLICY_LOSSES) == POLICY_LOSS_NAMES  # the config's Literal names these


# ---------------------------------------------------------------------------------------------
# KL penalty and off-policy correction


def kl_estimate(logp_BR: torch.Tensor, ref_BR: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-token KL(pi || ref) estimators (Schulman's k1/k2/k3); k3 clamped as verl does."""
    base = kind.removesuffix("+")
    diff_BR = logp_BR - ref_BR
    if base in ("k1", "kl"):
        kl_BR = diff_BR
    elif base == "abs":
        kl_BR = diff_BR.abs()
    elif base in ("k2", "mse"):
        kl_BR = 0.5 * diff_BR.square()
    elif base in ("k3", "low_var_kl"):
        x_BR = (-diff_BR).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
        kl_BR = (x_BR.exp() - x_BR - 1).clamp(-10, 10)
    else:
        raise ValueError(f"loss_config['kl_loss_type'] = {kind!r}: expected one of {list(KL_TYPES)}")
    if kind.endswith("+") and base not in ("k2", "mse"):
        # k1/k3 estimate KL's value without bias but not its gradient; k2's gradient is the right one
        k2_BR = 0.5 * diff_BR.square()
        kl_BR = k2_BR - k2_BR.detach() + kl_BR.detach()
    return kl_BR


def loglinear_proximal(behav_BR: torch.Tensor, logp_BR: torch.Tensor, cfg: GRPOConfig) -> torch.Tensor:
    """log pi_prox = log pi_b + alpha * (sg(log pi_theta) - log pi_b); see the module docstring."""
    if cfg.prox_alpha is not None:
        alpha = cfg.prox_alpha
    else:  # GRPOConfig requires exactly one of the two with loglinear
        staleness = cast(float, cfg.prox_staleness)
        alpha = (staleness - 1) / staleness
    return behav_BR + alpha * (logp_BR.detach() - behav_BR)


def rollout_is_weights(
    anchor_BR: torch.Tensor, behav_BR: torch.Tensor, mask_BR: torch.Tensor, cfg: GRPOConfig
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Truncated, detached pi_anchor / pi_b per token ("token") or per row ("sequence"), as verl's
    compute_rollout_correction_weights before its batch normalization (`normalize_is_weights`)."""
    with torch.no_grad():
        log_w_BR = torch.where(mask_BR.bool(), anchor_BR.detach() - behav_BR, 0.0)
        if cfg.rollout_is == "sequence":
            log_w_BR = log_w_BR.sum(-1, keepdim=True).expand_as(log_w_BR)
        raw_BR = log_w_BR.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND).exp() * mask_BR
        upper, lower = is_threshold(cfg.rollout_is_threshold)
        if lower is None:
            w_BR = raw_BR.clamp(max=upper)
            out_BR = raw_BR > upper
        else:
            out_BR = (raw_BR < lower) | (raw_BR > upper)
            w_BR = torch.where(out_BR, 0.0, raw_BR)
    metrics = {
        "rollout_corr/rollout_is_mean": masked_mean(w_BR, mask_BR),
        "rollout_corr/rollout_is_ratio_fraction_high": masked_mean((raw_BR > upper).float(), mask_BR),
        "rollout_corr/rollout_is_out_of_bounds_fraction": masked_mean(out_BR.float(), mask_BR),
    }
    if lower is not None:  # verl's name for IcePop's fraction
        metrics["rollout_corr/rollout_is_oob_ratio"] = metrics["rollout_corr/rollout_is_out_of_bounds_fraction"]
    return w_BR, metrics


def is_weight_mean(w_BR: torch.Tensor, mask_BR: torch.Tensor, level: str | None) -> torch.Tensor:
    """The mean verl's rollout_is_batch_normalize divides by: over tokens ("token"), or over the rows with
    response tokens, one weight each ("sequence")."""
    mask_BR = mask_BR.bool()
    if level == "token":
        return torch.where(mask_BR, w_BR, 0.0).sum() / mask_BR.sum().clamp(min=1)
    has_tokens_B = mask_BR.any(-1)
    row_w_B = torch.where(mask_BR, w_BR, 0.0).amax(-1)  # weights are >= 0 and equal along a row
    return torch.where(has_tokens_B, row_w_B, 0.0).sum() / has_tokens_B.sum().clamp(min=1)


def normalize_is_weights(
    w_BR: torch.Tensor, mask_BR: torch.Tensor, cfg: GRPOConfig
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Weights divided by their mean over the mini-batch: cfg.rollout_is_batch_mean when the engine filled it
    (the whole mini-batch), else this call's own mean. A mean <= 1e-8 leaves them as they are (verl)."""
    if cfg.rollout_is_batch_mean is not None:
        mean = torch.tensor(cfg.rollout_is_batch_mean, dtype=w_BR.dtype)
    else:
        mean = is_weight_mean(w_BR, mask_BR, cfg.rollout_is)
    if mean <= 1e-8:
        return w_BR, {"rollout_corr/rollout_is_batch_norm_factor": torch.ones(())}
    return w_BR / mean.to(w_BR.device), {"rollout_corr/rollout_is_batch_norm_factor": mean}


def rs_statistic(option: str, log_ratio_BR: torch.Tensor, mask_BR: torch.Tensor) -> torch.Tensor:
    """verl's rejection statistic of `option` (config.RS_OPTIONS) for every token; a row's value on each of
    its tokens for the seq_* options. k1 = -log r, k2 = (log r)^2 / 2, k3 = r - 1 - log r."""
    lr_BR = log_ratio_BR.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    level, kind = option.rsplit("_", 1)
    if kind == "k1":
        tok_BR = -lr_BR
    elif kind == "k2":
        tok_BR = 0.5 * lr_BR.square()
    else:
        tok_BR = lr_BR.exp() - 1.0 - lr_BR
    if level == "token":
        return tok_BR
    mask_BR = mask_BR.bool()
    n_B = mask_BR.sum(-1)
    if level == "seq_max":
        row_B = torch.where(mask_BR, tok_BR, -torch.inf).amax(-1)
        row_B = torch.where(n_B > 0, row_B, 0.0)
    else:
        row_B = torch.where(mask_BR, tok_BR, 0.0).sum(-1)
        if level == "seq_mean":
            row_B = row_B / (n_B + 1e-8)  # verl's masked_mean
    return row_B.unsqueeze(-1).expand_as(tok_BR)


def rejection_keep(
    anchor_BR: torch.Tensor, behav_BR: torch.Tensor, mask_BR: torch.Tensor, cfg: GRPOConfig
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """verl's compute_rollout_rejection_mask: the response tokens every rollout_rs option keeps (a k1 option
    keeps log(lower) <= k1 <= log(upper); k2/k3 keep statistic <= upper), and verl's metrics."""
    metrics: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        mask_BR = mask_BR.bool()
        log_ratio_BR = anchor_BR.detach() - behav_BR
        has_tokens_B = mask_BR.any(-1)
        keep_BR = mask_BR.clone()
        for option, lower, upper in cfg.rs_spec:
            stat_BR = rs_statistic(option, log_ratio_BR, mask_BR)
            if lower is not None:
                opt_keep_BR = (stat_BR >= math.log(lower)) & (stat_BR <= math.log(upper))
            else:
                opt_keep_BR = stat_BR <= upper
            keep_BR &= opt_keep_BR
            hit_B = (mask_BR & ~opt_keep_BR).any(-1)
            name = f"rollout_corr/rollout_rs_{option}"
            metrics[f"{name}_mean"] = masked_mean(stat_BR, mask_BR)
            metrics[f"{name}_masked_fraction"] = masked_mean((~opt_keep_BR).float(), mask_BR)
            metrics[f"{name}_seq_masked_fraction"] = (hit_B & has_tokens_B).sum() / has_tokens_B.sum().clamp(min=1)
        metrics["rollout_corr/rollout_rs_masked_fraction"] = masked_mean((~keep_BR).float(), mask_BR)
        metrics["rollout_corr/rollout_rs_seq_masked_fraction"] = (mask_BR & ~keep_BR).any(-1).float().mean()
    return keep_BR, metrics


def reinforce_policy_loss(
    logp_BR: Tensor, behav_BR: Tensor, adv_BR: Tensor, mask_BR: Tensor, w_BR: Tensor | None
) -> tuple[Tensor, dict[str, Tensor]]:
    """verl's bypass-mode REINFORCE: -A * log pi_theta, times the detached IS weight when there is one."""
    loss_BR = -adv_BR * logp_BR if w_BR is None else -adv_BR * logp_BR * w_BR
    return loss_BR, {"actor/ppo_kl": masked_mean(behav_BR - logp_BR.detach(), mask_BR)}


@register_global_keys("grpo")
def grpo_global_keys(batch: dict, config: dict | None) -> dict[str, float]:
    """The loss_config keys that need the whole mini-batch, which the engine computes once before it splits
    the batch into micro-batches (arctic_rl/server/controller.py): in decoupled mode with recomputed old
    log-probs, `rollout_is_batch_mean`, and with rollout_rs the counts of the tokens and rows it keeps
    (rejected tokens leave verl's batch). Empty where the weights and the mask depend on the current
    log-probs (bypass_mode, prox_logp_method='loglinear'), which exist only after each forward pass."""
    cfg = parse_config(config)
    wanted = cfg.rollout_rs is not None or cfg.rollout_is_batch_normalize
    if not wanted or cfg.bypass_mode or cfg.prox_logp_method != "recompute":
        return {}
    mask = batch.get("response_mask")
    if not isinstance(mask, torch.Tensor) or mask.dim() != 2:
        raise ValueError("batch['response_mask'] must be a [B, R] tensor")
    mask_BR = mask.bool()
    prox_BR = batch_tensor(batch, "old_log_probs", mask_BR.shape, "rollout_rs / rollout_is_batch_normalize")
    behav_BR = batch_tensor(batch, "rollout_log_probs", mask_BR.shape, "rollout_rs / rollout_is_batch_normalize")
    out: dict[str, float] = {}
    if cfg.rollout_rs is not None:
        keep_BR, _ = rejection_keep(prox_BR, behav_BR, mask_BR, cfg)
        out["global_num_tokens"] = float(keep_BR.sum())
        out["global_num_seqs"] = float(keep_BR.any(-1).sum())
    if cfg.rollout_is_batch_normalize:
        w_BR, _ = rollout_is_weights(prox_BR, behav_BR, mask_BR, cfg)
        out["rollout_is_batch_mean"] = float(is_weight_mean(w_BR, mask_BR, cfg.rollout_is))
    return out


# ---------------------------------------------------------------------------------------------
# the loss


def _advantages(batch: dict, logp_BR: torch.Tensor) -> torch.Tensor:
    adv = batch.get("advantages")
    if not isinstance(adv, torch.Tensor):
        raise ValueError(f"batch['advantages'] must be a [B, R] or [B] tensor, got {type(adv).__name__}")
    B, R = logp_BR.shape
    if adv.shape == (B,):
        return adv.unsqueeze(-1).expand(B, R)  # one advantage per sequence (GRPO outcome reward)
    if adv.shape != (B, R):
        raise ValueError(f"batch['advantages'] must have shape [{B}, {R}] or [{B}], got {list(adv.shape)}")
    return adv


def _policies(batch: dict, logp_BR: torch.Tensor, cfg: GRPOConfig) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(the ratio's anchor pi_old, the sampler's log-probs or None when no correction reads them)."""
    shape = logp_BR.shape
    if cfg.bypass_mode:
        rollout_BR = batch_tensor(batch, "rollout_log_probs", shape, "bypass_mode")
        return rollout_BR, rollout_BR
    if cfg.prox_logp_method == "loglinear":
        behav_BR = batch_tensor(batch, "rollout_log_probs", shape, "prox_logp_method='loglinear'")
        return loglinear_proximal(behav_BR, logp_BR, cfg), behav_BR
    old_BR = batch_tensor(batch, "old_log_probs", shape, "the policy ratio")
    if cfg.rollout_is is None and cfg.rollout_rs is None:
        return old_BR, None
    return old_BR, batch_tensor(batch, "rollout_log_probs", shape, "rollout_is / rollout_rs")


@register_loss_fn("grpo")
def grpo_loss(outputs: dict, batch: dict, config: dict | None) -> tuple[torch.Tensor, dict[str, float]]:
    """The GRPO-family loss; see the module docstring for every config key and metric."""
    cfg = parse_config(config)
    logp_BR = output_log_probs(outputs)
    shape = logp_BR.shape
    mask_BR = batch_tensor(batch, "response_mask", shape, "every loss").bool()
    adv_BR = _advantages(batch, logp_BR).to(logp_BR.dtype)
    agg = agg_options(cfg)
    metrics: dict[str, torch.Tensor] = {}

    old_BR, behav_BR = _policies(batch, logp_BR, cfg)
    pg_mask_BR, w_BR = mask_BR, None
    if behav_BR is not None:
        # log w = log pi_anchor - log pi_b; the anchor is pi_prox (decoupled) or the current policy (bypass)
        anchor_BR = logp_BR.detach() if cfg.bypass_mode else old_BR
        if cfg.rollout_is is not None:
            w_BR, is_metrics = rollout_is_weights(anchor_BR, behav_BR, mask_BR, cfg)
            metrics.update(is_metrics)
            if cfg.rollout_is_batch_normalize:
                w_BR, norm_metrics = normalize_is_weights(w_BR, mask_BR, cfg)
                metrics.update(norm_metrics)
        if cfg.rollout_rs is not None:
            pg_mask_BR, rs_metrics = rejection_keep(anchor_BR, behav_BR, mask_BR, cfg)
            metrics.update(rs_metrics)
    if not cfg.bypass_mode:
        mask_BR = pg_mask_BR  # decoupled: verl drops rejected tokens from the batch (entropy and KL terms too)

    if cfg.bypass_mode and cfg.loss_type == "reinforce":
        pg_BR, pg_metrics = reinforce_policy_loss(logp_BR, old_BR, adv_BR, pg_mask_BR, w_BR)
    else:
        pg_BR, pg_metrics = POLICY_LOSSES[cfg.policy_loss](logp_BR, old_BR, adv_BR, pg_mask_BR, cfg)
        if w_BR is not None and not cfg.bypass_mode:  # bypass ppo_clip: the ratio is the IS weight already
            pg_BR = pg_BR * w_BR
    metrics.update(pg_metrics)
    pg_loss = agg_loss(pg_BR, pg_mask_BR, cfg.loss_agg_mode, **agg)
    metrics["actor/pg_loss"] = pg_loss
    loss = pg_loss

    entropy_BR = outputs.get("entropy")
    if cfg.entropy_coeff != 0 and entropy_BR is None:
        raise ValueError(
            f"loss_config['entropy_coeff'] = {cfg.entropy_coeff} needs outputs['entropy']: "
            "ask the post-processor for it (compute_entropy=True)"
        )
    if entropy_BR is not None:
        if entropy_BR.shape != shape:
            raise ValueError(f"outputs['entropy'] must have shape {list(shape)}, got {list(entropy_BR.shape)}")
        entropy = agg_loss(entropy_BR, mask_BR, cfg.loss_agg_mode, **agg)
        metrics["actor/entropy"] = entropy
        if cfg.entropy_coeff != 0:
            loss = loss - cfg.entropy_coeff * entropy

    if cfg.use_kl_loss:
        ref_BR = batch_tensor(batch, "ref_log_prob", shape, "use_kl_loss")
        kl_loss = agg_loss(kl_estimate(logp_BR, ref_BR, cfg.kl_loss_type), mask_BR, cfg.loss_agg_mode, **agg)
        loss = loss + cfg.kl_loss_coef * kl_loss
        metrics["actor/kl_loss"] = kl_loss
        metrics["actor/kl_coef"] = torch.tensor(cfg.kl_loss_coef)
    return loss, {k: float(v.detach()) for k, v in metrics.items()}
