"""Loading the HF model the same way in every engine (overrides such as YaRN applied once, here)."""

from __future__ import annotations

import torch


def accelerator() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def _offloaded_checkpoint(function, *args, **kwargs):
    """Checkpoints one layer and keeps what the checkpoint saves (the layer's input: layers x tokens x hidden in
    all, what dominates at long sequences) in host memory, pinned on CUDA, until the backward recomputes it."""
    with torch.autograd.graph.save_on_cpu(pin_memory=torch.cuda.is_available(), device_type=accelerator()):
        return torch.utils.checkpoint.checkpoint(function, *args, use_reentrant=False, **kwargs)


def load_hf_model(
    model_name: str,
    overrides: dict,
    dtype: torch.dtype,
    gradient_checkpointing: bool = False,
    offload_activations: bool = False,
):
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_name)
    for key, val in overrides.items():
        setattr(config, key, val)
    # SDPA: exact with additive/bool masks on CPU and fast on CUDA; ZoRRo installs its own function.
    model = AutoModelForCausalLM.from_pretrained(model_name, config=config, dtype=dtype, attn_implementation="sdpa")
    if gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if offload_activations:
            # transformers' own offload=True asks for pinned memory even on a CPU-only torch, which refuses it.
            model._set_gradient_checkpointing(enable=True, gradient_checkpointing_func=_offloaded_checkpoint)
    model.config.use_cache = False
    return model
