"""LoRA on the trainer's model (PEFT), and the policy's weights under the base model's names.

`apply_lora` injects PEFT's adapters into the HF model in place (get_peft_model) and freezes everything else.
On a mixture-of-experts model PEFT's 'all-linear' also adapts the parameters that are not nn.Linear layers: an
MoE layer's stacked experts (`experts.gate_up_proj` [experts, ...], `experts.down_proj`) and its router's
weight, through its ParamWrapper (one low-rank update per expert);
the engines keep using the HF model itself (`PeftModel.get_base_model()`), so every op (log-probs, ZoRRo
Train, the chunked head, gradient checkpointing) runs the same code with or without adapters.

Whatever leaves the trainer as *the policy's weights* (the sampler's sync, the reference update,
full_state_dict) goes through `policy_weights`: the base model's parameter names and shapes, and for a layer
with an adapter its merged weight W + scale * B @ A, so a sampler or a reference that knows nothing of LoRA
holds the policy the trainer computes.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

import torch

from arctic_rl.config import LoraConfig

if TYPE_CHECKING:
    from peft import PeftModel
from arctic_rl.errors import ConfigError

ADAPTER = "default"  # PEFT's adapter name; the trainer holds one adapter


def apply_lora(model: torch.nn.Module, lora: LoraConfig) -> PeftModel:
    """`model` with LoRA adapters injected in place; only the adapters require grad. Returns the PeftModel
    (for disable_adapter); the HF model is `.get_base_model()`, the same object as `model`."""
    import peft
    from peft.tuners.lora import Linear, ParamWrapper

    target = lora.target_modules if isinstance(lora.target_modules, str) else list(lora.target_modules)
    alpha = lora.alpha if lora.alpha is not None else 2 * lora.rank  # LoraConfig fills it in; for the type
    cfg = peft.LoraConfig(
        r=lora.rank,
        lora_alpha=alpha,  # type: ignore[arg-type]  # PEFT annotates int; it only divides by the rank
        lora_dropout=lora.dropout,
        target_modules=target,
        bias="none",
    )
    try:
        wrapped = peft.get_peft_model(model, cfg)
    except ValueError as e:  # PEFT: a target module not found in the model
        raise ConfigError(f"training_config.lora.target_modules={lora.target_modules!r}: {e}") from None
    odd = sorted(
        {type(m).__name__ for m in adapted_layers(model).values() if not isinstance(m, (Linear, ParamWrapper))}
    )
    if odd:
        raise ConfigError(
            f"training_config.lora.target_modules={lora.target_modules!r} reaches {odd} layers: "
            f"name linear layers only (or 'all-linear')"
        )
    return wrapped


def adapted_layers(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """Module name -> PEFT LoRA layer, for every layer of `model` that carries an adapter (none: {})."""
    try:
        from peft.tuners.lora import LoraLayer
    except ImportError:  # an environment without PEFT trains no adapters
        return {}
    return {name: m for name, m in model.named_modules() if isinstance(m, LoraLayer)}  # type: ignore[misc]


def has_lora(model: torch.nn.Module) -> bool:
    return bool(adapted_layers(model))


def merged_weight(layer) -> torch.Tensor:
    """W + scale * B @ A of one LoRA linear layer, computed in float32 and returned in W's dtype."""
    w = layer.base_layer.weight
    a, b = layer.lora_A[ADAPTER].weight, layer.lora_B[ADAPTER].weight
    delta = (b.detach().float() @ a.detach().float()) * layer.scaling[ADAPTER]
    if layer.fan_in_fan_out:
        delta = delta.T
    return (w.detach().float() + delta).to(w.dtype)


def merged_parameter(wrapper, param: torch.nn.Parameter) -> torch.Tensor:
    """W + delta of a parameter PEFT adapts in place (ParamWrapper: an MoE layer's stacked experts, a router's
    weight), the delta PEFT's own forward adds (get_delta_weight: per expert for a stacked one), added in float32."""
    delta = wrapper.get_delta_weight(ADAPTER).detach()
    return (param.detach().float() + delta.float()).to(param.dtype)


def wrapped_parameters(layers: dict[str, torch.nn.Module]) -> dict[str, tuple[str, torch.nn.Module]]:
    """Full parameter name -> (its base-model name, the ParamWrapper that adapts it). PEFT nests one wrapper per
    adapted parameter of a module (experts.base_layer.base_layer.gate_up_proj: two wrappers over the experts);
    the base-model name drops the `.base_layer` links."""
    from peft.tuners.lora import ParamWrapper

    out: dict[str, tuple[str, torch.nn.Module]] = {}
    for name, layer in layers.items():
        if isinstance(layer, ParamWrapper):
            owner, inner = name, layer.base_layer
            owner = f"{owner}.base_layer"
            while isinstance(inner, ParamWrapper):  # the module that holds the parameter
                inner, owner = inner.base_layer, f"{owner}.base_layer"
            base = name.split(".base_layer")[0]
            out[f"{owner}.{layer.parameter_name}"] = (f"{base}.{layer.parameter_name}", layer)
    return out


def policy_weights(model: torch.nn.Module) -> dict[str, tuple[torch.nn.Parameter, Callable[[], torch.Tensor]]]:
    """Base-model parameter name -> (the parameter whose shape and ZeRO partition stand for it, a function
    giving the policy's value). Without adapters: the model's own parameters, as they are. With adapters: the
    adapters themselves are left out and each adapted weight is merged."""
    layers = adapted_layers(model)
    wrapped = wrapped_parameters(layers) if layers else {}
    out: dict[str, tuple[torch.nn.Parameter, Callable[[], torch.Tensor]]] = {}
    for name, p in model.named_parameters():
        if name.partition(".lora_")[0] in layers:
            continue  # an adapter's own weight (lora_A, lora_B)
        if name in wrapped:
            base, wrapper = wrapped[name]
            out[base] = (p, partial(merged_parameter, wrapper, p))
            continue
        module, _, leaf = name.rpartition(".")
        owner = module.removesuffix(".base_layer")
        if owner != module and owner in layers:
            value: Callable[[], torch.Tensor] = (
                partial(merged_weight, layers[owner]) if leaf == "weight" else partial(torch.Tensor.detach, p)
            )
            out[f"{owner}.{leaf}"] = (p, value)
        else:
            out[name] = (p, partial(torch.Tensor.detach, p))
    return out


def trainable_parameters(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """What goes to the optimizer: every parameter without adapters, only the adapters' with them."""
    return [p for p in model.parameters() if p.requires_grad]
