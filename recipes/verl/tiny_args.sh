# Sourced by recipes/verl/run_tiny.sh and recipes/verl/native/run_tiny.sh: the tiny GRPO run's settings both
# backends share, so `arctic-rl compare` sees one setup. Expects MODEL, VERL_DATA, VERL_OUT; sets TINY_ARGS.
TINY_ARGS=(
  data.train_files="$VERL_DATA/train.parquet" data.val_files="$VERL_DATA/test.parquet"
  data.train_batch_size=2 data.max_prompt_length=256 data.max_response_length=16 data.dataloader_num_workers=0
  actor_rollout_ref.model.path="$MODEL" actor_rollout_ref.actor.optim.lr=1e-4
  actor_rollout_ref.actor.ppo_mini_batch_size=2 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4
  actor_rollout_ref.actor.use_kl_loss=True actor_rollout_ref.actor.kl_loss_coef=0.001
  actor_rollout_ref.rollout.n=4 actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4
  actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4
  algorithm.adv_estimator=grpo reward.num_workers=1
  trainer.use_v1=False trainer.device=cpu trainer.n_gpus_per_node=1 trainer.nnodes=1
  trainer.total_training_steps=2 trainer.val_before_train=False trainer.test_freq=-1 trainer.save_freq=-1
  trainer.default_local_dir="$VERL_OUT/checkpoints" trainer.logger='[console,mlflow]' trainer.project_name=gsm8k
)
