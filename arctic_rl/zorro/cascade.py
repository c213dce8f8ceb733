"""ZoRRo Inference: cascade attention for decode over a paged KV cache.

When G requests share a prompt, standard decode reads the prompt's KV G times per step. Cascade
decode reads it once per group:

    prefix pass  the group's G queries as one query block over the shared prefix KV (no mask)
    suffix pass  each request's query over its own suffix KV
    merge        merge_attention_states(prefix, suffix)  ->  exactly the attention over all keys

KV-read limit for G requests, prefix S_p, suffix S_s:  G (S_p + S_s) / (S_p + G S_s).

Paged layout (vLLM's NHD): key_cache / value_cache [num_blocks, block_size, K, D];
block_table [num_reqs, max_blocks] (int), seq_lens [num_reqs]; queries [num_reqs, H, D], one
decode token per request. A group's prefix must be block-aligned and its blocks shared, as
vLLM's prefix caching makes them.

Legend: Q requests, H query heads, K kv heads, D head dim, S keys, G requests in a group.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import torch

from arctic_rl.zorro.merge import merge_attention_states

_flash_cpu = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu


@dataclass(frozen=True)
class PrefixGroup:
    rows: tuple[int, ...]  # request indices
    prefix_len: int  # shared length (in the units of the sequences given to discovery)


# ----------------------------------------------------------------------------------------------
# Group discovery


def _lcp(a: Sequence, b: Sequence) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def find_prefix_groups(
    seqs: Sequence[Sequence[Hashable]], *, min_group_size: int = 2, min_prefix_len: int = 1, align: int = 1
) -> list[PrefixGroup]:
    """Partition requests into groups that share a prefix, maximising the prefix KV reads saved,
    sum over groups of (size - 1) x shared length. (size x shared length would score one group of
    16 the same as eight pairs with the same prefix, since it is additive over such splits.)

    Sort the sequences; the longest common prefix of a run of sorted neighbours is the minimum of
    their adjacent LCPs (rounded down to `align`, e.g. the KV block size). A dynamic program over
    each run of neighbours that share at least `min_prefix_len` picks where to cut: one wide group
    with a short prefix, or several narrower ones with longer prefixes, whichever saves more reads.
    Groups smaller than `min_group_size` or sharing less than `min_prefix_len` are not returned
    (those requests take the standard path).

    >>> find_prefix_groups([[1, 2, 3, 9], [5, 6], [1, 2, 3, 7]], min_prefix_len=2)
    [PrefixGroup(rows=(0, 2), prefix_len=3)]
    """
    if min_group_size < 2:
        raise ValueError(f"min_group_size must be >= 2, got {min_group_size}")
    if min_prefix_len < 1 or align < 1:
        raise ValueError(f"min_prefix_len and align must be >= 1, got {min_prefix_len} and {align}")
    n = len(seqs)
    order = sorted(range(n), key=lambda i: tuple(seqs[i]))
    lcp = [(_lcp(seqs[order[k]], seqs[order[k + 1]]) // align) * align for k in range(n - 1)]
    groups: list[PrefixGroup] = []
    k = 0
    while k < n - 1:
        if lcp[k] < min_prefix_len:
            k += 1
            continue
        end = k
        while end < n - 1 and lcp[end] >= min_prefix_len:
            end += 1
        groups += _best_partition(order[k : end + 1], lcp[k:end], min_group_size)  # run of end-k+1 items
        k = end
    return sorted(groups, key=lambda g: g.rows[0])


def _best_partition(items: list[int], lcp: list[int], min_group_size: int) -> list[PrefixGroup]:
    m = len(items)
    best = [0] * (m + 1)
    cut: list[tuple[int, int] | None] = [None] * (m + 1)  # (start, shared) of the last group
    for j in range(1, m + 1):
        best[j], cut[j] = best[j - 1], None  # item j-1 on its own
        shared = None
        for i in range(j - 2, -1, -1):  # group = items[i:j]
            shared = lcp[i] if shared is None else min(shared, lcp[i])
            size = j - i
            gain = (size - 1) * shared
            if size >= min_group_size and best[i] + gain > best[j]:
                best[j], cut[j] = best[i] + gain, (i, shared)
    out = []
    j = m
    while j > 0:
        if cut[j] is None:
            j -= 1
            continue
        i, shared = cut[j]  # type: ignore[misc]  # checked just above
        out.append(PrefixGroup(rows=tuple(sorted(items[i:j])), prefix_len=shared))
        j = i
    return out


# ----------------------------------------------------------------------------------------------
# Paged KV gathering


def gather_kv(cache: torch.Tensor, block_ids: torch.Tensor, start: int, end: int) -> torch.Tensor:
    """Keys (or values) start..end of one sequence: [end - start, K, D] (one copy, of whole blocks)."""
    bs = cache.shape[1]
    b0, b1 = start // bs, -(-end // bs)
    kv = cache.index_select(0, block_ids[b0:b1]).flatten(0, 1)
    return kv[start - b0 * bs : end - b0 * bs]


def _gather_batched(
    cache: torch.Tensor, block_table: torch.Tensor, rows: torch.Tensor, start: int, end: int
) -> torch.Tensor:
    """Keys start..end of several sequences of equal span: [len(rows), end - start, K, D]."""
    bs = cache.shape[1]
    b0, b1 = start // bs, -(-end // bs)
    blocks = block_table.index_select(0, rows)[:, b0:b1]  # [G, nb]
    kv = cache.index_select(0, blocks.reshape(-1)).view(len(rows), -1, *cache.shape[2:])
    return kv[:, start - b0 * bs : end - b0 * bs]


def _attend(q_GHD: torch.Tensor, k_GKSD: torch.Tensor, v_GKSD: torch.Tensor, scale: float):
    """One decode query per row against its keys -> (out [G, H, D], lse [G, H]); GQA native."""
    if k_GKSD.shape[2] == 0:
        G, H, D = q_GHD.shape
        return q_GHD.new_zeros(G, H, D), q_GHD.new_full((G, H), float("-inf"), dtype=torch.float32)
    if q_GHD.device.type == "cpu":
        o, l = _flash_cpu(q_GHD.unsqueeze(2), k_GKSD, v_GKSD, 0.0, False, scale=scale)
        return o[:, :, 0], l[:, :, 0]
    from arctic_rl.zorro.merge import attention_with_lse

    o, l = attention_with_lse(q_GHD.unsqueeze(2), k_GKSD, v_GKSD, scale=scale)
    return o[:, :, 0], l[:, :, 0]


def _kernel_fits(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Our CPU kernel (group_attention.cpp) takes these: fp32 on CPU, d contiguous, D % 16 == 0."""
    from arctic_rl.zorro.group_attention import LANES, load

    return (
        q.device.type == "cpu"
        and q.dtype == k.dtype == v.dtype == torch.float32
        and k.stride(-1) == 1
        and v.stride(-1) == 1
        and q.shape[-1] % LANES == 0
        and load() is not None
    )


