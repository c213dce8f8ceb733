"""Stand-in for flash-attn (CUDA-only, no CPU wheel; its sdist compiles CUDA kernels) on CPU-only machines.

skyrl_train/model_wrapper.py:20 imports `flash_attn.bert_padding.{pad_input, unpad_input}` unconditionally, so
native SkyRL cannot be imported without flash-attn. Only bert_padding is provided (pure PyTorch, below); the
`flash_attn.ops.triton.cross_entropy` import in skyrl_train/utils/torch_utils.py:23 still fails with ImportError,
which SkyRL catches and falls back to its plain-PyTorch log-probs. Run with trainer.flash_attn=false (SDPA
attention) and trainer.use_sample_packing=false, so these functions are not called at all.
"""

__version__ = "0.0.0+cpu-stub"
