#!/usr/bin/env bash
# Native SkyRL (skyrl-train 0.3.1: FSDP2 policy/ref workers, vLLM engine, SkyRLGymGenerator) on CPU, tiny settings.
#
#   recipes/skyrl/native_cpu/run.sh [SkyRL overrides ...]
#
# Needs .venv-skyrl-native (recipes/skyrl/native_cpu/setup_venv.sh). In a job whose nodes run that environment's Ray
# it runs on the job's Ray (every node), else on a private Ray on this host (token auth with a fresh token, a fresh
# 0700 temp dir removed after the run: arctic_rl.local_ray). Env (optional): SKYRL_OUT (default
# runs/skyrl-native-cpu: tiny model, data, mlflow.db, ckpts), MLFLOW_TRACKING_URI, SKYRL_NATIVE_PYTHON (default
# .venv-skyrl-native/bin/python).
set -euo pipefail
cd "$(dirname "$0")/../../.."
ROOT=$PWD
PY=${SKYRL_NATIVE_PYTHON:-$ROOT/.venv-skyrl-native/bin/python}
[ -x "$PY" ] || { echo "no $PY: run recipes/skyrl/native_cpu/setup_venv.sh" >&2; exit 2; }
OUT=$(realpath -m "${SKYRL_OUT:-runs/skyrl-native-cpu}")
mkdir -p "$OUT"
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# stubs/: flash_attn.bert_padding (skyrl_train/model_wrapper.py:20 imports it unconditionally) and sitecustomize.py.
export PYTHONPATH=$ROOT:$ROOT/recipes/skyrl/native_cpu/stubs${PYTHONPATH:+:$PYTHONPATH}
export SKYRL_NATIVE_CPU_SHIMS=1  # stubs/sitecustomize.py applies cpu_shims.py in every process
export MLFLOW_TRACKING_URI=${MLFLOW_TRACKING_URI:-sqlite:///$OUT/mlflow.db}
# The job's Ray when its nodes run this environment's Ray (jobs.slurm submit --ray-python .venv-skyrl-native/bin/python;
# a driver joins only a Ray of its own Ray and Python version), else a private one that ends with this run.
PRIVATE_RAY=()
if [ -n "${RAY_ADDRESS:-}" ] && [ "$(realpath -m "${ARCTIC_RL_RAY_PYTHON:-/}")" = "$(realpath -m "$PY")" ]; then
  echo "native SkyRL: the job's Ray at $RAY_ADDRESS (its nodes run $ARCTIC_RL_RAY_PYTHON)"
else
  export RAY_ADDRESS=local
  PRIVATE_RAY=("$ROOT/.venv/bin/python" -m arctic_rl.local_ray run --)
fi
# vLLM-CPU: 1 GiB KV cache, no core pinning ("all" in vLLM 0.11; 2 shared cores), one OpenMP thread per process.
export VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1} VLLM_CPU_OMP_THREADS_BIND=${VLLM_CPU_OMP_THREADS_BIND:-all}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
MODEL=$OUT/tiny-llama
[ -f "$MODEL/config.json" ] || PYTHONPATH=$ROOT/tests "$PY" -c \
  "import sys; from tiny_models import make_tiny_model; make_tiny_model(sys.argv[1], 'llama')" "$MODEL"
DATA=$OUT/data
[ -f "$DATA/train.jsonl" ] || "$ROOT/.venv/bin/python" -m recipes.skyrl.data --recipe toy --out "$DATA" \
  --option num_examples=4 --val-split test --max-val 2
exec "${PRIVATE_RAY[@]}" "$PY" -m recipes.skyrl.native_cpu.main \
  data.train_data="['$DATA/train.jsonl']" data.val_data="['$DATA/validation.jsonl']" \
  trainer.policy.model.path="$MODEL" trainer.strategy=fsdp2 trainer.placement.colocate_all=false \
  trainer.placement.policy_num_gpus_per_node=1 trainer.placement.ref_num_gpus_per_node=1 \
  trainer.placement.critic_num_gpus_per_node=1 \
  generator.num_inference_engines=1 generator.inference_engine_tensor_parallel_size=1 \
  generator.weight_sync_backend=gloo generator.model_dtype=float32 generator.max_num_seqs=8 \
  generator.max_num_batched_tokens=512 +generator.engine_init_kwargs.max_model_len=256 \
  trainer.flash_attn=false trainer.use_sample_packing=false trainer.bf16=false trainer.gradient_checkpointing=false \
  trainer.epochs=1 trainer.train_batch_size=2 trainer.policy_mini_batch_size=2 \
  trainer.micro_train_batch_size_per_gpu=2 trainer.micro_forward_batch_size_per_gpu=2 \
  generator.n_samples_per_prompt=2 trainer.max_prompt_length=64 generator.sampling_params.max_generate_length=8 \
  trainer.eval_interval=-1 trainer.eval_before_train=false \
  trainer.algorithm.advantage_estimator=grpo trainer.algorithm.use_kl_loss=true trainer.algorithm.kl_loss_coef=0.001 \
  trainer.policy.optimizer_config.lr=1e-4 trainer.resume_mode=none trainer.ckpt_interval=100 \
  trainer.ckpt_path="$OUT/ckpts" trainer.export_path="$OUT/exports" trainer.seed=0 \
  trainer.logger="['console','mlflow']" trainer.project_name=skyrl-native-cpu trainer.run_name=tiny-native-cpu \
  "$@"
