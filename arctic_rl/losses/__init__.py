"""Loss and post-processor registries.

A loss is `fn(outputs, batch, config) -> (loss, metrics)`:
  outputs: {"log_probs": [B, R], "entropy": [B, R] (when asked)} from the current policy
  batch:   verl-named tensors (`response_mask`, `old_log_probs`, `advantages`, `ref_log_prob`, ...)
  config:  the user's `loss_config` dict, plus the engine's global normalizers
           (`global_num_tokens`, `global_num_seqs`: counts over the *whole* global batch, across
           micro-batches and workers) so that summing micro-batch losses gives the full-batch loss.
A post-processor turns a chunk of logits into per-token outputs: `fn(logits_NV, labels_N, config)
-> {"log_probs": [N], "entropy": [N]?}`; it runs chunk by chunk so [tokens, vocab] logits are
never held for the whole batch.

Names resolve through the registry or as a dotted path (`pkg.module:fn` or `pkg.module.fn`).
This module imports only torch, so losses test on plain tensors.
"""
from __future__ import annotations

import importlib
from typing import Callable

LOSS_FNS: dict[str, Callable] = {}
POST_PROCESSORS: dict[str, Callable] = {}


def register_loss_fn(name: str):
    def deco(fn):
        LOSS_FNS[name] = fn
        return fn
    return deco


def register_post_processor(name: str):
    def deco(fn):
        POST_PROCESSORS[name] = fn
        return fn
    return deco


def _resolve(name: str, table: dict[str, Callable], what: str) -> Callable:
    _load_builtins()
    if not isinstance(name, str) or not name:
        raise ValueError(f"{what} must be a non-empty string, got {name!r}")
    if name in table:
        return table[name]
    if "." in name or ":" in name:
        mod_name, _, attr = name.replace(":", ".").rpartition(".")
        try:
            fn = getattr(importlib.import_module(mod_name), attr)
        except (ImportError, AttributeError) as e:
            raise ValueError(f"{what} {name!r}: cannot import it ({e})") from e
        if not callable(fn):
            raise ValueError(f"{what} {name!r} is not callable")
        return fn
    raise ValueError(f"unknown {what} {name!r}; known: {sorted(table)} (or a dotted path to a function)")


def resolve_loss_fn(name: str) -> Callable:
    return _resolve(name, LOSS_FNS, "loss_fn")


def resolve_post_processor(name: str) -> Callable:
    return _resolve(name, POST_PROCESSORS, "post_processor")


_loaded = False


def _load_builtins() -> None:
    # Imported lazily so that `import arctic_rl.losses` stays cheap and cycle-free.
    global _loaded
    if _loaded:
        return
    _loaded = True
    for mod in ("postprocess", "grpo", "sft"):
        try:
            importlib.import_module(f"{__name__}.{mod}")
        except ModuleNotFoundError as e:
            if e.name != f"{__name__}.{mod}":
                raise
