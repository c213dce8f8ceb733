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
from typing import cast

import torch

from arctic_rl.batch import ROUTING_KEY, BatchError, RoutingShape, check_routing
from arctic_rl.errors import ConfigError

LAYER = re.compile(r"\.layers\.(\d+)\.")
# HF config keys of the experts per token and the routed experts (as arctic_rl/plan.py reads them; transformers 5
# writes Qwen3-MoE's expert count as num_local_experts)
TOP_K_KEYS = ("num_experts_per_tok", "moe_topk")
EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts")


@dataclass
class ReplayState:
    routed: torch.Tensor | None = None  # [N, L, k] for the forward in progress, or None (route freely)
    agree: int = 0  # (token, layer) pairs whose own top-k set equals the replayed one
    replayed: int = 0  # (token, layer) pairs replayed
    used: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> [N, k] ids used (when recording)
    record: bool = False
    replay: bool = True  # False: the routers are hooked for the auxiliary loss only (router_replay off)
    collect: bool = False  # keep each layer's logits and the ids used, for aux_loss (the forward_backward op)
    collected: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)  # (logits [N, E], ids [N, k])
    token_weights: torch.Tensor | None = None  # [N] how many rows each token stands for (0: padding)
    shape: RoutingShape | None = None  # what a routing set for the model must fit (set_routing checks it)


def find_routers(model: torch.nn.Module, required: bool = True) -> dict[int, torch.nn.Module]:
    """Decoder layer index -> its MoE router module; ConfigError when the model has none R3 can replay (and
    `required`)."""
    routers = {}
    for name, module in model.named_modules():
        if hasattr(module, "top_k") and hasattr(module, "num_experts") and hasattr(module, "norm_topk_prob"):
            match = LAYER.search(name + ".")
            if match and isinstance(getattr(module, "weight", None), torch.Tensor):
                routers[int(match.group(1))] = module
    if not routers and required:
        raise ConfigError(
            f"training_config.router_replay: the model ({type(model).__name__}) has no MoE router it can replay "
            "(HF top-k routers with norm_topk_prob: Qwen3-MoE, Qwen2-MoE); turn router_replay off for this model"
        )
    return routers


def install(model: torch.nn.Module, replay: bool = True) -> ReplayState | None:
    """Hooks every MoE router of `model` once; returns the state `set_routing` sets. `replay` False: hooked for the
    auxiliary load-balancing loss only (None for a model without MoE routers)."""
    state: ReplayState | None = getattr(model, "_arctic_router_replay", None)
    if state is not None:
        return state
    routers = find_routers(model, required=replay)
    if not routers:
        return None
    first = next(iter(routers.values()))
    layers = getattr(getattr(model, "config", None), "num_hidden_layers", None) or max(routers) + 1
    top_k, experts = cast(int, first.top_k), cast(int, first.num_experts)
    state = ReplayState(replay=replay, shape=RoutingShape(int(layers), int(top_k), int(experts)))
    for layer, router in routers.items():
        router.register_forward_hook(_hook(state, layer))
    model._arctic_router_replay = state  # type: ignore[assignment]
    return state


def _hook(state: ReplayState, layer: int):
    def replay(module, args, output):
        logits, _, own = output
        if state.routed is None:
            if state.record:
                state.used[layer] = own.detach().clone()
            if state.collect:
                state.collected.append((logits, own))
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
        if state.collect:
            state.collected.append((logits, indices))
        probs = torch.softmax(logits, dim=-1, dtype=torch.float)
        weights = probs.gather(-1, indices)
        if module.norm_topk_prob:
            weights = weights / weights.sum(-1, keepdim=True)
        return logits, weights.to(logits.dtype), indices

    return replay


