# Sourced by text2sql.sh and longqa.sh before common.sh: the 32B GRPO settings both backends share
# (recipes/<recipe>/configs/*_qwen3_32b.yaml) and each backend's placement on 4 nodes x 8 GPUs. Expects
# MODEL, BATCH (prompts per step), MINI (prompts per optimizer step), PROMPT_LEN and TP (rollout TP).
COMMON=(
  algorithm.adv_estimator=grpo algorithm.use_kl_in_reward=False
  data.train_batch_size=$BATCH data.max_prompt_length=$PROMPT_LEN data.max_response_length=4096
  data.filter_overlong_prompts=True data.truncation=error
  actor_rollout_ref.model.path="$MODEL" actor_rollout_ref.model.enable_gradient_checkpointing=True
  actor_rollout_ref.actor.optim.lr=1e-6 actor_rollout_ref.actor.optim.weight_decay=0.01
  actor_rollout_ref.actor.ppo_mini_batch_size=$MINI actor_rollout_ref.actor.ppo_epochs=1
  actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1
  actor_rollout_ref.actor.clip_ratio_low=0.2 actor_rollout_ref.actor.clip_ratio_high=0.28
  actor_rollout_ref.actor.loss_agg_mode=token-mean actor_rollout_ref.actor.use_kl_loss=False
  actor_rollout_ref.actor.entropy_coeff=0
  actor_rollout_ref.rollout.n=8 actor_rollout_ref.rollout.temperature=1.0 actor_rollout_ref.rollout.top_p=1.0
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=1
  trainer.total_training_steps=300 trainer.logger='[console,mlflow]' trainer.project_name=$RECIPE
  trainer.val_before_train=False trainer.test_freq=-1 trainer.save_freq=50
  trainer.use_v1=False  # both backends run verl's v0 loop (RayPPOTrainer.fit): the same trainer code
)
NATIVE=(
  trainer.experiment_name=verl-native-qwen3-32b trainer.nnodes=4 trainer.n_gpus_per_node=8
  actor_rollout_ref.actor.strategy=fsdp actor_rollout_ref.model.use_remove_padding=True
  actor_rollout_ref.actor.fsdp_config.param_offload=False actor_rollout_ref.actor.fsdp_config.optimizer_offload=False
  actor_rollout_ref.rollout.name=vllm actor_rollout_ref.rollout.tensor_model_parallel_size=$TP
  actor_rollout_ref.rollout.gpu_memory_utilization=0.6
)
ARCTIC=(
  trainer.experiment_name=verl-arctic-qwen3-32b trainer.nnodes=1 trainer.n_gpus_per_node=1
  +actor_rollout_ref.arctic.training_gpus=32 +actor_rollout_ref.arctic.sampling_gpus=32
  +actor_rollout_ref.arctic.reference_gpus=0 +actor_rollout_ref.arctic.colocate=True
  +actor_rollout_ref.arctic.training_config.zero_stage=3 +actor_rollout_ref.arctic.training_config.gradient_checkpointing=True
  +actor_rollout_ref.arctic.training_config.zorro_train.enable=True
  +actor_rollout_ref.arctic.vllm_config.tensor_parallel_size=$TP
  +actor_rollout_ref.arctic.arctic_inference_config.zorro_inference.enable=True
)
