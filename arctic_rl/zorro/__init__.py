"""ZoRRo: exact shared-prompt deduplication for GRPO-style batches (G samples per prompt).

  merge.py    merge_attention_states: the one attention idea (split keys, merge by log-sum-exp)
  train.py    ZoRRo Train: zorro_log_probs(model, batch) packs each prompt once ([prompt][resp_1]..)
  cascade.py  ZoRRo Inference: prefix-group discovery and cascade decode attention over a paged cache

Import the submodules directly; this package imports nothing heavy. See docs/zorro.md.
"""
