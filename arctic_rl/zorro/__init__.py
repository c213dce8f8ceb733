"""ZoRRo: exact shared-prompt deduplication for GRPO-style batches (G samples per prompt).

  merge.py    merge_attention_states: the one attention idea (split keys, merge by log-sum-exp)
  train.py    ZoRRo Train: zorro_log_probs(model, batch) packs each prompt once ([prompt][resp_1]..)
  cascade.py  ZoRRo Inference: prefix-group discovery and cascade decode attention over a paged cache
  vllm_cpu.py / vllm_backend.py   cascade over vLLM-CPU's KV cache, as a CPU_ATTN backend override
  vllm_cuda.py                    cascade as a FLASH_ATTN backend override (paged varlen passes)
  inference.py                    what the sampling engine calls to install them (and vLLM's plugin hook)

Import the submodules directly; this package imports nothing heavy. See docs/zorro.md.
"""
