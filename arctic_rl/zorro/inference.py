"""The sampling engine's entry point for ZoRRo Inference (`arctic_inference_config.zorro_inference`).

    kwargs.update(vllm_engine_kwargs(cfg.arctic_inference_config.zorro_inference))   # before vllm.LLM(**kwargs)

On CPU, `enable: true` installs the ZoRRo vLLM-CPU attention backend (`arctic_rl.zorro.vllm_backend`, an
override of vLLM's CPU_ATTN through vLLM's `register_backend`) and returns no extra kwargs. It is off by
default: on CPU, cascade decode over vLLM-CPU's KV cache measured slower than vLLM's own kernel
(docs/zorro.md). On CUDA, vLLM 0.32 removed its own cascade attention and our CUDA backend is not built, so
vLLM's default attention is kept and a warning says so. The op-level kernel lives in
`arctic_rl.zorro.cascade`, the vLLM-CPU cache reader in `arctic_rl.zorro.vllm_cpu`.
"""
from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)


def _as_dict(cfg: Any) -> dict:
    if cfg is None:
        return {}
    if isinstance(cfg, dict):
        return cfg
    if hasattr(cfg, "model_dump"):
        return cfg.model_dump()
    raise TypeError(f"zorro_inference config must be a dict or a pydantic model, got {type(cfg).__name__}")


def vllm_engine_kwargs(zorro_inference: Any, device_type: str | None = None) -> dict[str, Any]:
    """Installs what this zorro_inference config asks for in this process; returns extra kwargs for vllm.LLM."""
    cfg = _as_dict(zorro_inference)
    if not cfg.get("enable"):
        return {}
    if device_type is None:
        import torch
        device_type = "cuda" if torch.cuda.is_available() else "cpu"
    if device_type == "cpu":
        from arctic_rl.zorro.vllm_backend import install
        install(cfg.get("min_group_size", 2), cfg.get("min_prefix_len", 256))
    else:
        log.warning("zorro_inference.enable=True: no ZoRRo Inference vLLM backend for %r yet; using vLLM's "
                    "default attention (docs/zorro.md)", device_type)
    return {}