def _prefix_pass(q_GHD: torch.Tensor, k_KSD: torch.Tensor, v_KSD: torch.Tensor, scale: float):
    """All G queries of a group over one shared prefix, prefix KV read once.

    The G x (H/K) query heads that share a KV head become one query block of that head:
    q [1, K, G*H/K, D] against k [1, K, S, D], so each KV head streams through memory once."""
    G, H, D = q_GHD.shape
    K, S = k_KSD.shape[0], k_KSD.shape[1]
    rep = H // K
    q = q_GHD.view(G, K, rep, D).permute(1, 0, 2, 3).reshape(1, K, G * rep, D)
    if S > 0 and _kernel_fits(q, k_KSD, v_KSD):
        # our CPU kernel (group_attention.cpp): rows in vector lanes, the next key tiles prefetched,
        # and one key tile serves up to 4 chunks of 16 rows (torch's flash kernel re-reads it per 16)
        from arctic_rl.zorro.group_attention import paged_group_attention

        zero, end = torch.zeros(1, dtype=torch.int64), torch.full((1,), S, dtype=torch.int64)
        o, l = paged_group_attention(
            q, k_KSD.unsqueeze(0), v_KSD.unsqueeze(0), None, zero, end, scale, key_t_in_block=False
        )
    elif q_GHD.device.type == "cpu":
        o, l = _flash_cpu(q, k_KSD.unsqueeze(0), v_KSD.unsqueeze(0), 0.0, False, scale=scale)
    else:
        from arctic_rl.zorro.merge import attention_with_lse

        o, l = attention_with_lse(q, k_KSD.unsqueeze(0), v_KSD.unsqueeze(0), scale=scale)
    o = o[0].view(K, G, rep, D).permute(1, 0, 2, 3).reshape(G, H, D)
    l = l[0].view(K, G, rep).permute(1, 0, 2).reshape(G, H)
    return o, l


