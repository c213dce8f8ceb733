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
COMMON=(
  algorithm.adv_estimator=grpo algorithm.use_kl_in_reward=False
  data.train_batch_size=128 data.max_prompt_length=32768 data.max_response_length=4096
  data.filter_overlong_prompts=True data.truncation=error
  actor_rollout_ref.model.path="$MODEL" actor_rollout_ref.model.enable_gradient_checkpointing=True
  actor_rollout_ref.actor.optim.lr=1e-6 actor_rollout_ref.actor.optim.weight_decay=0.01
  actor_rollout_ref.actor.ppo_mini_batch_size=64 actor_rollout_ref.actor.ppo_epochs=1
  actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1
  actor_rollout_ref.actor.clip_ratio_low=0.2 actor_rollout_ref.actor.clip_ratio_high=0.28
  actor_rollout_ref.actor.loss_agg_mode=token-mean actor_rollout_ref.actor.use_kl_loss=False
  actor_rollout_ref.actor.entropy_coeff=0
  actor_rollout_ref.rollout.n=8 actor_rollout_ref.rollout.temperature=1.0 actor_rollout_ref.rollout.top_p=1.0
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=1
  trainer.total_training_steps=300 trainer.logger='[console,mlflow]' trainer.project_name=text2sql
  trainer.val_before_train=False trainer.test_freq=-1 trainer.save_freq=50
  trainer.use_v1=False  # both backends run verl's v0 loop (RayPPOTrainer.fit): the same trainer code
)
NATIVE=(
  trainer.experiment_name=verl-native-qwen3-32b trainer.nnodes=4 trainer.n_gpus_per_node=8
  actor_rollout_ref.actor.strategy=fsdp actor_rollout_ref.model.use_remove_padding=True
  actor_rollout_ref.actor.fsdp_config.param_offload=False actor_rollout_ref.actor.fsdp_config.optimizer_offload=False
  actor_rollout_ref.rollout.name=vllm actor_rollout_ref.rollout.tensor_model_parallel_size=2
  actor_rollout_ref.rollout.gpu_memory_utilization=0.6
)
ARCTIC=(
  trainer.experiment_name=verl-arctic-qwen3-32b trainer.nnodes=1 trainer.n_gpus_per_node=1
  +actor_rollout_ref.arctic.training_gpus=32 +actor_rollout_ref.arctic.sampling_gpus=32
  +actor_rollout_ref.arctic.log_prob_gpus=0 +actor_rollout_ref.arctic.colocate=True
  +actor_rollout_ref.arctic.training_config.zero_stage=3 +actor_rollout_ref.arctic.training_config.gradient_checkpointing=True
  +actor_rollout_ref.arctic.training_config.zorro_train.enable=True
  +actor_rollout_ref.arctic.vllm_config.tensor_parallel_size=2
  +actor_rollout_ref.arctic.arctic_inference_config.zorro_inference.enable=True
)
source "$(dirname "${BASH_SOURCE[0]}")/common.sh" "$@"
