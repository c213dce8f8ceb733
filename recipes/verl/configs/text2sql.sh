#!/usr/bin/env bash
# text2sql (BIRD, execution-match reward) with verl's GRPO trainer: arctic-rl backend or native verl
# (FSDP actor/ref + vLLM rollout), same hyper-parameters: recipes/text2sql/configs/bird_qwen3_32b.yaml's.
#
#   recipes/verl/configs/text2sql.sh arctic [verl overrides ...]    # verl + arctic-rl (python -m recipes.verl.main)
#   recipes/verl/configs/text2sql.sh native [verl overrides ...]    # native verl (python -m verl.trainer.main_ppo)
#   recipes/verl/configs/text2sql.sh print-native                   # print the command only
#
# Env: VERL_DATA (parquet folder; default runs/verl-text2sql-data, written from the recipe when missing),
#      BIRD (BIRD folder for the data, default data/bird), MODEL (default Qwen/Qwen3-32B), VENV, PYTHON.
# Sizes: 4 nodes x 8 GPUs. MLflow: trainer.project_name=text2sql, tags framework/backend/recipe (common.sh).
RECIPE=text2sql
MODEL=${MODEL:-Qwen/Qwen3-32B}
DATA_ARGS=(--config recipes/text2sql/configs/bird_qwen3_32b.yaml --option "data_dir=${BIRD:-data/bird}"
           --option prefill=false --train-split train --val-split dev)
BATCH=128 MINI=64 PROMPT_LEN=32768 TP=2
source "$(dirname "${BASH_SOURCE[0]}")/_shared_32b.sh"
source "$(dirname "${BASH_SOURCE[0]}")/common.sh" "$@"
