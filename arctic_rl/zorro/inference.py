"""The sampling engine's entry point for ZoRRo Inference (`arctic_inference_config.zorro_inference`).

    kwargs.update(vllm_engine_kwargs(cfg.arctic_inference_config.zorro_inference))   # before vllm.LLM(**kwargs)

Returns the extra `vllm.LLM` keyword arguments that install cascade attention. Today that is {}
everywhere (vLLM's default attention is kept, and a warning says why): on CPU, cascade decode over
vLLM-CPU's KV cache measured slower than vLLM's own CPU kernel (docs/zorro.md); on CUDA, vLLM 0.32
removed its own cascade attention and our backend is not built. The op-level kernel lives in
`arctic_rl.zorro.cascade`, the vLLM-CPU cache reader in `arctic_rl.zorro.vllm_cpu`.
"""
from __future__ import annotations

from typing import Any

from arctic_rl.zorro.vllm_cpu import vllm_attention_backend


def _as_dict(cfg: Any) -> dict:
    if cfg is None:
        return {}
    if isinstance(cfg, dict):
        return cfg
    if hasattr(cfg, "model_dump"):
        return cfg.model_dump()
    raise TypeError(f"zorro_inference config must be a dict or a pydantic model, got {type(cfg).__name__}")


def vllm_engine_kwargs(zorro_inference: Any, device_type: str | None = None) -> dict[str, Any]:
    """Extra kwargs for vllm.LLM for this zorro_inference config ({} = vLLM's default attention)."""
    if device_type is None:
        import torch
        device_type = "cuda" if torch.cuda.is_available() else "cpu"
    backend = vllm_attention_backend(_as_dict(zorro_inference), device_type)
    return {} if backend is None else {"attention_config": {"backend": backend}}
