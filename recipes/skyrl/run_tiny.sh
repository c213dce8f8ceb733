#!/usr/bin/env bash
# SkyRL's own GRPO loop (RayPPOTrainer.train) on arctic-rl: a tiny CPU run (2 steps by default).
#
#   recipes/skyrl/run_tiny.sh MODEL_DIR [SkyRL overrides ...]
#
# SkyRL runs in .venv-skyrl (Python 3.12; scripts/setup_skyrl_env.sh), the arctic-rl server in .venv, over HTTP.
# Env (all optional): SKYRL_DATA  folder with train.jsonl/validation.jsonl (default runs/skyrl-data; written from
#                                 the toy recipe when missing: 8 train, 4 validation prompts)
#                     SKYRL_OUT   folder for mlflow.db, checkpoints and arctic-rl state (default runs/skyrl-tiny)
#                     MLFLOW_TRACKING_URI (default sqlite:///$SKYRL_OUT/mlflow.db), ARCTIC_RL_STATE_DIR,
#                     ARCTIC_RL_PORT (default 7311: the arctic-rl HTTP server)
# Later overrides win, e.g. trainer.epochs=2 trainer.run_name=mine.
set -euo pipefail
MODEL=${1:?usage: $0 MODEL_DIR [SkyRL overrides ...]}
shift
cd "$(dirname "$0")/../.."
ROOT=$PWD
PY=$ROOT/.venv-skyrl/bin/python
[ -x "$PY" ] || { echo "no $PY: run scripts/setup_skyrl_env.sh" >&2; exit 2; }
SKYRL_DATA=$(realpath -m "${SKYRL_DATA:-runs/skyrl-data}")
SKYRL_OUT=$(realpath -m "${SKYRL_OUT:-runs/skyrl-tiny}")
mkdir -p "$SKYRL_OUT"
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH}
export MLFLOW_TRACKING_URI=${MLFLOW_TRACKING_URI:-sqlite:///$SKYRL_OUT/mlflow.db}
export ARCTIC_RL_STATE_DIR=${ARCTIC_RL_STATE_DIR:-$SKYRL_OUT/arctic-state}
# SkyRL's ray.init() would join any Ray already running on this machine (e.g. a 2.60 cluster of the test
# session, which Ray 2.51 cannot talk to): "local" makes it start its own. The arctic-rl server starts
# another private one (2.60).
export RAY_ADDRESS=local
[ -f "$SKYRL_DATA/train.jsonl" ] || "$ROOT/.venv/bin/python" -m recipes.skyrl.data --recipe toy --out "$SKYRL_DATA" \
  --option num_examples=8 --val-split test --max-val 4
exec "$PY" -m recipes.skyrl.main \
  data.train_data="['$SKYRL_DATA/train.jsonl']" data.val_data="['$SKYRL_DATA/validation.jsonl']" \
  trainer.policy.model.path="$MODEL" trainer.placement.colocate_all=false \
  trainer.placement.policy_num_gpus_per_node=1 trainer.placement.ref_num_gpus_per_node=1 \
  trainer.placement.critic_num_gpus_per_node=1 \
  generator.num_inference_engines=1 generator.inference_engine_tensor_parallel_size=1 \
  trainer.epochs=1 trainer.train_batch_size=4 trainer.policy_mini_batch_size=2 \
  trainer.micro_train_batch_size_per_gpu=4 trainer.micro_forward_batch_size_per_gpu=4 \
  generator.n_samples_per_prompt=4 trainer.max_prompt_length=128 generator.sampling_params.max_generate_length=8 \
  generator.eval_n_samples_per_prompt=1 trainer.eval_batch_size=4 trainer.eval_interval=2 trainer.eval_before_train=false \
  trainer.algorithm.advantage_estimator=grpo trainer.algorithm.use_kl_loss=true trainer.algorithm.kl_loss_coef=0.001 \
  trainer.policy.optimizer_config.lr=1e-4 trainer.bf16=false trainer.gradient_checkpointing=false \
  trainer.resume_mode=none trainer.ckpt_interval=2 trainer.ckpt_path="$SKYRL_OUT/ckpts" \
  trainer.export_path="$SKYRL_OUT/exports" trainer.seed=0 \
  trainer.logger="['console','mlflow']" trainer.project_name=skyrl-tiny trainer.run_name=tiny \
  +trainer.arctic.port="${ARCTIC_RL_PORT:-7311}" +trainer.arctic.training_config.dtype=float32 \
  +trainer.arctic.vllm_config.dtype=float32 +trainer.arctic.vllm_config.max_seq_len=256 \
  "$@"
