#!/usr/bin/env bash
# The GPU checks as one prepared command, for a CUDA machine (tests/test_gpu.py; skipped without CUDA):
# ZoRRo Train through flash-attn, ZoRRo Inference's FLASH_ATTN step with the real kernel and end to end
# in vLLM, and the default colocated deployment (DeepSpeed + vLLM + sync) on one GPU.
#
#   pip install -e ".[gpu,test]"        # CUDA torch, vllm==0.32.0, flash-attn, DeepSpeed
#   bash scripts/gpu_check.sh           # PY=... to pick the interpreter; logs to $OUT (default .)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python}
OUT=${OUT:-.}
mkdir -p "$OUT"
"$PY" -c "import torch; assert torch.cuda.is_available(), 'no CUDA device visible'; print('device:', torch.cuda.get_device_name())"
timeout 1500 "$PY" -m pytest -q -rs --durations=10 tests/test_gpu.py 2>&1 | tee "$OUT/gpu_check.log"
echo "gpu_check: done ($(tail -n 1 "$OUT/gpu_check.log"))"
