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

Unknown keys raise ValueError (a typo must not silently fall back to a default); `temperature` and
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
from dataclasses import dataclass

import torch
from torch import Tensor

from arctic_rl.losses import register_loss_fn

AGG_MODES = ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
KL_TYPES = ("k1", "kl", "abs", "k2", "mse", "k3", "low_var_kl")
# Read by the engine's post-processor from the same loss_config (arctic_rl/engines/training.py); ignored here.
POST_PROCESSOR_KEYS = ("temperature", "compute_entropy")
SUM_METRICS = frozenset({"actor/pg_loss", "actor/kl_loss", "actor/entropy", "actor/sft_loss"})
LOG_RATIO_BOUND = 20.0  # verl clamps log-ratios to +-20 before exp (exp(20) ~ 5e8)
GSPO_LOG_RATIO_MAX = 10.0


# ---------------------------------------------------------------------------------------------
# config


@dataclass(frozen=True)
class GRPOConfig:
    policy_loss: str = "ppo"
    clip_ratio: float = 0.2
    clip_ratio_low: float | None = None
    clip_ratio_high: float | None = None
    clip_ratio_c: float = 3.0
    m2_threshold: float = 0.04
    loss_agg_mode: str = "token-mean"
    loss_scale_factor: float | None = None
    entropy_coeff: float = 0.0
    use_kl_loss: bool = False
    kl_loss_coef: float = 0.001
    kl_loss_type: str = "low_var_kl"
    rollout_is: str | None = None
    rollout_is_threshold: float | str = 2.0
    prox_logp_method: str = "recompute"
    prox_alpha: float | None = None
    prox_staleness: int | None = None
    global_num_tokens: float | None = None
    global_num_seqs: float | None = None

    @property
    def clip_low(self) -> float:
        return self.clip_ratio if self.clip_ratio_low is None else self.clip_ratio_low

    @property
    def clip_high(self) -> float:
        return self.clip_ratio if self.clip_ratio_high is None else self.clip_ratio_high


def _bad(key: str, value, want: str) -> ValueError:
    return ValueError(f"loss_config[{key!r}] = {value!r}: {want}")


def _number(
    cfg: dict, key: str, default, *, min_value: float | None = None, above: float | None = None, optional: bool = False
):
    value = cfg.get(key, default)
    if value is None and optional:
        return None
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _bad(key, value, "expected a number")
    if min_value is not None and value < min_value:
        raise _bad(key, value, f"must be >= {min_value}")
    if above is not None and value <= above:
        raise _bad(key, value, f"must be > {above}")
    return float(value)


def _choice(cfg: dict, key: str, default, choices) -> str:
    value = cfg.get(key, default)
    if value not in choices:
        raise _bad(key, value, f"expected one of {list(choices)}")
    return value


def _is_threshold(value) -> tuple[float, float | None]:
    """(upper, lower or None) from verl's rollout_is_threshold spec: 2.0 or "0.5_2.0"."""
    lower = None
    try:
        if isinstance(value, str) and "_" in value:
            lo, hi = value.split("_", 1)
            lower, upper = float(lo), float(hi)
        elif isinstance(value, bool):
            raise TypeError
        else:
            upper = float(value)
    except (TypeError, ValueError):
        raise _bad("rollout_is_threshold", value, 'expected a float or a "lower_upper" string like "0.5_2.0"') from None
    if upper <= 0 or (lower is not None and not 0 < lower <= upper):
        raise _bad("rollout_is_threshold", value, "bounds must satisfy 0 < lower <= upper")
    return upper, lower