# ----------------------------------------------------------------------------------------------
# The ops


def shared_prefix_attention(
    q_GHD: torch.Tensor,
    k_prefix_KSD: torch.Tensor,
    v_prefix_KSD: torch.Tensor,
    k_suffix_GKSD: torch.Tensor,
    v_suffix_GKSD: torch.Tensor,
    *,
    scale: float | None = None,
) -> torch.Tensor:
    """Cascade attention on contiguous KV: G decode queries over one shared prefix [K, S_p, D]
    plus each one's own suffix [G, K, S_s, D] (S_s may be 0). Returns [G, H, D].

    Head-major KV, as the standard kernel takes it and as vLLM-CPU stores each block: per KV head
    the prefix is one contiguous stream (faster than [S_p, K, D] views in the benchmark)."""
    scale = q_GHD.shape[-1] ** -0.5 if scale is None else scale
    o_p, l_p = _prefix_pass(q_GHD, k_prefix_KSD, v_prefix_KSD, scale)
    G, H, D = q_GHD.shape
    K, S = k_suffix_GKSD.shape[1], k_suffix_GKSD.shape[2]
    if S == 0:
        return o_p
    if _kernel_fits(q_GHD, k_suffix_GKSD, v_suffix_GKSD):
        # the suffix pass continues each row's online softmax from its prefix result: the merge
        # happens in the kernel (no merge op, no second write of the output)
        from arctic_rl.zorro.group_attention import paged_group_attention

        rep = H // K
        ends = torch.full((G,), S, dtype=torch.int64)
        o, _ = paged_group_attention(
            q_GHD.view(G, K, rep, D),
            k_suffix_GKSD,
            v_suffix_GKSD,
            None,
            torch.zeros(G, dtype=torch.int64),
            ends,
            scale,
            key_t_in_block=False,
            init=(o_p.view(G, K, rep, D), l_p.view(G, K, rep)),
        )
        return o.view(G, H, D)
    o_s, l_s = _attend(q_GHD, k_suffix_GKSD, v_suffix_GKSD, scale)
    return merge_attention_states(o_p, l_p, o_s, l_s)[0]


def paged_decode_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor | Sequence[int],
    *,
    scale: float | None = None,
    return_lse: bool = False,
):
    """Standard decode attention: each request's query over all of its own KV. [Q, H, D]."""
    Q, H, D = query.shape
    scale = D**-0.5 if scale is None else scale
    lens = [int(x) for x in seq_lens]
    out = query.new_empty(Q, H, D)
    lse = torch.empty(Q, H, dtype=torch.float32, device=query.device)
    # requests of equal length are attended as one batch (one gather, one kernel call)
    by_len: dict[int, list[int]] = {}
    for i, n in enumerate(lens):
        by_len.setdefault(n, []).append(i)
    for n, rows in by_len.items():
        idx = torch.tensor(rows, device=query.device)
        k = _gather_batched(key_cache, block_table, idx, 0, n)
        v = _gather_batched(value_cache, block_table, idx, 0, n)
        o, l = _attend(query.index_select(0, idx), k.transpose(1, 2), v.transpose(1, 2), scale)
        out[idx], lse[idx] = o, l
    return (out, lse) if return_lse else out


