#!/usr/bin/env bash
# GSM8K-style starter (single node) with SkyRL's GRPO trainer: arctic-rl backend or native SkyRL, same
# hyper-parameters. SkyRL's own GSM8K layout and reward (skyrl-gym's gsm8k env) on both.
#
#   recipes/skyrl/configs/gsm8k.sh arctic|native|print-arctic|print-native [SkyRL overrides ...]
#
# Env: SKYRL_DATA (default runs/skyrl-gsm8k-data: the shipped arithmetic set in GSM8K format, or GSM8K_TRAIN /
#      GSM8K_TEST jsonl files), MODEL (default Qwen/Qwen2.5-1.5B-Instruct), GPUS (default 4), SKYRL_PYTHON.
RECIPE=gsm8k
MODEL=${MODEL:-Qwen/Qwen2.5-1.5B-Instruct}
GPUS=${GPUS:-4}
DATA_ARGS=(${GSM8K_TRAIN:+--train "$GSM8K_TRAIN"} ${GSM8K_TEST:+--test "$GSM8K_TEST"})
COMMON=(
  trainer.policy.model.path="$MODEL" trainer.strategy=fsdp2
  trainer.placement.colocate_all=true trainer.placement.policy_num_gpus_per_node=$GPUS
  trainer.placement.ref_num_gpus_per_node=$GPUS generator.num_inference_engines=$GPUS
  generator.inference_engine_tensor_parallel_size=1
  trainer.algorithm.advantage_estimator=grpo trainer.algorithm.use_kl_loss=true trainer.algorithm.kl_loss_coef=0.001
  trainer.train_batch_size=64 trainer.policy_mini_batch_size=32 trainer.micro_train_batch_size_per_gpu=4
  trainer.micro_forward_batch_size_per_gpu=8 trainer.max_prompt_length=512 generator.sampling_params.max_generate_length=1024
  generator.n_samples_per_prompt=5 trainer.policy.optimizer_config.lr=1e-6 trainer.epochs=20
  trainer.eval_interval=5 trainer.eval_before_train=true trainer.ckpt_interval=10
  trainer.logger="['console','mlflow']" trainer.project_name=gsm8k
)
NATIVE=(trainer.run_name=skyrl-native)
ARCTIC=(trainer.run_name=skyrl-arctic +trainer.arctic.training_config.zorro_train.enable=true)
source "$(dirname "${BASH_SOURCE[0]}")/common.sh" "$@"