def set_routing(
    model: torch.nn.Module, routed_NLk: torch.Tensor | None, token_weights: torch.Tensor | None = None
) -> None:
    """From the next forward on, the model's MoE routers (if `install`ed) replay `routed_NLk` ([N, L, k], N = the
    tokens of that forward in the order the model flattens them); None: they route freely. It stays set through
    the backward, where gradient checkpointing runs each layer's forward again, until the next call. With
    `ReplayState.record` set (tests, benchmarks) each router keeps the ids it used last in `ReplayState.used`.
    `token_weights` [N]: how many batch rows each token of the forward stands for (1, 0 on padding; ZoRRo's packed
    prompt: its group's rows), the weights of the auxiliary loss's token means."""
    state: ReplayState | None = getattr(model, "_arctic_router_replay", None)
    if state is None or not state.replay:
        if routed_NLk is not None:
            raise ConfigError(
                "the batch has routed_experts but router replay is off: set training_config.router_replay.enable"
            )
        if state is None:
            return
    if routed_NLk is not None and state.shape is not None:
        check_routing(routed_NLk, state.shape, "routed_experts")  # before any router gathers an id
    state.routed, state.agree, state.replayed, state.used = routed_NLk, 0, 0, {}
    state.collected, state.token_weights = [], token_weights


def model_routing(model_name: str, overrides: dict) -> RoutingShape | None:
    """The routing the model's HF config (after `overrides`) says its MoE layers take, None when the config is not
    on disk or names no experts: the same keys the routers are built from (Qwen3-MoE, Qwen2-MoE)."""
    from arctic_rl.config import _hf_config_value

    found = []
    for keys in (("num_hidden_layers",), TOP_K_KEYS, EXPERT_KEYS):
        hit = [(k, v) for k in keys if isinstance(v := _hf_config_value(model_name, overrides, k), int) and v > 0]
        if not hit or isinstance(hit[0][1], bool):
            return None
        found.append(hit[0])
    (_, layers), (top_k_key, top_k), (experts_key, experts) = found
    return RoutingShape(layers, top_k, experts, top_k_key=top_k_key, experts_key=experts_key)


def routing_limits(batch: object, cfg) -> RoutingShape | None:
    """For a request's batch: None without routed_experts; a BatchError when the deployment does not replay routing
    (set_routing would refuse it in the engine); else the model's routing (model_routing) to check the ids against."""
    if not isinstance(batch, dict) or ROUTING_KEY not in batch:
        return None
    if not cfg.training_config.router_replay.enable:
        raise BatchError(
            "batch['routed_experts'] is given but router replay is off: set training_config.router_replay.enable, "
            "or leave routed_experts out"
        )
    return model_routing(cfg.model_name, cfg.model_overrides)


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


def aux_loss(model: torch.nn.Module) -> torch.Tensor | None:
    """The auxiliary load-balancing loss of the last forward (with `ReplayState.collect`), transformers'
    `load_balancing_loss_func` (Switch Transformer's): experts x sum over experts of (the share of (token, MoE layer)
    pairs routed to it, over each of the k slots) x (its mean router probability), the means over every MoE layer's
    tokens weighted by `token_weights`, so ZoRRo's packed batch gives the naive batch's value. The routing it counts
    is the one used (the replayed one under R3); the gradient reaches the routers through the probabilities. None
    without collected routers."""
    state: ReplayState | None = getattr(model, "_arctic_router_replay", None)
    if state is None or not state.collected:
        return None
    logits = torch.cat([lg for lg, _ in state.collected])
    ids = torch.cat([i for _, i in state.collected])
    experts = logits.shape[-1]
    n = state.collected[0][0].shape[0]
    w = state.token_weights if state.token_weights is not None else torch.ones(n)
    w = w.to(device=logits.device, dtype=torch.float).repeat(len(state.collected))
    w = w / w.sum().clamp(min=1e-9)
    probs = torch.softmax(logits, dim=-1, dtype=torch.float)
    routed = torch.nn.functional.one_hot(ids.long(), experts).float().sum(1)  # [N*L, E]: k slots added
    share = (w[:, None] * routed).sum(0)
    prob = (w[:, None] * probs).sum(0)
    return experts * (share * prob).sum()
