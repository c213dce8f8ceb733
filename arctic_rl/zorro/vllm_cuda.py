"""ZoRRo Inference on CUDA: vLLM's FlashAttention backend with cascade decode.

vLLM 0.32 removed its own cascade attention, so this backend puts it back for GRPO's case: a
prompt's n samples share their prompt's KV blocks (prefix caching), and on a GPU decode is
memory-bound, so reading those blocks once per group instead of once per request is the win.

A pure-decode step (every request has one query token) with at least one group runs two paged
`flash_attn_varlen_func` calls, both with `return_softmax_lse=True`, then the LSE merge:

    prefix pass  each group's G queries as one varlen "sequence" of G query tokens, non-causal,
                 over the group's shared prefix blocks (the first member's block-table row)
    suffix pass  every request's query over its own blocks after its prefix (its whole sequence
                 if it is in no group): a block table with each row shifted past its prefix
    merge        merge_attention_states (arctic_rl.zorro.merge), written back in request order

Every other step (prefill, mixed batches, or no group) is vLLM's FlashAttentionImpl unchanged,
and so is the KV write (`do_kv_cache_update`). Groups are found once per step from the block
table (full blocks *before* each request's current token, so every suffix holds at least that
token and FlashAttention never sees an empty key range) and reused by all layers of the step.

The step logic (`plan_cascade`, `cascade_decode_varlen`) is device-agnostic and tested on CPU
with a plain-torch paged varlen attention in place of the kernel (tests/test_cascade_attention.py).
The backend classes need vLLM's CUDA build and have not run here (no GPU in this workplace).
Full CUDA graphs cannot capture a data-dependent step, so the engine runs PIECEWISE graphs with
attention eager (`arctic_rl.zorro.inference.vllm_engine_kwargs`).

Legend: Q requests, H query heads, K kv heads, D head dim, G requests in a group.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from arctic_rl.zorro.cascade import PrefixGroup, groups_from_block_table
from arctic_rl.zorro.merge import merge_attention_states

CLASS_PATH = "arctic_rl.zorro.vllm_cuda.ZorroFlashAttentionBackend"


@dataclass(frozen=True)
class CascadePlan:
    order: torch.Tensor          # [M] long: the grouped requests, each group's members adjacent
    cu_q: torch.Tensor           # [num_groups + 1] int32: group boundaries in `order`
    max_group: int
    prefix_lens: torch.Tensor    # [num_groups] int32, tokens (block-aligned)
    prefix_tables: torch.Tensor  # [num_groups, max_blocks] int32: the first member's row
    max_prefix: int
    cu_suffix: torch.Tensor      # [Q + 1] int32: 0..Q (one query token per request)
    suffix_lens: torch.Tensor    # [Q] int32: seq_len - prefix_len (the whole length if in no group)
    suffix_tables: torch.Tensor  # [Q, max_blocks] int32: each row shifted past its prefix blocks
    max_suffix: int


def find_groups(block_table: torch.Tensor, seq_lens: Sequence[int], block_size: int, *, min_group_size: int = 2,
                min_prefix_len: int = 256) -> list[PrefixGroup]:
    """Cascade groups over the full blocks before each request's current (last) token."""
    return groups_from_block_table(block_table, [int(n) - 1 for n in seq_lens], block_size,
                                   min_group_size=min_group_size, min_prefix_len=min_prefix_len)


def plan_cascade(block_table: torch.Tensor, seq_lens: Sequence[int], groups: Sequence[PrefixGroup],
                 block_size: int) -> CascadePlan | None:
    """The index tensors of one cascade step (on block_table's device); None if there is no group."""
    lens = [int(n) for n in seq_lens]
    Q, max_blocks = block_table.shape[0], block_table.shape[1]
    shift = [0] * Q
    order: list[int] = []
    cu, plens, heads = [0], [], []
    for g in groups:
        P = g.prefix_len
        if P <= 0 or P % block_size or any(lens[r] <= P for r in g.rows) or any(shift[r] for r in g.rows):
            raise ValueError(f"bad cascade group {g}: prefix_len must be a positive multiple of the block size "
                             f"{block_size}, < every member's seq_len, and groups must not overlap")
        order += g.rows
        cu.append(len(order))
        plens.append(P)
        heads.append(g.rows[0])
        for r in g.rows:
            shift[r] = P // block_size
    if not order:
        return None
    dev = block_table.device
    shift_t = torch.tensor(shift, device=dev)
    cols = (torch.arange(max_blocks, device=dev).unsqueeze(0) + shift_t.unsqueeze(1)).clamp_(max=max_blocks - 1)
    suffix_lens = [n - s * block_size for n, s in zip(lens, shift)]
    i32 = dict(dtype=torch.int32, device=dev)
    return CascadePlan(
        order=torch.tensor(order, dtype=torch.long, device=dev), cu_q=torch.tensor(cu, **i32),
        max_group=max(cu[i + 1] - cu[i] for i in range(len(plens))),
        prefix_lens=torch.tensor(plens, **i32),
        prefix_tables=block_table.index_select(0, torch.tensor(heads, device=dev)).to(torch.int32),
        max_prefix=max(plens), cu_suffix=torch.arange(Q + 1, **i32), suffix_lens=torch.tensor(suffix_lens, **i32),
        suffix_tables=block_table.gather(1, cols).to(torch.int32), max_suffix=max(suffix_lens))


