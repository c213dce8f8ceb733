"""The sampling engine's entry point for ZoRRo Inference (`arctic_inference_config.zorro_inference`).

    kwargs.update(vllm_engine_kwargs(cfg.arctic_inference_config.zorro_inference))   # before vllm.LLM(**kwargs)

`enable: true` overrides one of vLLM's attention backends with ours, through vLLM's `register_backend`:
CPU_ATTN on CPU (`arctic_rl.zorro.vllm_backend`), FLASH_ATTN on CUDA (`arctic_rl.zorro.vllm_cuda`). It does
so in this process and, through the `ARCTIC_ZORRO_INFERENCE` environment variable and the `vllm_plugin`
entry point (vLLM's `vllm.general_plugins` group, loaded by every vLLM process), in worker processes
(tensor parallelism). On CUDA the engine is also pinned to FLASH_ATTN with PIECEWISE CUDA graphs
(attention runs eager; a cascade step is data-dependent). Off by default. On CPU it measured slower than
vLLM's own kernel (docs/zorro.md); on CUDA it has not run yet (no GPU in this workplace).
"""

from __future__ import annotations

import json
import os
from typing import Any

from arctic_rl.config import ZorroInferenceConfig
from arctic_rl.strict import parse


def _as_config(cfg: Any) -> ZorroInferenceConfig:
    """The config's model; a dict is checked by it (a typo such as `enabel` must not leave ZoRRo off)."""
    if cfg is None:
        return ZorroInferenceConfig()
    if isinstance(cfg, dict):
        return parse(ZorroInferenceConfig, cfg, name="zorro_inference")
    if hasattr(cfg, "model_dump"):
        return parse(ZorroInferenceConfig, cfg.model_dump(), name="zorro_inference")
    raise TypeError(f"zorro_inference config must be a dict or a pydantic model, got {type(cfg).__name__}")


ENV = "ARCTIC_ZORRO_INFERENCE"


def _install(device_type: str, min_group_size: int, min_prefix_len: int) -> None:
    if device_type == "cpu":
        from arctic_rl.zorro.vllm_backend import install
    else:
        from arctic_rl.zorro.vllm_cuda import install
    install(min_group_size, min_prefix_len)


def vllm_engine_kwargs(zorro_inference: Any, device_type: str | None = None) -> dict[str, Any]:
    """Installs what this zorro_inference config asks for in this process; returns extra kwargs for vllm.LLM."""
    cfg = _as_config(zorro_inference)
    if not cfg.enable:
        return {}
    if device_type is None:
        import torch

        device_type = "cuda" if torch.cuda.is_available() else "cpu"
    if device_type not in ("cpu", "cuda"):
        raise ValueError(f"zorro_inference.enable=True: no ZoRRo Inference backend for device {device_type!r}")
    min_group_size, min_prefix_len = cfg.min_group_size, cfg.min_prefix_len
    knobs = {"device": device_type, "min_group_size": min_group_size, "min_prefix_len": min_prefix_len}
    os.environ[ENV] = json.dumps(knobs)  # for vLLM worker processes: vllm_plugin reads it
    _install(device_type, min_group_size, min_prefix_len)
    if device_type == "cpu":
        return {}
    return {"attention_backend": "FLASH_ATTN", "compilation_config": {"cudagraph_mode": "PIECEWISE"}}


def vllm_plugin() -> None:
    """vLLM general plugin (entry point in pyproject.toml): installs the backend in a vLLM process
    when the sampling engine asked for it. Does nothing otherwise."""
    raw = os.environ.get(ENV)
    if raw:
        knobs = json.loads(raw)
        _install(knobs["device"], knobs["min_group_size"], knobs["min_prefix_len"])
