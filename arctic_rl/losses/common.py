"""What the built-in losses share: verl's loss aggregation, masked means, and the checks of their tensor
inputs (each raises ValueError naming the key and the shape it needs).

Legend: B rows, R response columns.
"""

from __future__ import annotations

import torch

from arctic_rl.losses.config import AGG_MODES


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
        raise ValueError(f"loss_config['loss_agg_mode'] = {mode!r}: expected one of {list(AGG_MODES)}")
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


def batch_tensor(batch: dict, key: str, shape: torch.Size, why: str) -> torch.Tensor:
    """batch[key], which must be a tensor of `shape` (that of outputs['log_probs'])."""
    if key not in batch or batch[key] is None:
        raise ValueError(f"batch is missing {key!r}, needed for {why}")
    x = batch[key]
    if not isinstance(x, torch.Tensor) or x.shape != shape:
        got = list(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"batch[{key!r}] must have shape {list(shape)} like outputs['log_probs'], got {got}")
    return x


def output_log_probs(outputs: dict) -> torch.Tensor:
    """outputs['log_probs'], which must be a [B, R] tensor."""
    logp = outputs.get("log_probs") if isinstance(outputs, dict) else None
    if not isinstance(logp, torch.Tensor) or logp.dim() != 2:
        got = list(logp.shape) if isinstance(logp, torch.Tensor) else type(logp).__name__
        raise ValueError(f"outputs['log_probs'] must be a [B, R] tensor, got {got}")
    return logp


def agg_options(cfg) -> dict:
    """agg_loss's normalizer keywords from a loss config (arctic_rl.losses.config.LossConfigBase)."""
    return {"num_tokens": cfg.global_num_tokens, "num_seqs": cfg.global_num_seqs, "scale_factor": cfg.loss_scale_factor}
