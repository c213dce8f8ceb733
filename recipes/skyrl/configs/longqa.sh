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
source "$(dirname "${BASH_SOURCE[0]}")/_placement.sh"
DATA_ARGS=(--option "data_path=${HOTPOT:-data/longqa/hotpot_{split\}.json}" --option "tokenizer=$MODEL"
           --train-split train --val-split validation)
COMMON=(
  trainer.policy.model.path="$MODEL" trainer.strategy=fsdp2 "${PLACEMENT[@]}"
  generator.inference_engine_tensor_parallel_size=4 generator.num_inference_engines=8
  trainer.algorithm.advantage_estimator=grpo trainer.algorithm.use_kl_loss=false
  trainer.algorithm.policy_loss_type=regular trainer.algorithm.eps_clip_low=0.2 trainer.algorithm.eps_clip_high=0.28
  trainer.algorithm.loss_reduction=token_mean
  trainer.train_batch_size=64 trainer.policy_mini_batch_size=32 trainer.update_epochs_per_batch=1
  trainer.micro_train_batch_size_per_gpu=1 trainer.micro_forward_batch_size_per_gpu=1
  trainer.max_prompt_length=16384 generator.sampling_params.max_generate_length=4096
  generator.n_samples_per_prompt=8 generator.sampling_params.temperature=1.0 generator.sampling_params.top_p=1.0
  trainer.policy.optimizer_config.lr=1e-6 trainer.policy.optimizer_config.weight_decay=0.01
  trainer.gradient_checkpointing=true trainer.epochs=3 trainer.eval_interval=-1 trainer.ckpt_interval=50
  trainer.logger="['console','mlflow']" trainer.project_name=longqa
)
NATIVE=(trainer.run_name=skyrl-native-qwen3-32b)
ARCTIC=(trainer.run_name=skyrl-arctic-qwen3-32b "${ARCTIC_ZORRO[@]}" +trainer.arctic.vllm_config.tensor_parallel_size=4)
source "$(dirname "${BASH_SOURCE[0]}")/common.sh" "$@"