def cascade_decode_varlen(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                          plan: CascadePlan, attend: Callable) -> torch.Tensor:
    """Decode attention [Q, H, D] for one query token per request, by the plan's two paged passes.

    attend(q=, k=, v=, cu_seqlens_q=, max_seqlen_q=, seqused_k=, max_seqlen_k=, block_table=, causal=)
    -> (out [T, H, D], lse [H, T]): flash_attn_varlen_func with return_softmax_lse=True (and the
    softmax scale bound), or any function with its signature."""
    o_s, l_s = attend(q=query, k=key_cache, v=value_cache, cu_seqlens_q=plan.cu_suffix, max_seqlen_q=1,
                      seqused_k=plan.suffix_lens, max_seqlen_k=plan.max_suffix, block_table=plan.suffix_tables,
                      causal=True)
    o_p, l_p = attend(q=query.index_select(0, plan.order), k=key_cache, v=value_cache, cu_seqlens_q=plan.cu_q,
                      max_seqlen_q=plan.max_group, seqused_k=plan.prefix_lens, max_seqlen_k=plan.max_prefix,
                      block_table=plan.prefix_tables, causal=False)
    merged, _ = merge_attention_states(o_p, l_p.transpose(0, 1), o_s.index_select(0, plan.order),
                                       l_s.transpose(0, 1).index_select(0, plan.order))
    return o_s.index_copy(0, plan.order, merged.to(o_s.dtype))


# ----------------------------------------------------------------------------------------------
# The vLLM backend (CUDA build of vLLM 0.32)

try:
    from vllm.v1.attention.backends.flash_attn import (FlashAttentionBackend, FlashAttentionImpl,
                                                       FlashAttentionMetadataBuilder)
except ImportError:  # vLLM absent or without its FlashAttention backend: the step logic above still works
    FlashAttentionBackend = FlashAttentionImpl = FlashAttentionMetadataBuilder = None

if FlashAttentionImpl is not None:
    from vllm.v1.attention.backend import AttentionCGSupport, AttentionType

    class ZorroFlashAttentionImpl(FlashAttentionImpl):
        min_group_size = 2
        min_prefix_len = 256
        cascade_calls = 0           # per process, for logs and the GPU check
        _step: tuple | None = None  # (metadata object, plan) of the current step

        def _cascade_applies(self, attn_metadata) -> bool:
            window = self.sliding_window
            return (attn_metadata.max_query_len == 1 and attn_metadata.causal is True
                    and self.attn_type == AttentionType.DECODER and getattr(self, "dcp_world_size", 1) == 1
                    and self.vllm_flash_attn_version in (2, 3) and not self.batch_invariant_enabled
                    and self.alibi_slopes is None and (window is None or tuple(window) == (-1, -1))
                    and not self.logits_soft_cap and getattr(self, "sinks", None) is None
                    and self.kv_cache_dtype == "auto" and attn_metadata.mm_prefix_query_range_tensor is None
                    and getattr(attn_metadata, "rswa_prefix_lens", None) is None)

        def _plan(self, attn_metadata, block_size: int) -> CascadePlan | None:
            step = ZorroFlashAttentionImpl._step
            if step is None or step[0] is not attn_metadata:   # first layer of a new step
                n = attn_metadata.num_actual_tokens
                lens = attn_metadata.seq_lens[:n].tolist()
                table = attn_metadata.block_table[:n]
                groups = find_groups(table.cpu(), lens, block_size, min_group_size=self.min_group_size,
                                     min_prefix_len=self.min_prefix_len)
                step = (attn_metadata, plan_cascade(table, lens, groups, block_size))
                ZorroFlashAttentionImpl._step = step
            return step[1]

        def forward(self, layer, query, key, value, kv_cache, attn_metadata, output, output_scale=None,
                    output_block_scale=None):
            if (attn_metadata is not None and output_scale is None and output_block_scale is None
                    and self._cascade_applies(attn_metadata)):
                # (B, H, N, 2*D) -> ((B, N, H, D), (B, N, H, D)), as FlashAttentionImpl.forward views it
                key_cache, value_cache = kv_cache.transpose(1, 2).split(self.head_size, dim=-1)
                plan = self._plan(attn_metadata, key_cache.shape[1])
                if plan is not None:
                    from vllm.v1.attention.backends.fa_utils import flash_attn_varlen_func

                    n = attn_metadata.num_actual_tokens
                    attend = functools.partial(flash_attn_varlen_func, softmax_scale=self.scale,
                                               return_softmax_lse=True, fa_version=self.vllm_flash_attn_version)
                    out = cascade_decode_varlen(query[:n], key_cache, value_cache, plan, attend)
                    output[:n].copy_(out.view(output[:n].shape))
                    ZorroFlashAttentionImpl.cascade_calls += 1
                    return output
            return super().forward(layer, query, key, value, kv_cache, attn_metadata, output, output_scale,
                                   output_block_scale)

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
