#!/usr/bin/env bash
# longqa (long-context multi-hop QA, substring-EM reward) with verl's GRPO trainer: arctic-rl backend or native
# verl (FSDP actor/ref + vLLM rollout), same hyper-parameters: recipes/longqa/configs/longqa_qwen3_32b.yaml's
# (16K-token prompts, 4K-token responses, n=8, 64 prompts/step), except YaRN: neither side sets it here
# (20K tokens fit Qwen3-32B's native 32K; the YAML's YaRN x4 is for 128K evaluation).
#
#   recipes/verl/configs/longqa.sh arctic [verl overrides ...]      # verl + arctic-rl (python -m recipes.verl.main)
#   recipes/verl/configs/longqa.sh native [verl overrides ...]      # native verl (python -m verl.trainer.main_ppo)
#   recipes/verl/configs/longqa.sh print-arctic                     # print the command only
#
# Env: VERL_DATA (parquet folder; default runs/verl-longqa-data, written from the recipe when missing),
#      HOTPOT (HotpotQA JSON pattern, default data/longqa/hotpot_{split}.json), MODEL (default Qwen/Qwen3-32B;
#      also the tokenizer for exact prompt lengths), VENV, PYTHON.
RECIPE=longqa
MODEL=${MODEL:-Qwen/Qwen3-32B}
DATA_ARGS=(--config recipes/longqa/configs/longqa_qwen3_32b.yaml
           --option "data_path=${HOTPOT:-data/longqa/hotpot_{split\}.json}" --option "tokenizer=$MODEL"
           --train-split train --val-split validation)
BATCH=64 MINI=32 PROMPT_LEN=16384 TP=4
source "$(dirname "${BASH_SOURCE[0]}")/_shared_32b.sh"
source "$(dirname "${BASH_SOURCE[0]}")/common.sh" "$@"
