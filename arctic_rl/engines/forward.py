"""Per-token response log-probs (and entropy) from an HF causal LM: the naive path.

Every row is run as is (prompt re-encoded for every response). ZoRRo Train
(`arctic_rl.zorro.train.zorro_log_probs`) computes the same outputs with each prompt encoded once;
`response_log_probs` picks between the two.

Legend: B rows, T = P + R columns, R response columns, N selected tokens, H hidden, V vocab.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from arctic_rl.batch import Batch, position_ids
from arctic_rl.losses import resolve_post_processor

DEFAULT_CHUNK_TOKENS = 1024
# Set by the training engine under ZeRO-3 with several ranks: every LM-head call all-gathers the head's
# weight collectively, so all ranks must make the same number of calls (see head_post_process).
SYNC_CHUNK_COUNT = False


def decoder_and_head(model) -> tuple[torch.nn.Module, torch.nn.Module]:
    """The transformer body (returns hidden states) and the LM head of any HF causal LM."""
    body = getattr(model, model.base_model_prefix, None) or model.get_decoder()
    return body, model.get_output_embeddings()


def head_post_process(
    hidden_NH: torch.Tensor,
    labels_N: torch.Tensor,
    head: torch.nn.Module,
    post_processor: str | Callable,
    pp_config: dict,
    chunk_tokens: int,
) -> dict[str, torch.Tensor]:
    """LM head + post-processor (a registered name, or the function the caller resolved) over N
    tokens in chunks, so [N, V] logits never exist at once.

    Each chunk is checkpointed: backward recomputes its logits instead of keeping them all.
    """
    fn = post_processor if callable(post_processor) else resolve_post_processor(post_processor)
    parts: dict[str, list[torch.Tensor]] = {}
    N = hidden_NH.shape[0]
    num_chunks = -(-N // chunk_tokens)
    if SYNC_CHUNK_COUNT and torch.distributed.is_initialized():
        n = torch.tensor([num_chunks], device=hidden_NH.device)
        torch.distributed.all_reduce(n, op=torch.distributed.ReduceOp.MAX)
        num_chunks = int(n)
    for i in range(num_chunks):
        s = i * chunk_tokens
        h, y = hidden_NH[s : s + chunk_tokens], labels_N[s : s + chunk_tokens]
        if torch.is_grad_enabled() and h.requires_grad:
            keys: list[str] = []

            def run(h_, y_=y, keys_=keys):
                out = fn(head(h_), y_, pp_config)
                keys_[:] = sorted(out)
                return tuple(out[k] for k in keys_)

            vals = torch.utils.checkpoint.checkpoint(run, h, use_reentrant=False)
            out = dict(zip(keys, vals))
        else:
            out = fn(head(h), y, pp_config)
        for k, v in out.items():
            parts.setdefault(k, []).append(v)
    return {k: torch.cat(v) for k, v in parts.items()}


def naive_log_probs(
    model,
    batch: Batch,
    *,
    post_processor: str | Callable = "log_probs",
    pp_config: dict | None = None,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
) -> dict[str, torch.Tensor]:
    """{"log_probs": [B, R], "entropy": [B, R]?}; zeros where the response is padding."""
    pp_config = pp_config or {}
    ids_BT, mask_BT = batch["input_ids"], batch["attention_mask"]
    B, T = ids_BT.shape
    R = batch["responses"].shape[1]
    body, head = decoder_and_head(model)
    hidden_BTH = body(
        input_ids=ids_BT, attention_mask=mask_BT, position_ids=position_ids(batch), use_cache=False
    ).last_hidden_state
    # hidden state at column t predicts the token at t + 1: responses sit at columns T-R..T-1.
    hidden_BRH = hidden_BTH[:, T - R - 1 : T - 1]
    sel_BR = mask_BT[:, T - R :].bool()
    out_N = head_post_process(
        hidden_BRH[sel_BR], batch["responses"][sel_BR], head, post_processor, pp_config, chunk_tokens
    )
    out = {}
    for k, v in out_N.items():
        full = torch.zeros(B, R, dtype=v.dtype, device=v.device)
        out[k] = full.masked_scatter(sel_BR, v)
    return out


def response_log_probs(model, batch: Batch, *, zorro: bool = False, **kw) -> dict[str, torch.Tensor]:
    if zorro:
        from arctic_rl.zorro.train import zorro_log_probs

        return zorro_log_probs(model, batch, **kw)
    return naive_log_probs(model, batch, **kw)
