"""The LM-head path shared by every log-prob computation: hidden states of the selected tokens -> LM head ->
post-processor (log-probs, entropy, ...), in chunks of tokens.

Both the naive path (`arctic_rl.engines.forward`) and ZoRRo Train (`arctic_rl.zorro.train`) end here; this
module imports neither, so neither imports the other for it.

Legend: N selected tokens, H hidden, V vocab.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from arctic_rl.losses import resolve_post_processor

DEFAULT_CHUNK_TOKENS = 1024


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
    *,
    sync_chunk_count: bool = False,
) -> dict[str, torch.Tensor]:
    """LM head + post-processor (a registered name, or the function the caller resolved) over N
    tokens in chunks, so [N, V] logits never exist at once.

    Each chunk is checkpointed: backward recomputes its logits instead of keeping them all.
    `sync_chunk_count`: every rank runs as many chunks as the rank with the most (empty chunks past the
    end). The training engine asks for it under ZeRO-3 with several ranks, where every LM-head call
    all-gathers the head's weight collectively, so all ranks must make the same number of calls.
    """
    fn = post_processor if callable(post_processor) else resolve_post_processor(post_processor)
    parts: dict[str, list[torch.Tensor]] = {}
    N = hidden_NH.shape[0]
    num_chunks = -(-N // chunk_tokens)
    if sync_chunk_count and torch.distributed.is_initialized():
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
