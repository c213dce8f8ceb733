# Shared by recipes/verl/configs/<recipe>.sh: sourced, not run. Expects RECIPE, COMMON (verl overrides both
# backends share), ARCTIC and NATIVE (each backend's own) arrays, and DATA_ARGS (recipes.verl.recipe_data args).
set -euo pipefail
BACKEND=${1:?usage: $0 arctic|native|print-arctic|print-native [verl overrides ...]}
shift
cd "$(dirname "${BASH_SOURCE[0]}")/../../.."
ROOT=$PWD
VENV=${VENV:-$ROOT/.venv}
PYTHON=${PYTHON:-$VENV/bin/python}
export PYTHONPATH=$ROOT:$VENV/verl-ref:$VENV/verl-trainer${PYTHONPATH:+:$PYTHONPATH}
export TOKENIZERS_PARALLELISM=false
DATA=$(realpath -m "${VERL_DATA:-runs/verl-$RECIPE-data}")
case $BACKEND in
  arctic|print-arctic) ENTRY=recipes.verl.main; OWN=("${ARCTIC[@]}"); TAG_BACKEND=arctic-rl ;;
  native|print-native) ENTRY=verl.trainer.main_ppo; OWN=("${NATIVE[@]}"); TAG_BACKEND=native ;;
  *) echo "backend must be arctic or native (or print-arctic / print-native), got $BACKEND" >&2; exit 2 ;;
esac
ARGS=(data.train_files="$DATA/train.parquet" data.val_files="$DATA/val.parquet"
      reward.custom_reward_function.path="$ROOT/recipes/verl/reward_fn.py"
      reward.custom_reward_function.name=compute_score
      "${COMMON[@]}" "${OWN[@]}" "$@")
if [[ $BACKEND == print-* ]]; then  # the command, for docs and for checking the overrides compose
  printf '%s\n' "python -m $ENTRY" "${ARGS[@]}"
  exit 0
fi
[ -f "$DATA/train.parquet" ] || "$PYTHON" -m recipes.verl.recipe_data --recipe "$RECIPE" --out "$DATA" "${DATA_ARGS[@]}"
# The tags `arctic-rl compare` groups by (recipes.verl.main sets the arctic-rl ones itself; this covers native
# verl, whose MLflow logger starts the run in a Ray actor that inherits this environment on a local Ray).
if [ -z "${MLFLOW_RUN_CONTEXT:-}" ]; then
  export MLFLOW_RUN_CONTEXT="{\"framework\": \"verl\", \"backend\": \"$TAG_BACKEND\", \"recipe\": \"$RECIPE\"}"
fi
exec "$PYTHON" -m "$ENTRY" "${ARGS[@]}"
