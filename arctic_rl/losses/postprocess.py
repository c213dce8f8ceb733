"""Built-in post-processors: logits chunk -> per-token log-probs (and entropy)."""

from __future__ import annotations

import torch

from arctic_rl.losses import register_post_processor


@register_post_processor("log_probs")
def log_probs_and_entropy(logits_NV: torch.Tensor, labels_N: torch.Tensor, config: dict) -> dict:
    """log p(label) and, when config["compute_entropy"], the entropy of the distribution.

    `temperature` (default 1.0) divides the logits first, as the sampler did when it drew them.
    Computed in fp32: bf16 log-softmax over a 150k vocab loses ~1e-2 of accuracy.
    """
    temperature = float(config.get("temperature", 1.0))
    logits = logits_NV.float()
    if temperature != 1.0:
        logits = logits / temperature
    logz_N = torch.logsumexp(logits, dim=-1)
    out = {"log_probs": logits.gather(-1, labels_N.unsqueeze(-1)).squeeze(-1) - logz_N}
    if config.get("compute_entropy"):
        p = torch.softmax(logits, dim=-1)
        out["entropy"] = logz_N - (p * logits).sum(-1)
    return out


@register_post_processor("temperature")
def temperature_scaled(logits_NV: torch.Tensor, labels_N: torch.Tensor, config: dict) -> dict:
    """Same as `log_probs`, but `temperature` is required (no silent default of 1.0)."""
    if "temperature" not in config:
        raise ValueError("post_processor 'temperature' needs config['temperature'] (a float > 0)")
    if float(config["temperature"]) <= 0:
        raise ValueError(f"temperature must be > 0, got {config['temperature']!r}")
    return log_probs_and_entropy(logits_NV, labels_N, config)