def parse_config(config: dict | None) -> GRPOConfig:
    """Validates a loss_config dict; raises ValueError naming the key and value."""
    cfg = {k: v for k, v in (config or {}).items() if k not in POST_PROCESSOR_KEYS}
    known = set(GRPOConfig.__dataclass_fields__) | set(POST_PROCESSOR_KEYS)
    unknown = sorted(set(cfg) - known)
    if unknown:
        raise ValueError(f"unknown loss_config key(s) {unknown}; known: {sorted(known)}")
    use_kl = cfg.get("use_kl_loss", False)
    if not isinstance(use_kl, bool):
        raise _bad("use_kl_loss", use_kl, "expected true or false")
    kl_type = cfg.get("kl_loss_type", "low_var_kl")
    if not isinstance(kl_type, str) or kl_type.removesuffix("+") not in KL_TYPES:
        raise _bad("kl_loss_type", kl_type, f"expected one of {list(KL_TYPES)}, optionally with a '+' suffix")
    threshold = cfg.get("rollout_is_threshold", 2.0)
    _is_threshold(threshold)
    out = GRPOConfig(
        policy_loss=_choice(cfg, "policy_loss", "ppo", POLICY_LOSSES),
        clip_ratio=_number(cfg, "clip_ratio", 0.2, min_value=0.0),
        clip_ratio_low=_number(cfg, "clip_ratio_low", None, min_value=0.0, optional=True),
        clip_ratio_high=_number(cfg, "clip_ratio_high", None, min_value=0.0, optional=True),
        clip_ratio_c=_number(cfg, "clip_ratio_c", 3.0, above=1.0),
        m2_threshold=_number(cfg, "m2_threshold", 0.04, min_value=0.0),
        loss_agg_mode=_choice(cfg, "loss_agg_mode", "token-mean", AGG_MODES),
        loss_scale_factor=_number(cfg, "loss_scale_factor", None, above=0.0, optional=True),
        entropy_coeff=_number(cfg, "entropy_coeff", 0.0),
        use_kl_loss=use_kl,
        kl_loss_coef=_number(cfg, "kl_loss_coef", 0.001),
        kl_loss_type=kl_type,
        rollout_is=_choice(cfg, "rollout_is", None, (None, "token", "sequence")),
        rollout_is_threshold=threshold,
        prox_logp_method=_choice(cfg, "prox_logp_method", "recompute", ("recompute", "loglinear")),
        prox_alpha=_number(cfg, "prox_alpha", None, min_value=0.0, optional=True),
        prox_staleness=_number(cfg, "prox_staleness", None, min_value=1.0, optional=True),
        global_num_tokens=_number(cfg, "global_num_tokens", None, min_value=0.0, optional=True),
        global_num_seqs=_number(cfg, "global_num_seqs", None, min_value=0.0, optional=True),
    )
    if out.prox_alpha is not None and out.prox_alpha > 1.0:
        raise _bad("prox_alpha", out.prox_alpha, "must be in [0, 1]")
    if out.prox_logp_method == "loglinear" and (out.prox_alpha is None) == (out.prox_staleness is None):
        raise ValueError(
            "prox_logp_method='loglinear' needs exactly one of loss_config['prox_alpha'] "
            f"(got {out.prox_alpha!r}) and loss_config['prox_staleness'] (got {out.prox_staleness!r})"
        )
    if out.prox_logp_method == "recompute" and (out.prox_alpha is not None or out.prox_staleness is not None):
        raise ValueError(
            "loss_config['prox_alpha'] / ['prox_staleness'] only apply with "
            "prox_logp_method='loglinear' (got prox_logp_method='recompute')"
        )
    return out


# ---------------------------------------------------------------------------------------------
# aggregation


def agg_loss(
    loss_BR: torch.Tensor,
    mask_BR: torch.Tensor,
    mode: str,
    *,
    num_tokens: float | None = None,
    num_seqs: float | None = None,
    scale_factor: float | None = None,
) -> torch.Tensor:
    """verl's agg_loss with dp_size=1: `num_tokens` / `num_seqs` are the global normalizers (local
    counts when None). An empty batch gives 0, not verl's 0/0 = NaN."""
    mask_BR = mask_BR.bool()
    tok_sum_B = torch.where(mask_BR, loss_BR, 0.0).sum(-1)  # where, not *: inf * 0 would be NaN
    n_B = mask_BR.sum(-1)
    if mode == "token-mean":
        n = float(n_B.sum()) if num_tokens is None else num_tokens
        return tok_sum_B.sum() / max(n, 1.0)
    if mode == "token-sum":
        return tok_sum_B.sum()
    if mode not in AGG_MODES:
        raise _bad("loss_agg_mode", mode, f"expected one of {list(AGG_MODES)}")
    has_tokens_B = n_B > 0  # rows without response tokens are not sequences
    per_seq_B = tok_sum_B / (n_B + 1e-8) if mode == "seq-mean-token-mean" else tok_sum_B
    s = float(has_tokens_B.sum()) if num_seqs is None else num_seqs
    loss = torch.where(has_tokens_B, per_seq_B, 0.0).sum() / max(s, 1.0)
    if mode == "seq-mean-token-sum-norm":
        loss = loss / (mask_BR.shape[-1] if scale_factor is None else scale_factor)  # verl: default R
    return loss


