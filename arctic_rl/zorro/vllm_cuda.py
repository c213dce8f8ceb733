"""ZoRRo Inference on CUDA: vLLM's FlashAttention backend with cascade decode.

vLLM 0.32 removed its own cascade attention, so this backend puts it back for GRPO's case: a
prompt's n samples share their prompt's KV blocks (prefix caching), and on a GPU decode is
memory-bound, so reading those blocks once per group instead of once per request is the win.

A pure-decode step (every request has one query token) with at least one group runs two paged
`flash_attn_varlen_func` calls, both with `return_softmax_lse=True`, then the LSE merges:

    prefix pass  each group's G queries, with the r = H/K query heads that share a KV head packed
                 as rows (G*r query rows over K heads: a KV tile is read once for all of them), as
                 one non-causal varlen "sequence" over the group's shared prefix blocks (the first
                 member's block-table row); optionally one per split of the prefix (`split_tokens`)
    suffix pass  every request's query over its own blocks after its prefix (its whole sequence
                 if it is in no group): a block table with each row shifted past its prefix
    merge        prefix (and its splits) with suffix by log-sum-exp, written over the suffix output
                 in request order: one Triton kernel (arctic_rl.zorro.merge_triton) where Triton is
                 installed, else merge_attention_rows / merge_attention_states in torch ops

Why it is shaped this way (benchmarks/cascade_attention.py --device cuda; runs in docs/benchmarks/): a
decode step's KV reads are short on a GPU, so every launch counts. A merge in torch ops (many launches)
cancelled the cascade's gain when launched eagerly; the Triton merge and the packing keep it. Splits add
thread blocks (faster in GPU time) but also a query gather per step, which eager launches pay for, so
they are off by default (SPLIT_TOKENS).

Every other step (prefill, mixed batches, or no group) is vLLM's FlashAttentionImpl unchanged,
and so is the KV write (`do_kv_cache_update`). Groups are found once per step from the block
table (full blocks *before* each request's current token, so every suffix holds at least that
token and FlashAttention never sees an empty key range) and reused by all layers of the step.

The step logic (`plan_cascade`, `cascade_decode_varlen`) is device-agnostic: tested on CPU with a
plain-torch paged varlen attention in place of the kernel (tests/unit/arctic_rl/test_cascade_attention.py, the Triton
merge under Triton's interpreter) and on an H200 with torch's FlashAttention-2 (tests/gpu/test_gpu.py).
The backend classes need vLLM's CUDA build and have not run (no GPU run so far had vLLM installed).
Full CUDA graphs cannot capture a data-dependent step, so the engine runs PIECEWISE graphs with
attention eager (`arctic_rl.zorro.inference.vllm_engine_kwargs`).

Legend: Q requests, H query heads, K kv heads, D head dim, G requests in a group.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from arctic_rl.zorro.cascade import PrefixGroup, groups_from_block_table
from arctic_rl.zorro.merge import merge_attention_rows, merge_attention_states

CLASS_PATH = "arctic_rl.zorro.vllm_cuda.ZorroFlashAttentionBackend"
SPLIT_TOKENS = 0  # prefix split of the prefix pass; 0 = none (measured slower, see the module docstring)


@dataclass(frozen=True)
class CascadePlan:
    order: torch.Tensor  # [M] long: the grouped requests, each group's members adjacent
    heads_per_kv: int  # r: query heads per KV head, packed as prefix-pass rows
    split_rows: torch.Tensor  # [T] long: the packed row (member * r + head in its KV group) of
    # each prefix-pass query row; a group's rows repeat once per split
    member_base: torch.Tensor  # [M] int32: member m's first prefix-pass row (split 0, packed head 0)
    member_stride: torch.Tensor  # [M] int32: rows between its splits (its group's size * r)
    member_splits: torch.Tensor  # [M] int32: its group's number of splits
    cu_q: torch.Tensor  # [num_splits + 1] int32: prefix-pass sequences (one per group split)
    max_rows: int
    prefix_lens: torch.Tensor  # [num_splits] int32: keys of each split (block-aligned)
    prefix_tables: torch.Tensor  # [num_splits, max_blocks] int32: the first member's row, from the split
    max_prefix: int
    cu_suffix: torch.Tensor  # [Q + 1] int32: 0..Q (one query token per request)
    suffix_lens: torch.Tensor  # [Q] int32: seq_len - prefix_len (the whole length if in no group)
    suffix_tables: torch.Tensor  # [Q, max_blocks] int32: each row shifted past its prefix blocks
    max_suffix: int


def find_groups(
    block_table: torch.Tensor,
    seq_lens: Sequence[int],
    block_size: int,
    *,
    min_group_size: int = 2,
    min_prefix_len: int = 256,
) -> list[PrefixGroup]:
    """Cascade groups over the full blocks before each request's current (last) token."""
    return groups_from_block_table(
        block_table,
        [int(n) - 1 for n in seq_lens],
        block_size,
        min_group_size=min_group_size,
        min_prefix_len=min_prefix_len,
    )


