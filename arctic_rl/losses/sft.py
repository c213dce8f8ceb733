"""Supervised fine-tuning loss: masked cross-entropy, -log p(response token).

`sft(outputs, batch, config) -> (loss, metrics)` with outputs = {"log_probs": [B, R]} and
batch = {"response_mask": [B, R]}. Config keys (the same meaning as in `grpo`; the model is arctic_rl.losses.config.SFTConfig):
  loss_agg_mode      "token-mean"   token-mean | token-sum | seq-mean-token-sum |
                                    seq-mean-token-mean | seq-mean-token-sum-norm
  loss_scale_factor  None (= R)     divisor of seq-mean-token-sum-norm
  global_num_tokens / global_num_seqs   the engine's global normalizers: with them, the sum of the
                                    micro-batch losses equals the full-batch loss (verl's sft_loss
                                    divides by the global token count the same way)
  temperature / compute_entropy      accepted and ignored (the engine's post-processor reads them)
Metric: actor/sft_loss (normalized like the loss: sum it over micro-batches when global counts are
given, a per-call mean otherwise).

Legend: B rows, R response columns.
"""

from __future__ import annotations

from typing import cast

import torch

from arctic_rl.losses import register_loss_fn
from arctic_rl.losses.common import agg_loss, agg_options, batch_tensor, output_log_probs
from arctic_rl.losses.config import SFTConfig, parse_loss_config

SFT_KEYS = tuple(SFTConfig.model_fields)


@register_loss_fn("sft")
def sft_loss(outputs: dict, batch: dict, config: dict | None) -> tuple[torch.Tensor, dict[str, float]]:
    cfg = cast(SFTConfig, parse_loss_config("sft", config))  # a built-in loss: never None
    logp_BR = output_log_probs(outputs)
    mask_BR = batch_tensor(batch, "response_mask", logp_BR.shape, "the sft loss")
    loss = agg_loss(-logp_BR, mask_BR, cfg.loss_agg_mode, **agg_options(cfg))
    return loss, {"actor/sft_loss": float(loss.detach())}
