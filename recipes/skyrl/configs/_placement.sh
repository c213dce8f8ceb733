# The 4 x 8 GPU placement both backends use (sourced by the recipe scripts).
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
