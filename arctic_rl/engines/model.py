"""Loading the HF model the same way in every engine (overrides such as YaRN applied once, here)."""

from __future__ import annotations

from typing import Any

import torch


def accelerator() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def _offloaded_checkpoint(function, *args, **kwargs):
    """Checkpoints one layer and keeps what the checkpoint saves (the layer's input: layers x tokens x hidden in
    all, what dominates at long sequences) in host memory, pinned on CUDA, until the backward recomputes it."""
    with torch.autograd.graph.save_on_cpu(pin_memory=torch.cuda.is_available(), device_type=accelerator()):
        return torch.utils.checkpoint.checkpoint(function, *args, use_reentrant=False, **kwargs)


def import_model_code(model_name: str) -> None:
    """Imports transformers' code for the model's architecture (its modeling module, about 100 MB of RSS), so that
    an engine can do it before its memory mark: libraries are not the engine's state."""
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    config = AutoConfig.from_pretrained(model_name)
    try:
        MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]
    except KeyError:  # remote code or an unknown architecture: loading will say so
        pass


def load_hf_model(
    model_name: str,
    overrides: dict,
    dtype: torch.dtype,
    gradient_checkpointing: bool = False,
    offload_activations: bool = False,
    zero3_config: dict | None = None,
):
    """The HF model with `overrides` set in its config. With `zero3_config` (a DeepSpeed ZeRO-3 config, several
    ranks) it is built partitioned and each rank holds only its share of the weights (engines/zero3_load.py)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_name)
    for key, val in overrides.items():
        setattr(config, key, val)
    # SDPA: exact with additive/bool masks on CPU and fast on CUDA; ZoRRo installs its own function.
    model: Any
    if zero3_config is not None:
        from arctic_rl.engines.memory import freed_memory_returned
        from arctic_rl.engines.zero3_load import load_zero3_partitioned

        # Each parameter is allocated whole, then partitioned; glibc would keep the freed wholes resident in its
        # heap (about the whole model per rank, measured: tests/e2e/test_zero3_load.py) unless they are mmapped.
        with freed_memory_returned():
            model = load_zero3_partitioned(model_name, config, dtype, zero3_config)
    else:
        model = AutoModelForCausalLM.from_pretrained(model_name, config=config, dtype=dtype, attn_implementation="sdpa")
    if gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if offload_activations:
            # transformers' own offload=True asks for pinned memory even on a CPU-only torch, which refuses it.
            model._set_gradient_checkpointing(enable=True, gradient_checkpointing_func=_offloaded_checkpoint)
    model.config.use_cache = False
    return model
