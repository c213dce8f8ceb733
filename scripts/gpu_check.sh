#!/usr/bin/env bash
# The GPU checks as one prepared command, for a CUDA machine: tests/gpu/test_gpu.py, test_weight_sync_ipc.py
# (bucketed sync over CUDA IPC between two processes), test_gpu_sleep.py and test_gpu_plan.py (the plan's
# memory vs torch.cuda.max_memory_allocated; all skipped without CUDA),
# then the two ZoRRo benchmarks on the GPU. Each step runs even if an earlier one failed; logs and
# plots go to $OUT.
#
#   pip install -e ".[gpu,test]"        # CUDA torch, vllm==0.32.0, flash-attn, DeepSpeed (all checks)
#   bash scripts/gpu_check.sh           # PY=... picks the interpreter; OUT=... the log folder
#
# On a bare CUDA torch image (no vLLM, flash-attn or Ray) the ZoRRo checks on torch's FlashAttention-2
# kernel and the DeepSpeed rank still run; those that need vLLM or Ray skip and say so.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python}
OUT=${OUT:-outputs/gpu_check}
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 \
  TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1 TQDM_MININTERVAL=30
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1
  "$PY" - <<'EOF'
import importlib, torch
assert torch.cuda.is_available(), "no CUDA device visible"
print("device:", torch.cuda.get_device_name(), "| torch", torch.__version__, "| CUDA", torch.version.cuda)
for name in ("transformers", "deepspeed", "pydantic", "vllm", "flash_attn", "ray"):
    try:
        print(f"{name}: {importlib.import_module(name).__version__}")
    except Exception as e:  # noqa: BLE001 - report and go on
        print(f"{name}: missing ({type(e).__name__})")
print("flash forward:", torch.ops.aten._flash_attention_forward.default._schema)
EOF
} 2>&1 | tee "$OUT/env.txt"

timeout 300 "$PY" -m pytest -q -s -rs --durations=10 -p no:cacheprovider tests/gpu/test_gpu.py tests/gpu/test_weight_sync_ipc.py 2>&1 | tee "$OUT/gpu_tests.log"
# sleep/wake: the trainer's memory_allocated drops by >= 90% asleep, its state comes back bit-identical
timeout 300 "$PY" -m pytest -q -s -rs -p no:cacheprovider tests/gpu/test_gpu_sleep.py 2>&1 | tee "$OUT/gpu_sleep.log"
# the plan's per-engine memory vs torch.cuda.max_memory_allocated (ZeRO-1, ZeRO-3, LoRA, reference), within 25%
timeout 300 "$PY" -m pytest -q -s -rs -p no:cacheprovider tests/gpu/test_gpu_plan.py 2>&1 | tee "$OUT/gpu_plan.log"
timeout 150 "$PY" benchmarks/cascade_attention.py --device cuda --out "$OUT" 2>&1 | tee "$OUT/bench_cascade_cuda.log"
timeout 300 "$PY" benchmarks/zorro_train.py --device cuda --out "$OUT" 2>&1 | tee "$OUT/bench_zorro_train_cuda.log"

echo "gpu_check: tests: $(tail -n 1 "$OUT/gpu_tests.log")"
echo "gpu_check: sleep: $(tail -n 1 "$OUT/gpu_sleep.log")"
echo "gpu_check: plan: $(tail -n 1 "$OUT/gpu_plan.log")"
grep -h '^summary' "$OUT"/bench_*_cuda.log | sed 's/^/gpu_check: /'
