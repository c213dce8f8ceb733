"""A loss plugin for tests/e2e/test_security_deploy.py: the server imports it at start (server.loss_modules),
and requests may then name what it registers."""

from __future__ import annotations

from arctic_rl import register_loss_fn, register_post_processor
from arctic_rl.losses.postprocess import log_probs_and_entropy
from arctic_rl.losses.sft import sft_loss


@register_loss_fn("plugin_sft")
def plugin_sft(outputs, batch, config):
    return sft_loss(outputs, batch, config)


@register_loss_fn("plugin_buggy")
def plugin_buggy(outputs, batch, config):
    """Passes the controller's dry run (no gradients there) and fails in the training engine: an engine bug."""
    if outputs["log_probs"].requires_grad:
        raise ValueError("bug in plugin_buggy")
    return sft_loss(outputs, batch, config)


@register_post_processor("plugin_half")
def plugin_half(logits_NV, labels_N, config):
    out = log_probs_and_entropy(logits_NV, labels_N, config)
    return {**out, "log_probs": out["log_probs"] / 2}