def masked_mean(x_BR: torch.Tensor, mask_BR: torch.Tensor) -> torch.Tensor:
    """verl's masked_mean (sum / (count + 1e-8)), for metrics."""
    return torch.where(mask_BR.bool(), x_BR, 0.0).sum() / (mask_BR.sum() + 1e-8)


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
        raise _bad("kl_loss_type", kind, f"expected one of {list(KL_TYPES)}")
    if kind.endswith("+") and base not in ("k2", "mse"):
        # k1/k3 estimate KL's value without bias but not its gradient; k2's gradient is the right one
        k2_BR = 0.5 * diff_BR.square()
        kl_BR = k2_BR - k2_BR.detach() + kl_BR.detach()
    return kl_BR


def loglinear_proximal(behav_BR: torch.Tensor, logp_BR: torch.Tensor, cfg: GRPOConfig) -> torch.Tensor:
    """log pi_prox = log pi_b + alpha * (sg(log pi_theta) - log pi_b); see the module docstring."""
    alpha = cfg.prox_alpha if cfg.prox_alpha is not None else (cfg.prox_staleness - 1) / cfg.prox_staleness
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
        upper, lower = _is_threshold(cfg.rollout_is_threshold)
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


def _tensor(batch: dict, key: str, shape: torch.Size, why: str) -> torch.Tensor:
    if key not in batch or batch[key] is None:
        raise ValueError(f"batch is missing {key!r}, needed for {why}")
    x = batch[key]
    if not isinstance(x, torch.Tensor) or x.shape != shape:
        got = list(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"batch[{key!r}] must have shape {list(shape)} like outputs['log_probs'], got {got}")
    return x


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


def _log_probs(outputs: dict) -> torch.Tensor:
    logp = outputs.get("log_probs") if isinstance(outputs, dict) else None
    if not isinstance(logp, torch.Tensor) or logp.dim() != 2:
        got = list(logp.shape) if isinstance(logp, torch.Tensor) else type(logp).__name__
        raise ValueError(f"outputs['log_probs'] must be a [B, R] tensor, got {got}")
    return logp


def agg_options(cfg: GRPOConfig) -> dict:
    return {"num_tokens": cfg.global_num_tokens, "num_seqs": cfg.global_num_seqs, "scale_factor": cfg.loss_scale_factor}


@register_loss_fn("grpo")
def grpo_loss(outputs: dict, batch: dict, config: dict | None) -> tuple[torch.Tensor, dict[str, float]]:
    """The GRPO-family loss; see the module docstring for every config key and metric."""
    cfg = parse_config(config)
    logp_BR = _log_probs(outputs)
    shape = logp_BR.shape
    mask_BR = _tensor(batch, "response_mask", shape, "every loss").bool()
    adv_BR = _advantages(batch, logp_BR).to(logp_BR.dtype)
    agg = agg_options(cfg)
    metrics: dict[str, torch.Tensor] = {}

    decoupled = cfg.rollout_is is not None or cfg.prox_logp_method == "loglinear"
    behav_BR = (
        _tensor(batch, "rollout_log_probs", shape, "rollout_is / prox_logp_method='loglinear'") if decoupled else None
    )
    if cfg.prox_logp_method == "loglinear":
        prox_BR = loglinear_proximal(behav_BR, logp_BR, cfg)
    else:
        prox_BR = _tensor(batch, "old_log_probs", shape, "the policy ratio")

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
        ref_BR = _tensor(batch, "ref_log_prob", shape, "use_kl_loss")
        kl_loss = agg_loss(kl_estimate(logp_BR, ref_BR, cfg.kl_loss_type), mask_BR, cfg.loss_agg_mode, **agg)
        loss = loss + cfg.kl_loss_coef * kl_loss
        metrics["actor/kl_loss"] = kl_loss
        metrics["actor/kl_coef"] = torch.tensor(cfg.kl_loss_coef)
    return loss, {k: float(v.detach()) for k, v in metrics.items()}
