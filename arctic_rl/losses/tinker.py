"""Tinker's built-in losses (`cross_entropy`, `importance_sampling`, `ppo`, `cispo`, `dro`), with the formulas of
Tinker's loss documentation: every loss is a *sum* over the batch's tokens (no mean), so micro-batch losses add
up to the full-batch loss without the engine's global normalizers.

`fn(outputs, batch, config) -> (loss, metrics)`; outputs["log_probs"] [B, R] are the trainer's log-probs of the
target tokens (Tinker's `target_logprobs`). Batch keys (arctic_rl/batch.py), all [B, R]:
  response_mask       1 on real target tokens (padding is 0 and never counts)
  weights             cross_entropy: per-token weight          loss = -sum(w * lp)
  rollout_log_probs   the sampler's log-probs q (`sampling_logprobs`); ratio = exp(lp - q)
  advantages          per-token advantages A
    importance_sampling  loss = -sum(ratio * A)
    ppo                  loss = -sum(min(ratio * A, clip(ratio, low, high) * A))
    cispo                loss = -sum(sg(clip(ratio, low, high)) * lp * A)
    dro                  loss = -sum(lp * A - beta / 2 * (lp - q)^2)
Config (loss_fn_config, arctic_rl.losses.config.TinkerLossConfig): clip_low_threshold 0.8, clip_high_threshold
1.2 (ppo, cispo), beta (dro, required). Metric: "loss:sum" (Tinker's name), summed over micro-batches.

Legend: B rows, R response columns.
"""

from __future__ import annotations

from typing import cast

import torch

from arctic_rl.losses import register_loss_fn
from arctic_rl.losses.common import batch_tensor, output_log_probs
from arctic_rl.losses.config import TinkerLossConfig, parse_loss_config


def _masked_sum(x_BR: torch.Tensor, mask_BR: torch.Tensor) -> torch.Tensor:
    return torch.where(mask_BR.bool(), x_BR, 0.0).sum()  # where, not *: padding may hold inf * 0


def _inputs(name: str, outputs: dict, batch: dict, config: dict | None, keys: tuple[str, ...]):
    cfg = cast(TinkerLossConfig, parse_loss_config(name, config))
    lp = output_log_probs(outputs)
    mask = batch_tensor(batch, "response_mask", lp.shape, f"the {name} loss")
    return cfg, lp, mask, [batch_tensor(batch, k, lp.shape, f"the {name} loss").to(lp.dtype) for k in keys]


def _done(loss: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
    return loss, {"loss:sum": float(loss.detach())}


@register_loss_fn("cross_entropy")
def cross_entropy(outputs: dict, batch: dict, config: dict | None) -> tuple[torch.Tensor, dict[str, float]]:
    _, lp, mask, (w,) = _inputs("cross_entropy", outputs, batch, config, ("weights",))
    return _done(_masked_sum(-lp * w, mask))


@register_loss_fn("importance_sampling")
def importance_sampling(outputs: dict, batch: dict, config: dict | None) -> tuple[torch.Tensor, dict[str, float]]:
    _, lp, mask, (q, adv) = _inputs("importance_sampling", outputs, batch, config, ("rollout_log_probs", "advantages"))
    return _done(-_masked_sum(torch.exp(lp - q) * adv, mask))


@register_loss_fn("ppo")
def ppo(outputs: dict, batch: dict, config: dict | None) -> tuple[torch.Tensor, dict[str, float]]:
    cfg, lp, mask, (q, adv) = _inputs("ppo", outputs, batch, config, ("rollout_log_probs", "advantages"))
    ratio = torch.exp(lp - q)
    clipped = torch.clamp(ratio, cfg.clip_low_threshold, cfg.clip_high_threshold)
    return _done(-_masked_sum(torch.minimum(ratio * adv, clipped * adv), mask))


@register_loss_fn("cispo")
def cispo(outputs: dict, batch: dict, config: dict | None) -> tuple[torch.Tensor, dict[str, float]]:
    cfg, lp, mask, (q, adv) = _inputs("cispo", outputs, batch, config, ("rollout_log_probs", "advantages"))
    clipped = torch.clamp(torch.exp(lp - q), cfg.clip_low_threshold, cfg.clip_high_threshold).detach()
    return _done(-_masked_sum(clipped * lp * adv, mask))


@register_loss_fn("dro")
def dro(outputs: dict, batch: dict, config: dict | None) -> tuple[torch.Tensor, dict[str, float]]:
    cfg, lp, mask, (q, adv) = _inputs("dro", outputs, batch, config, ("rollout_log_probs", "advantages"))
    if cfg.beta is None:
        raise ValueError("the dro loss needs loss_fn_config['beta'] (the quadratic penalty's weight)")
    return _done(-_masked_sum(lp * adv - 0.5 * cfg.beta * (lp - q) ** 2, mask))
