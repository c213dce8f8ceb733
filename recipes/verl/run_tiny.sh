#!/usr/bin/env bash
# verl's own GRPO loop (RayPPOTrainer.fit) on arctic-rl: a tiny CPU run (2 steps by default).
#
#   recipes/verl/run_tiny.sh MODEL_DIR [verl overrides ...]
#
# Env (all optional): VERL_DATA   folder with train.parquet/test.parquet (default runs/verl-data; written with
#                                 recipes.verl.gsm8k from the shipped arithmetic set when missing)
#                     VERL_OUT    folder for mlflow.db and arctic-rl state (default runs/verl-tiny)
#                     MLFLOW_TRACKING_URI (default sqlite:///$VERL_OUT/mlflow.db), ARCTIC_RL_STATE_DIR,
#                     PYTHON (default .venv/bin/python), VENV (default .venv: verl-ref and verl-trainer live there)
# Later overrides win, e.g. trainer.total_training_steps=5 trainer.experiment_name=mine.
set -euo pipefail
MODEL=${1:?usage: $0 MODEL_DIR [verl overrides ...]}
shift
cd "$(dirname "$0")/../.."
ROOT=$PWD
VENV=${VENV:-$ROOT/.venv}
PYTHON=${PYTHON:-$VENV/bin/python}
VERL_DATA=$(realpath -m "${VERL_DATA:-runs/verl-data}")
VERL_OUT=$(realpath -m "${VERL_OUT:-runs/verl-tiny}")
mkdir -p "$VERL_OUT"
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export PYTHONPATH=$ROOT:$VENV/verl-ref:$VENV/verl-trainer${PYTHONPATH:+:$PYTHONPATH}
export MLFLOW_TRACKING_URI=${MLFLOW_TRACKING_URI:-sqlite:///$VERL_OUT/mlflow.db}
export ARCTIC_RL_STATE_DIR=${ARCTIC_RL_STATE_DIR:-$VERL_OUT/arctic-state}
if [ -n "${ARCTIC_RL_JOB_DIR:-}" ] && [ -n "${RAY_ADDRESS:-}" ]; then
  # Inside a job (jobs/bootstrap.py): verl's workers and arctic-rl's engines use the job's multi-node Ray.
  # Its raylets were started without verl on their path: the job's runtime env carries it to every node.
  RAY_INIT=(+ray_kwargs.ray_init.address="$RAY_ADDRESS"
            "+ray_kwargs.ray_init.runtime_env.env_vars.PYTHONPATH='$PYTHONPATH'")
  PRIVATE_RAY=()
else
  # A private Ray for this run (arctic_rl.local_ray): Ray's token auth with a fresh token, which the processes of
  # the run inherit, and a fresh 0700 temp dir removed after the run.
  unset RAY_ADDRESS
  RAY_INIT=(+ray_kwargs.ray_init.num_cpus=16 +ray_kwargs.ray_init.address=local)
  PRIVATE_RAY=("$ROOT/.venv/bin/python" -m arctic_rl.local_ray run --)
fi
[ -f "$VERL_DATA/train.parquet" ] || "$PYTHON" -m recipes.verl.gsm8k --out "$VERL_DATA"
source recipes/verl/tiny_args.sh
exec "${PRIVATE_RAY[@]}" "$PYTHON" -m recipes.verl.main "${TINY_ARGS[@]}" \
  +actor_rollout_ref.arctic.training_config.dtype=float32 +actor_rollout_ref.arctic.vllm_config.dtype=float32 \
  trainer.experiment_name=verl-arctic-tiny "${RAY_INIT[@]}" "$@"
