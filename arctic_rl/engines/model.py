"""Loading the HF model the same way in every engine (overrides such as YaRN applied once, here)."""

from __future__ import annotations

import torch


def accelerator() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def load_hf_model(model_name: str, overrides: dict, dtype: torch.dtype, gradient_checkpointing: bool = False):
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_name)
    for key, val in overrides.items():
        setattr(config, key, val)
    # SDPA: exact with additive/bool masks on CPU and fast on CUDA; ZoRRo installs its own function.
    model = AutoModelForCausalLM.from_pretrained(model_name, config=config, dtype=dtype, attn_implementation="sdpa")
    if gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.config.use_cache = False
    return model