def cascade_decode_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor | Sequence[int],
    groups: Sequence[PrefixGroup],
    *,
    scale: float | None = None,
):
    """Decode attention with each group's shared prefix read once. Equals paged_decode_attention.

    groups: PrefixGroup(rows, prefix_len) with prefix_len in tokens, a multiple of the block size,
    <= every member's seq_len, and the prefix blocks identical in the members' block tables.
    Requests in no group take the standard path."""
    Q, H, D = query.shape
    scale = D**-0.5 if scale is None else scale
    bs = key_cache.shape[1]
    lens = [int(x) for x in seq_lens]
    out = query.new_empty(Q, H, D)
    grouped: set[int] = set()
    for g in groups:
        rows, P = list(g.rows), g.prefix_len
        if P % bs or any(lens[r] < P for r in rows) or grouped.intersection(rows):
            raise ValueError(
                f"bad cascade group {g}: prefix_len must be a multiple of the block size {bs}, "
                f"<= every member's seq_len, and groups must not overlap"
            )
        grouped.update(rows)
        idx = torch.tensor(rows, device=query.device)
        q = query.index_select(0, idx)
        prefix_blocks = block_table[rows[0], : P // bs]
        o_p, l_p = _prefix_pass(
            q,
            key_cache.index_select(0, prefix_blocks).flatten(0, 1).transpose(0, 1),
            value_cache.index_select(0, prefix_blocks).flatten(0, 1).transpose(0, 1),
            scale,
        )
        # suffix pass, batched over members of equal length; requests with no suffix keep the prefix result
        by_len: dict[int, list[int]] = {}
        for j, r in enumerate(rows):
            by_len.setdefault(lens[r], []).append(j)
        o_g = torch.empty_like(o_p)
        for n, js in by_len.items():
            jdx = torch.tensor(js, device=query.device)
            if n == P:
                o_g[jdx] = o_p.index_select(0, jdx)
                continue
            sub = idx.index_select(0, jdx)
            k = _gather_batched(key_cache, block_table, sub, P, n)
            v = _gather_batched(value_cache, block_table, sub, P, n)
            o_s, l_s = _attend(q.index_select(0, jdx), k.transpose(1, 2), v.transpose(1, 2), scale)
            o_g[jdx] = merge_attention_states(o_p.index_select(0, jdx), l_p.index_select(0, jdx), o_s, l_s)[0]
        out[idx] = o_g
    rest = [i for i in range(Q) if i not in grouped]
    if rest:
        idx = torch.tensor(rest, device=query.device)
        out[idx] = paged_decode_attention(
            query.index_select(0, idx),
            key_cache,
            value_cache,
            block_table.index_select(0, idx),
            [lens[i] for i in rest],
            scale=scale,
        )
    return out


def groups_from_block_table(
    block_table: torch.Tensor,
    seq_lens: Sequence[int],
    block_size: int,
    *,
    min_group_size: int = 2,
    min_prefix_len: int = 256,
) -> list[PrefixGroup]:
    """Cascade groups for a paged batch: requests whose *full* blocks coincide share those blocks'
    KV. min_prefix_len is in tokens. Returns groups with prefix_len in tokens."""
    seqs = [block_table[i, : int(n) // block_size].tolist() for i, n in enumerate(seq_lens)]
    min_blocks = max(1, -(-min_prefix_len // block_size))
    return [
        PrefixGroup(g.rows, g.prefix_len * block_size)
        for g in find_prefix_groups(seqs, min_group_size=min_group_size, min_prefix_len=min_blocks)
    ]


__all__ = [
    "PrefixGroup",
    "find_prefix_groups",
    "groups_from_block_table",
    "paged_decode_attention",
    "cascade_decode_attention",
    "gather_kv",
]
