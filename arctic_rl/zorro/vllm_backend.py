"""ZoRRo Inference as a vLLM-CPU attention backend (vLLM 0.32).

`install(min_group_size, min_prefix_len)` overrides vLLM's CPU_ATTN backend through vLLM's own
`register_backend` (the documented way to replace a backend implementation); the sampling engine calls it
before `vllm.LLM(...)` when `arctic_inference_config.zorro_inference.enable` is set on CPU. The override is
per process, and the engine runs vLLM's engine core in-process (VLLM_ENABLE_V1_MULTIPROCESSING=0).

`ZorroCPUAttentionImpl.forward` takes vLLM's path for everything but a pure decode batch (every query one
token) of plain decoder attention in the "vec" cache layout. For those it finds the groups of requests whose
full KV blocks coincide (prefix caching gives a prompt's n samples the same prompt blocks) and runs
`arctic_rl.zorro.vllm_cpu.cascade_decode_vllm_cpu`: each group's prefix blocks read once for its G queries,
each suffix separately, merged by log-sum-exp. Groups are found once per step (the metadata object is shared
by all layers of a step). KV writes stay vLLM's (`do_kv_cache_update`, unchanged).

Opt-in (as on CUDA). At the op level it beats vLLM's own CPU kernel on large groups and long prefixes and
ties it on small ones: that kernel re-reads shared prefix blocks from the CPU's L3, so the hardware already
dedups much of what the cascade saves (docs/zorro.md; runs in docs/benchmarks/). Not measured end to end.
"""

from __future__ import annotations

import logging

from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend, CPUAttentionBackendImpl

from arctic_rl.zorro.cascade import groups_from_block_table
from arctic_rl.zorro.vllm_cpu import cascade_decode_vllm_cpu

log = logging.getLogger(__name__)
CLASS_PATH = "arctic_rl.zorro.vllm_backend.ZorroCPUAttentionBackend"


class ZorroCPUAttentionImpl(CPUAttentionBackendImpl):
    min_group_size = 2
    min_prefix_len = 256
    # Counters (per process), for tests and logs: decode calls that took the cascade / vLLM's kernel.
    cascade_calls = 0
    fallback_calls = 0
    _groups_key: tuple | None = None
    _groups: list = []

    def _cascade_applies(self, layer, attn_metadata) -> bool:
        from vllm.v1.attention.backend import AttentionType

        return (
            attn_metadata is not None
            and attn_metadata.max_query_len == 1
            and attn_metadata.causal
            and self.attn_type == AttentionType.DECODER
            and getattr(layer, "isa", None) == "vec"
            and self.alibi_slopes is None
            and self.sliding_window in (-1, None)
            and not self.logits_soft_cap
            and self.sinks is None
            and self.kv_cache_dtype == "auto"
        )

    def _step_groups(self, attn_metadata, block_size: int) -> list:
        n = attn_metadata.num_actual_tokens
        lens = attn_metadata.seq_lens[:n].tolist()
        # The same metadata object (held, so its id cannot be reused) with the same lengths = the same step.
        key = (attn_metadata, tuple(lens))
        cached = ZorroCPUAttentionImpl._groups_key
        if cached is None or cached[0] is not attn_metadata or cached[1] != key[1]:
            ZorroCPUAttentionImpl._groups = groups_from_block_table(
                attn_metadata.block_table[:n],
                lens,
                block_size,
                min_group_size=self.min_group_size,
                min_prefix_len=self.min_prefix_len,
            )
            ZorroCPUAttentionImpl._groups_key = key
        return ZorroCPUAttentionImpl._groups

    def forward(
        self, layer, query, key, value, kv_cache, attn_metadata, output, output_scale=None, output_block_scale=None
    ):
        if output_scale is None and output_block_scale is None and self._cascade_applies(layer, attn_metadata):
            groups = self._step_groups(attn_metadata, kv_cache.shape[2])
            if groups:
                n = attn_metadata.num_actual_tokens
                q = query[:n].view(n, self.num_heads, self.head_size)
                out = cascade_decode_vllm_cpu(
                    q,
                    kv_cache,
                    attn_metadata.block_table[:n],
                    attn_metadata.seq_lens[:n].tolist(),
                    groups,
                    scale=self.scale,
                )
                output[:n].copy_(out.reshape(output[:n].shape))
                ZorroCPUAttentionImpl.cascade_calls += 1
                return output
        if attn_metadata is not None:
            ZorroCPUAttentionImpl.fallback_calls += 1
        return super().forward(
            layer, query, key, value, kv_cache, attn_metadata, output, output_scale, output_block_scale
        )


class ZorroCPUAttentionBackend(CPUAttentionBackend):
    @staticmethod
    def get_impl_cls() -> type[CPUAttentionBackendImpl]:
        return ZorroCPUAttentionImpl


def install(min_group_size: int = 2, min_prefix_len: int = 256) -> None:
    """Makes vLLM's CPU_ATTN backend this one, in this process (call before creating the engine)."""
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

    ZorroCPUAttentionImpl.min_group_size = int(min_group_size)
    ZorroCPUAttentionImpl.min_prefix_len = int(min_prefix_len)
    register_backend(AttentionBackendEnum.CPU_ATTN, CLASS_PATH)
    log.warning(
        "ZoRRo Inference: vLLM-CPU attention backend installed (cascade decode for groups >= %d sharing "
        ">= %d tokens); on CPU it measured slower than vLLM's own kernel (docs/zorro.md)",
        min_group_size,
        min_prefix_len,
    )


def uninstall() -> None:
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    AttentionBackendEnum.CPU_ATTN.clear_override()


__all__ = ["ZorroCPUAttentionBackend", "ZorroCPUAttentionImpl", "install", "uninstall", "CLASS_PATH"]
