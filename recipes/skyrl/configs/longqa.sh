#!/usr/bin/env bash
# Long-context multi-hop QA (HotpotQA-style, substring reward) with SkyRL's GRPO trainer: arctic-rl backend or
# native SkyRL, same hyper-parameters: recipes/longqa/configs/longqa_qwen3_32b.yaml's (as verl's).
#
#   recipes/skyrl/configs/longqa.sh arctic|native|print-arctic|print-native [SkyRL overrides ...]
#
# Env: SKYRL_DATA (default runs/skyrl-longqa-data, written from the recipe when missing), HOTPOT (data path
#      pattern, default data/longqa/hotpot_{split}.json), MODEL (default Qwen/Qwen3-32B), SKYRL_PYTHON.
RECIPE=longqa
MODEL=${MODEL:-Qwen/Qwen3-32B}
source "$(dirname "${BASH_SOURCE[0]}")/_shared.sh"
DATA_ARGS=(--option "data_path=${HOTPOT:-data/longqa/hotpot_{split\}.json}" --option "tokenizer=$MODEL"
           --train-split train --val-split validation)
COMMON=(
  trainer.policy.model.path="$MODEL" "${PLACEMENT[@]}" "${GRPO_32B[@]}"
  generator.inference_engine_tensor_parallel_size=4 generator.num_inference_engines=8
  trainer.train_batch_size=64 trainer.policy_mini_batch_size=32 trainer.max_prompt_length=16384
  trainer.project_name=longqa
)
NATIVE=(trainer.run_name=skyrl-native-qwen3-32b)
ARCTIC=(trainer.run_name=skyrl-arctic-qwen3-32b "${ARCTIC_ZORRO[@]}" +trainer.arctic.vllm_config.tensor_parallel_size=4)
source "$(dirname "${BASH_SOURCE[0]}")/common.sh" "$@"
