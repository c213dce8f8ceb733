# Shared by recipes/skyrl/configs/<recipe>.sh: sourced, not run. Expects RECIPE, COMMON (SkyRL overrides both
# backends share, placement included: arctic-rl derives its device counts from the same keys), ARCTIC and
# NATIVE (each backend's own) arrays, and DATA_ARGS (recipes.skyrl.data args).
set -euo pipefail
BACKEND=${1:?usage: $0 arctic|native|print-arctic|print-native [SkyRL overrides ...]}
shift
cd "$(dirname "${BASH_SOURCE[0]}")/../../.."
ROOT=$PWD
export PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH}
export TOKENIZERS_PARALLELISM=false
export ARCTIC_RL_RECIPE=${ARCTIC_RL_RECIPE:-$RECIPE}  # the `compare` recipe tag, both backends
DATA=$(realpath -m "${SKYRL_DATA:-runs/skyrl-$RECIPE-data}")
case $BACKEND in
  # SkyRL on arctic-rl: SkyRL in .venv-skyrl (scripts/setup_skyrl_env.sh), the arctic-rl server in .venv.
  arctic|print-arctic) PYTHON=${SKYRL_PYTHON:-$ROOT/.venv-skyrl/bin/python}; ENTRY=recipes.skyrl.main; OWN=("${ARCTIC[@]}") ;;
  # Native SkyRL: an environment with skyrl-train[vllm] on GPU nodes (SKYRL_PYTHON).
  native|print-native) PYTHON=${SKYRL_PYTHON:-python}; ENTRY=recipes.skyrl.native; OWN=("${NATIVE[@]}") ;;
  *) echo "backend must be arctic or native (or print-arctic / print-native), got $BACKEND" >&2; exit 2 ;;
esac
ARGS=(data.train_data="['$DATA/train.jsonl']" data.val_data="['$DATA/validation.jsonl']"
      "${COMMON[@]}" "${OWN[@]}" "$@")
if [[ $BACKEND == print-* ]]; then  # the command, for docs and for checking the overrides compose
  printf '%s\n' "python -m $ENTRY" "${ARGS[@]}"
  exit 0
fi
[ -f "$DATA/train.jsonl" ] || "$ROOT/.venv/bin/python" -m recipes.skyrl.data --recipe "$RECIPE" --out "$DATA" "${DATA_ARGS[@]}"
exec "$PYTHON" -m "$ENTRY" "${ARGS[@]}"