def plan_cascade(
    block_table: torch.Tensor,
    seq_lens: Sequence[int],
    groups: Sequence[PrefixGroup],
    block_size: int,
    *,
    heads_per_kv: int = 1,
    split_tokens: int = 0,
) -> CascadePlan | None:
    """The index tensors of one cascade step (on block_table's device); None if there is no group.
    heads_per_kv: query heads per KV head (packed as rows); split_tokens: prefix split length,
    rounded down to whole blocks (0: one split per group)."""
    lens = [int(n) for n in seq_lens]
    Q, max_blocks = block_table.shape[0], block_table.shape[1]
    if heads_per_kv < 1 or split_tokens < 0:
        raise ValueError(
            f"plan_cascade: heads_per_kv must be >= 1 and split_tokens >= 0, got {heads_per_kv} and {split_tokens}"
        )
    r = heads_per_kv
    split_blocks = max(1, split_tokens // block_size) if split_tokens else max_blocks
    shift = [0] * Q
    order: list[int] = []
    rows: list[torch.Tensor] = []
    cu, plens, heads, starts = [0], [], [], []
    base: list[int] = []
    stride: list[int] = []
    nsplit: list[int] = []
    for g in groups:
        P = g.prefix_len
        if P <= 0 or P % block_size or any(lens[row] <= P for row in g.rows) or any(shift[row] for row in g.rows):
            raise ValueError(
                f"bad cascade group {g}: prefix_len must be a positive multiple of the block size "
                f"{block_size}, < every member's seq_len, and groups must not overlap"
            )
        first = len(order)
        order += g.rows
        nb = P // block_size
        G = len(g.rows)
        base += [cu[-1] + i * r for i in range(G)]
        stride += [G * r] * G
        nsplit += [-(-nb // split_blocks)] * G
        for b0 in range(0, nb, split_blocks):
            rows.append(torch.arange(first * r, len(order) * r))
            cu.append(cu[-1] + G * r)
            plens.append(min(split_blocks, nb - b0) * block_size)
            heads.append(g.rows[0])
            starts.append(b0)
        for row in g.rows:
            shift[row] = nb
    if not order:
        return None
    dev = block_table.device

    def shifted(row_ids: list[int], by: list[int]) -> torch.Tensor:
        cols = torch.arange(max_blocks, device=dev).unsqueeze(0) + torch.tensor(by, device=dev).unsqueeze(1)
        return (
            block_table.index_select(0, torch.tensor(row_ids, device=dev))
            .gather(1, cols.clamp_(max=max_blocks - 1))
            .to(torch.int32)
        )

    suffix_lens = [n - s * block_size for n, s in zip(lens, shift)]
    i32: dict[str, Any] = dict(dtype=torch.int32, device=dev)
    return CascadePlan(
        order=torch.tensor(order, dtype=torch.long, device=dev),
        heads_per_kv=r,
        split_rows=torch.cat(rows).to(dev),
        member_base=torch.tensor(base, **i32),
        member_stride=torch.tensor(stride, **i32),
        member_splits=torch.tensor(nsplit, **i32),
        cu_q=torch.tensor(cu, **i32),
        max_rows=max(cu[i + 1] - cu[i] for i in range(len(plens))),
        prefix_lens=torch.tensor(plens, **i32),
        prefix_tables=shifted(heads, starts),
        max_prefix=max(plens),
        cu_suffix=torch.arange(Q + 1, **i32),
        suffix_lens=torch.tensor(suffix_lens, **i32),
        suffix_tables=shifted(list(range(Q)), shift),
        max_suffix=max(suffix_lens),
    )


@functools.cache
def _triton_available() -> bool:
    try:
        import triton  # noqa: F401

        return True
    except ImportError:
        return False


def _fused_merge(query: torch.Tensor) -> bool:
    """The one-launch Triton merge (arctic_rl.zorro.merge_triton) on CUDA where Triton is installed.
    ARCTIC_RL_TRITON_MERGE=0 keeps the torch ops (A/B timing); =interpret uses the kernel on CPU
    tensors too, under TRITON_INTERPRET=1 (how CI tests it without a GPU)."""
    mode = os.environ.get("ARCTIC_RL_TRITON_MERGE", "1")
    return mode != "0" and (query.is_cuda or mode == "interpret") and _triton_available()


def cascade_decode_varlen(
    query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor, plan: CascadePlan, attend: Callable
) -> torch.Tensor:
    """Decode attention [Q, H, D] for one query token per request, by the plan's two paged passes.

    attend(q=, k=, v=, cu_seqlens_q=, max_seqlen_q=, seqused_k=, max_seqlen_k=, block_table=, causal=)
    -> (out [T, H, D], lse [H, T]): flash_attn_varlen_func with return_softmax_lse=True (and the
    softmax scale bound), or any function with its signature."""
    Q, H, D = query.shape
    K, r, M = key_cache.shape[2], plan.heads_per_kv, plan.order.numel()
    if H % (K * r):
        raise ValueError(
            f"cascade plan packs {r} query heads per KV head, which must divide the query's "
            f"{H} heads over the cache's {K} KV heads"
        )
    Hp = H // r
    o_s, l_s = attend(
        q=query,
        k=key_cache,
        v=value_cache,
        cu_seqlens_q=plan.cu_suffix,
        max_seqlen_q=1,
        seqused_k=plan.suffix_lens,
        max_seqlen_k=plan.max_suffix,
        block_table=plan.suffix_tables,
        causal=True,
    )
    # [M, H, D] -> [M * r, H / r, D]: row m * r + j, head a is query head a * r + j of member m, which
    # reads the same KV head as query head a * r (r divides H / K). One gather, no other copy.
    packed = query.reshape(Q, Hp, r, D).transpose(1, 2).index_select(0, plan.order).view(M * r, Hp, D)
    split = plan.split_rows.numel() > M * r  # some prefix is split
    o_p, l_p = attend(
        q=packed.index_select(0, plan.split_rows) if split else packed,
        k=key_cache,
        v=value_cache,
        cu_seqlens_q=plan.cu_q,
        max_seqlen_q=plan.max_rows,
        seqused_k=plan.prefix_lens,
        max_seqlen_k=plan.max_prefix,
        block_table=plan.prefix_tables,
        causal=False,
    )
    if _fused_merge(query):
        from arctic_rl.zorro.merge_triton import merge_prefix_into_suffix

        return merge_prefix_into_suffix(
            o_s.contiguous(),
            l_s.contiguous(),
            o_p.contiguous(),
            l_p.contiguous(),
            plan.order,
            plan.member_base,
            plan.member_stride,
            plan.member_splits,
            r,
        )
    l_p = l_p.transpose(0, 1)  # [T, H / r]
    if split:
        o_p, l_p = merge_attention_rows(o_p, l_p, plan.split_rows, M * r)
    o_p = o_p.reshape(M, r, Hp, D).transpose(1, 2).reshape(M, H, D)
    l_p = l_p.reshape(M, r, Hp).transpose(1, 2).reshape(M, H)
    merged, _ = merge_attention_states(
        o_p.float(), l_p, o_s.index_select(0, plan.order).float(), l_s.transpose(0, 1).index_select(0, plan.order)
    )
    return o_s.index_copy(0, plan.order, merged.to(o_s.dtype))


# ----------------------------------------------------------------------------------------------
# The vLLM backend (CUDA build of vLLM 0.32)

try:
    from vllm.v1.attention.backends.flash_attn import (
        FlashAttentionBackend,
        FlashAttentionImpl,
        FlashAttentionMetadataBuilder,
    )
except ImportError:  # vLLM absent or without its FlashAttention backend: the step logic above still works
    FlashAttentionBackend = FlashAttentionImpl = FlashAttentionMetadataBuilder = None  # type: ignore[misc,assignment]

if FlashAttentionImpl is not None:
    from vllm.v1.attention.backend import AttentionCGSupport, AttentionType

    class ZorroFlashAttentionImpl(FlashAttentionImpl):
        min_group_size = 2
        min_prefix_len = 256
        split_tokens = SPLIT_TOKENS
        cascade_calls = 0  # per process, for logs and the GPU check
        _step: tuple | None = None  # (metadata object, plan) of the current step

        def _cascade_applies(self, attn_metadata) -> bool:
            window = self.sliding_window
            return (
                attn_metadata.max_query_len == 1
                and attn_metadata.causal is True
                and self.attn_type == AttentionType.DECODER
                and getattr(self, "dcp_world_size", 1) == 1
                and self.vllm_flash_attn_version in (2, 3)
                and not self.batch_invariant_enabled
                and self.alibi_slopes is None
                and (window is None or tuple(window) == (-1, -1))
                and not self.logits_soft_cap
                and getattr(self, "sinks", None) is None
                and self.kv_cache_dtype == "auto"
                and attn_metadata.mm_prefix_query_range_tensor is None
                and getattr(attn_metadata, "rswa_prefix_lens", None) is None
            )

        def _plan(self, attn_metadata, block_size: int) -> CascadePlan | None:
            step = ZorroFlashAttentionImpl._step
            if step is None or step[0] is not attn_metadata:  # first layer of a new step
                n = attn_metadata.num_actual_tokens
                lens = attn_metadata.seq_lens[:n].tolist()
                table = attn_metadata.block_table[:n]
                groups = find_groups(
                    table.cpu(),
                    lens,
                    block_size,
                    min_group_size=self.min_group_size,
                    min_prefix_len=self.min_prefix_len,
                )
                step = (
                    attn_metadata,
                    plan_cascade(
                        table,
                        lens,
                        groups,
                        block_size,
                        heads_per_kv=self.num_heads // self.num_kv_heads,
                        split_tokens=self.split_tokens,
                    ),
                )
                ZorroFlashAttentionImpl._step = step
            return step[1]

        def forward(
            self, layer, query, key, value, kv_cache, attn_metadata, output, output_scale=None, output_block_scale=None
        ):
            if (
                attn_metadata is not None
                and output_scale is None
                and output_block_scale is None
                and self._cascade_applies(attn_metadata)
            ):
                # (B, H, N, 2*D) -> ((B, N, H, D), (B, N, H, D)), as FlashAttentionImpl.forward views it
                key_cache, value_cache = kv_cache.transpose(1, 2).split(self.head_size, dim=-1)
                plan = self._plan(attn_metadata, key_cache.shape[1])
                if plan is not None:
                    from vllm.v1.attention.backends.fa_utils import flash_attn_varlen_func

                    n = attn_metadata.num_actual_tokens
                    attend = functools.partial(
                        flash_attn_varlen_func,
                        softmax_scale=self.scale,
                        return_softmax_lse=True,
                        fa_version=self.vllm_flash_attn_version,  # type: ignore[arg-type]  # set on CUDA
                    )
                    out = cascade_decode_varlen(query[:n], key_cache, value_cache, plan, attend)
                    output[:n].copy_(out.view(output[:n].shape))
                    ZorroFlashAttentionImpl.cascade_calls += 1
                    return output
            return super().forward(
                layer, query, key, value, kv_cache, attn_metadata, output, output_scale, output_block_scale
            )

    class ZorroFlashAttentionMetadataBuilder(FlashAttentionMetadataBuilder):
        # A cascade step is data-dependent (groups, two kernel calls): no full CUDA graphs.
        _cudagraph_support = AttentionCGSupport.NEVER

    class ZorroFlashAttentionBackend(FlashAttentionBackend):
        @staticmethod
        def get_impl_cls():
            return ZorroFlashAttentionImpl

        @staticmethod
        def get_builder_cls():
            return ZorroFlashAttentionMetadataBuilder


def install(min_group_size: int = 2, min_prefix_len: int = 256) -> None:
    """Makes vLLM's FLASH_ATTN backend this one, in this process (call before creating the engine)."""
    if FlashAttentionImpl is None:
        raise RuntimeError("ZoRRo Inference on CUDA needs vLLM's FlashAttention backend (the CUDA build of vllm)")
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

    ZorroFlashAttentionImpl.min_group_size = int(min_group_size)
    ZorroFlashAttentionImpl.min_prefix_len = int(min_prefix_len)
    register_backend(AttentionBackendEnum.FLASH_ATTN, CLASS_PATH)


__all__ = ["CascadePlan", "find_groups", "plan_cascade", "cascade_decode_varlen", "install", "CLASS_PATH"]
