#!/usr/bin/env bash
# text2sql (BIRD, execution-match reward) with SkyRL's GRPO trainer: arctic-rl backend or native SkyRL (FSDP2
# policy/ref + vLLM engines), same hyper-parameters: recipes/text2sql/configs/bird_qwen3_32b.yaml's (as verl's).
#
#   recipes/skyrl/configs/text2sql.sh arctic [SkyRL overrides ...]   # SkyRL + arctic-rl (recipes.skyrl.main)
#   recipes/skyrl/configs/text2sql.sh native [SkyRL overrides ...]   # native SkyRL (recipes.skyrl.native)
#   recipes/skyrl/configs/text2sql.sh print-native                   # print the command only
#
# Env: SKYRL_DATA (jsonl folder; default runs/skyrl-text2sql-data, written from the recipe when missing),
#      BIRD (BIRD folder, default data/bird), MODEL (default Qwen/Qwen3-32B), SKYRL_PYTHON.
# Both score with env_class "arctic" (recipes/skyrl/env.py -> recipes.text2sql.reward). prefill=false: native
# SkyRL cannot pre-fill the assistant turn. MLflow: trainer.project_name=text2sql, tags framework/backend/recipe.
RECIPE=text2sql
MODEL=${MODEL:-Qwen/Qwen3-32B}
source "$(dirname "${BASH_SOURCE[0]}")/_shared.sh"
DATA_ARGS=(--option "data_dir=${BIRD:-data/bird}" --option schema_tables=all --option prefill=false
           --train-split train --val-split dev)
COMMON=(
  trainer.policy.model.path="$MODEL" "${PLACEMENT[@]}" "${GRPO_32B[@]}"
  trainer.train_batch_size=128 trainer.policy_mini_batch_size=64 trainer.max_prompt_length=32768
  trainer.project_name=text2sql
)
NATIVE=(trainer.run_name=skyrl-native-qwen3-32b)
ARCTIC=(trainer.run_name=skyrl-arctic-qwen3-32b "${ARCTIC_ZORRO[@]}" +trainer.arctic.vllm_config.tensor_parallel_size=2)
source "$(dirname "${BASH_SOURCE[0]}")/common.sh" "$@"
