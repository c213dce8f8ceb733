"""Supervised fine-tuning loss: masked cross-entropy, -log p(response token).

`sft(outputs, batch, config) -> (loss, metrics)` with outputs = {"log_probs": [B, R]} and
batch = {"response_mask": [B, R]}. Config keys (the same meaning as in `grpo`):
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

import torch

from arctic_rl.losses import register_loss_fn
from arctic_rl.losses.grpo import AGG_MODES, POST_PROCESSOR_KEYS, _bad, _log_probs, _number, _tensor, agg_loss

SFT_KEYS = ("loss_agg_mode", "loss_scale_factor", "global_num_tokens", "global_num_seqs", *POST_PROCESSOR_KEYS)


@register_loss_fn("sft")
def sft_loss(outputs: dict, batch: dict, config: dict | None) -> tuple[torch.Tensor, dict[str, float]]:
    cfg = dict(config or {})
    unknown = sorted(set(cfg) - set(SFT_KEYS))
    if unknown:
        raise ValueError(f"unknown loss_config key(s) {unknown} for loss 'sft'; known: {list(SFT_KEYS)}")
    mode = cfg.get("loss_agg_mode", "token-mean")
    if mode not in AGG_MODES:
        raise _bad("loss_agg_mode", mode, f"expected one of {list(AGG_MODES)}")
    logp_BR = _log_probs(outputs)
    mask_BR = _tensor(batch, "response_mask", logp_BR.shape, "the sft loss")
    loss = agg_loss(
        -logp_BR,
        mask_BR,
        mode,
        num_tokens=_number(cfg, "global_num_tokens", None, min_value=0.0, optional=True),
        num_seqs=_number(cfg, "global_num_seqs", None, min_value=0.0, optional=True),
        scale_factor=_number(cfg, "loss_scale_factor", None, above=0.0, optional=True),
    )
    return loss, {"actor/sft_loss": float(loss.detach())}
