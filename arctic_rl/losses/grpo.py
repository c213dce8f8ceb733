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
  rollout_is               None           off-policy correction: None | "token" | "sequence"
  rollout_is_threshold     2.0            float: truncate weights at it (TIS); "lo_hi" string, e.g.
                                          "0.5_2.0": zero weights outside [lo, hi] (IcePop)
  prox_logp_method         "recompute"    where the proximal policy comes from (see below)
  prox_alpha / prox_staleness  -          "loglinear" only: the interpolation weight (exactly one)
  global_num_tokens        (engine)       response tokens in the whole global batch
  global_num_seqs          (engine)       rows with >= 1 response token in the whole global batch

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
over this micro-batch (verl averages those over micro-batches). actor/kl_coef is a constant.

Legend: B rows, R response columns.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

import torch
from torch import Tensor

from arctic_rl.losses import register_loss_fn
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
    prox_BR: torch.Tensor, behav_BR: torch.Tensor, mask_BR: torch.Tensor, cfg: GRPOConfig
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Truncated, detached pi_prox / pi_b per token ("token") or per row ("sequence"), as verl's
    compute_rollout_correction_weights without batch normalization (which is not micro-batch
    invariant)."""
    with torch.no_grad():
        log_w_BR = torch.where(mask_BR.bool(), prox_BR.detach() - behav_BR, 0.0)
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
    return w_BR, {
        "rollout_corr/rollout_is_mean": masked_mean(w_BR, mask_BR),
        "rollout_corr/rollout_is_ratio_fraction_high": masked_mean((raw_BR > upper).float(), mask_BR),
        "rollout_corr/rollout_is_out_of_bounds_fraction": masked_mean(out_BR.float(), mask_BR),
    }


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

    decoupled = cfg.rollout_is is not None or cfg.prox_logp_method == "loglinear"
    behav_BR = torch.empty(0)  # read only when decoupled
    if decoupled:
        behav_BR = batch_tensor(batch, "rollout_log_probs", shape, "rollout_is / prox_logp_method='loglinear'")
    if cfg.prox_logp_method == "loglinear":
        prox_BR = loglinear_proximal(behav_BR, logp_BR, cfg)
    else:
        prox_BR = batch_tensor(batch, "old_log_probs", shape, "the policy ratio")

    pg_BR, pg_metrics = POLICY_LOSSES[cfg.policy_loss](logp_BR, prox_BR, adv_BR, mask_BR, cfg)
    metrics.update(pg_metrics)
    if cfg.rollout_is is not None:
        w_BR, is_metrics = rollout_is_weights(prox_BR, behav_BR, mask_BR, cfg)
        pg_BR = pg_BR * w_BR
        metrics.update(is_metrics)
    pg_loss = agg_loss(pg_BR, mask_BR, cfg.loss_agg_mode, **agg)
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
