# Sourced by text2sql.sh and longqa.sh: the 4 x 8 GPU placement and the GRPO settings of the 32B configs
# (recipes/<recipe>/configs/*_qwen3_32b.yaml, as verl's configs), shared by both backends.
PLACEMENT=(
  trainer.placement.colocate_all=true trainer.placement.policy_num_nodes=4 trainer.placement.policy_num_gpus_per_node=8
  trainer.placement.ref_num_nodes=4 trainer.placement.ref_num_gpus_per_node=8
  generator.num_inference_engines=16 generator.inference_engine_tensor_parallel_size=2
  generator.gpu_memory_utilization=0.6
)
ARCTIC_ZORRO=(
  +trainer.arctic.training_config.zero_stage=3 +trainer.arctic.training_config.zorro_train.enable=true
  +trainer.arctic.arctic_inference_config.zorro_inference.enable=true
)
GRPO_32B=(
  trainer.strategy=fsdp2 trainer.algorithm.advantage_estimator=grpo trainer.algorithm.use_kl_loss=false
  trainer.algorithm.policy_loss_type=regular trainer.algorithm.eps_clip_low=0.2 trainer.algorithm.eps_clip_high=0.28
  trainer.algorithm.loss_reduction=token_mean trainer.update_epochs_per_batch=1
  trainer.micro_train_batch_size_per_gpu=1 trainer.micro_forward_batch_size_per_gpu=1
  generator.sampling_params.max_generate_length=4096 generator.n_samples_per_prompt=8
  generator.sampling_params.temperature=1.0 generator.sampling_params.top_p=1.0
  trainer.policy.optimizer_config.lr=1e-6 trainer.policy.optimizer_config.weight_decay=0.01
  trainer.gradient_checkpointing=true trainer.epochs=3 trainer.eval_interval=-1 trainer.ckpt_interval=50
  trainer.logger="['console','mlflow']"
)
