"""Rollout router replay (R3), the trainer's side: an MoE layer routes each token to the experts the sampler
routed it to, instead of its own router's top-k.

The sampler records, per token it computed and per MoE layer, the top-k expert ids it used
(arctic_rl/engines/routing_capture.py); they reach the trainer in the batch as `routed_experts` [B, T, L, k]
(int16, aligned with input_ids; -1 where a token has none: padding, or a prompt token the sampler took from a
cache this record does not hold). `set_routing(model, routed_NLk)` makes every MoE router of the model, for the
N tokens of the next forward (and its recompute under gradient checkpointing, and its backward), return:

  indices  the sampler's ids where the token has them, else the router's own top-k;
  weights  the router's own softmax probabilities gathered at those indices (renormalised over the k when the
           model's router renormalises its top-k), so the router's weight still receives a gradient: through
           the weights of the experts the token was sent to, as in verl's and Miles' R3.

`last_agreement` records, per forward, how many (token, layer) pairs the trainer's own top-k matched the
replayed set: the routing disagreement between sampler and trainer that R3 removes.

Routers are HF's top-k router modules that return (logits, top-k weights, top-k indices) and say whether they
renormalise (`norm_topk_prob`): Qwen3-MoE's and Qwen2-MoE's. A model with router_replay on and none of these
is refused at start (`find_routers`)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import torch

from arctic_rl.errors import ConfigError

LAYER = re.compile(r"\.layers\.(\d+)\.")


@dataclass
class ReplayState:
    routed: torch.Tensor | None = None  # [N, L, k] for the forward in progress, or None (route freely)
    agree: int = 0  # (token, layer) pairs whose own top-k set equals the replayed one
    replayed: int = 0  # (token, layer) pairs replayed
    used: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> [N, k] ids used (when recording)
    record: bool = False


def find_routers(model: torch.nn.Module) -> dict[int, torch.nn.Module]:
    """Decoder layer index -> its MoE router module; ConfigError when the model has none R3 can replay."""
    routers = {}
    for name, module in model.named_modules():
        if hasattr(module, "top_k") and hasattr(module, "num_experts") and hasattr(module, "norm_topk_prob"):
            match = LAYER.search(name + ".")
            if match and isinstance(getattr(module, "weight", None), torch.Tensor):
                routers[int(match.group(1))] = module
    if not routers:
        raise ConfigError(
            f"training_config.router_replay: the model ({type(model).__name__}) has no MoE router it can replay "
            "(HF top-k routers with norm_topk_prob: Qwen3-MoE, Qwen2-MoE); turn router_replay off for this model"
        )
    return routers


def install(model: torch.nn.Module) -> ReplayState:
    """Hooks every MoE router of `model` once; returns the state `replaying` sets."""
    state: ReplayState | None = getattr(model, "_arctic_router_replay", None)
    if state is not None:
        return state
    state = ReplayState()
    for layer, router in find_routers(model).items():
        router.register_forward_hook(_hook(state, layer))
    model._arctic_router_replay = state  # type: ignore[assignment]
    return state


def _hook(state: ReplayState, layer: int):
    def replay(module, args, output):
        logits, _, own = output
        if state.routed is None:
            if state.record:
                state.used[layer] = own.detach().clone()
            return output
        routed = state.routed[:, layer].to(device=own.device, dtype=torch.long)  # [N, k]
        if routed.shape[0] != own.shape[0]:
            raise RuntimeError(
                f"router replay: layer {layer} routes {own.shape[0]} tokens but the batch's routed_experts has "
                f"{routed.shape[0]} for this forward"
            )
        have = routed[:, 0] >= 0
        indices = torch.where(have[:, None], routed, own)
        state.replayed += int(have.sum())
        state.agree += int((own.sort(-1).values == routed.sort(-1).values).all(-1)[have].sum())
        if state.record:
            state.used[layer] = indices.detach().clone()
        probs = torch.softmax(logits, dim=-1, dtype=torch.float)
        weights = probs.gather(-1, indices)
        if module.norm_topk_prob:
            weights = weights / weights.sum(-1, keepdim=True)
        return logits, weights.to(logits.dtype), indices

    return replay


def set_routing(model: torch.nn.Module, routed_NLk: torch.Tensor | None) -> None:
    """From the next forward on, the model's MoE routers (if `install`ed) replay `routed_NLk` ([N, L, k], N = the
    tokens of that forward in the order the model flattens them); None: they route freely. It stays set through
    the backward, where gradient checkpointing runs each layer's forward again, until the next call. With
    `ReplayState.record` set (tests, benchmarks) each router keeps the ids it used last in `ReplayState.used`."""
    state: ReplayState | None = getattr(model, "_arctic_router_replay", None)
    if state is None:
        if routed_NLk is not None:
            raise ConfigError(
                "the batch has routed_experts but router replay is off: set training_config.router_replay.enable"
            )
        return
    state.routed, state.agree, state.replayed, state.used = routed_NLk, 0, 0, {}


def for_forward(batch: dict, prompt_tokens: str) -> torch.Tensor | None:
    """The batch's routed_experts [B, T, L, k] for a forward over it, prompt columns set to -1 (the trainer routes
    them) when `prompt_tokens` is "route"; None without routed_experts."""
    routed = batch.get("routed_experts")
    if routed is None:
        return None
    if prompt_tokens == "route":
        routed = routed.clone()
        routed[:, : routed.shape[1] - batch["responses"].shape[1]] = -1
    return routed
