"""Per-token response log-probs (and entropy) from an HF causal LM: the naive path.

Every row is run as is (prompt re-encoded for every response). ZoRRo Train
(`arctic_rl.zorro.train.zorro_log_probs`) computes the same outputs with each prompt encoded once;
`response_log_probs` picks between the two. Both end in the chunked LM head of `arctic_rl.logprob_head`.

Legend: B rows, T = P + R columns, R response columns, N selected tokens, H hidden, V vocab.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from arctic_rl.batch import Batch, position_ids
from arctic_rl.logprob_head import DEFAULT_CHUNK_TOKENS, decoder_and_head, head_post_process
from arctic_rl.router_replay import set_routing
from arctic_rl.zorro.train import zorro_log_probs


def naive_log_probs(
    model,
    batch: Batch,
    *,
    post_processor: str | Callable = "log_probs",
    pp_config: dict | None = None,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
    sync_chunk_count: bool = False,
    routed_experts: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """{"log_probs": [B, R], "entropy": [B, R]?}; zeros where the response is padding.
    `sync_chunk_count`: see `arctic_rl.logprob_head.head_post_process`. `routed_experts` [B, T, L, k]: the
    routing an MoE model replays (arctic_rl.router_replay; None: its routers route)."""
    pp_config = pp_config or {}
    ids_BT, mask_BT = batch["input_ids"], batch["attention_mask"]
    B, T = ids_BT.shape
    R = batch["responses"].shape[1]
    body, head = decoder_and_head(model)
    routed = routed_experts.reshape(B * T, *routed_experts.shape[2:]) if routed_experts is not None else None
    set_routing(model, routed, token_weights=mask_BT.reshape(-1))
    hidden_BTH = body(
        input_ids=ids_BT, attention_mask=mask_BT, position_ids=position_ids(batch), use_cache=False
    ).last_hidden_state
    # hidden state at column t predicts the token at t + 1: responses sit at columns T-R..T-1.
    hidden_BRH = hidden_BTH[:, T - R - 1 : T - 1]
    sel_BR = mask_BT[:, T - R :].bool()
    out_N = head_post_process(
        hidden_BRH[sel_BR],
        batch["responses"][sel_BR],
        head,
        post_processor,
        pp_config,
        chunk_tokens,
        sync_chunk_count=sync_chunk_count,
    )
    out = {}
    for k, v in out_N.items():
        full = torch.zeros(B, R, dtype=v.dtype, device=v.device)
        out[k] = full.masked_scatter(sel_BR, v)
    return out


def response_log_probs(model, batch: Batch, *, zorro: bool = False, **kw) -> dict[str, torch.Tensor]:
    """The naive path, or ZoRRo Train's (`zorro`), with the keyword arguments `kw`."""
    if zorro:
        return zorro_log_probs(model, batch, **kw)
    return naive_log_probs(model, batch, **kw)
