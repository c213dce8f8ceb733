"""Loss and post-processor registries.

A loss is `fn(outputs, batch, config) -> (loss, metrics)`:
  outputs: {"log_probs": [B, R], "entropy": [B, R] (when asked)} from the current policy
  batch:   verl-named tensors (`response_mask`, `old_log_probs`, `advantages`, `ref_log_prob`, ...)
  config:  the user's `loss_config` dict, plus the engine's global normalizers
           (`global_num_tokens`, `global_num_seqs`: counts over the *whole* global batch, across
           micro-batches and workers) so that summing micro-batch losses gives the full-batch loss.
A loss may also register `global_keys(batch, config) -> dict` (`@register_global_keys("name")`): loss_config
keys computed over the whole mini-batch, which the engine adds (the caller's own values win) before it splits
the batch into micro-batches, as it adds `global_num_tokens`; grpo's rollout_is_batch_normalize needs it.
A post-processor turns a chunk of logits into per-token outputs: `fn(logits_NV, labels_N, config)
-> {"log_probs": [N], "entropy": [N]?}`; it runs chunk by chunk so [tokens, vocab] logits are
never held for the whole batch.

Names resolve through the registry. A dotted path (`pkg.module:fn` or `pkg.module.fn`) resolves
only with `allow_imports=True`: importing a module runs its code, so the server allows it only when
started with `--allow-imports`. The supported way to add a loss to a server is a plugin module listed
in its config (`server.loss_modules`), imported at start by `load_loss_modules`.
This module imports nothing heavy (its losses only torch), so losses test on plain tensors.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from arctic_rl.errors import ConfigError, UnknownNameError

LOSS_FNS: dict[str, Callable] = {}
POST_PROCESSORS: dict[str, Callable] = {}
GLOBAL_KEY_FNS: dict[str, Callable] = {}


def register_loss_fn(name: str):
    def deco(fn):
        LOSS_FNS[name] = fn
        return fn

    return deco


def register_global_keys(name: str):
    def deco(fn):
        GLOBAL_KEY_FNS[name] = fn
        return fn

    return deco


def global_loss_keys(loss_fn: str, batch: dict, config: dict) -> dict:
    """The loss_config keys loss `loss_fn` computes over the whole mini-batch `batch` ({} for a loss without a
    `register_global_keys` function); raises ValueError for a bad config or batch."""
    _load_builtins()
    fn = GLOBAL_KEY_FNS.get(loss_fn) if isinstance(loss_fn, str) else None
    return fn(batch, config) if fn is not None else {}


def register_post_processor(name: str):
    def deco(fn):
        POST_PROCESSORS[name] = fn
        return fn

    return deco


def _resolve(name: str, table: dict[str, Callable], what: str, allow_imports: bool) -> Callable:
    _load_builtins()
    if not isinstance(name, str) or not name:
        raise UnknownNameError(f"{what} must be a non-empty string, got {name!r}; known: {sorted(table)}")
    if name in table:
        return table[name]
    dotted = "." in name or ":" in name
    if dotted and allow_imports:
        mod_name, _, attr = name.replace(":", ".").rpartition(".")
        try:
            fn = getattr(importlib.import_module(mod_name), attr)
        except (ImportError, AttributeError) as e:
            raise UnknownNameError(f"{what} {name!r}: cannot import it ({e})") from None
        if not callable(fn):
            raise UnknownNameError(f"{what} {name!r} is not callable")
        return fn
    hint = (
        " (dotted paths are refused: the server was not started with --allow-imports; list your module "
        "in the server config's loss_modules instead)"
        if dotted
        else ""
    )
    raise UnknownNameError(f"unknown {what} {name!r}; known: {sorted(table)}{hint}")


def resolve_loss_fn(name: str, allow_imports: bool = False) -> Callable:
    return _resolve(name, LOSS_FNS, "loss_fn", allow_imports)


def resolve_post_processor(name: str, allow_imports: bool = False) -> Callable:
    return _resolve(name, POST_PROCESSORS, "post_processor", allow_imports)


def load_loss_modules(modules: list[str]) -> None:
    """Imports the server's plugin modules (their @register_* decorators fill the registries)."""
    _load_builtins()
    for mod in modules:
        try:
            importlib.import_module(mod)
        except Exception as e:  # any error while importing a plugin fails the deployment, naming it
            raise ConfigError(f"server.loss_modules: cannot import {mod!r}: {type(e).__name__}: {e}") from None


_loaded = False


def _load_builtins() -> None:
    # Imported lazily so that `import arctic_rl.losses` stays cheap and cycle-free.
    global _loaded
    if _loaded:
        return
    _loaded = True
    for mod in ("postprocess", "grpo", "sft", "tinker"):
        try:
            importlib.import_module(f"{__name__}.{mod}")
        except ModuleNotFoundError as e:
            if e.name != f"{__name__}.{mod}":
                raise
