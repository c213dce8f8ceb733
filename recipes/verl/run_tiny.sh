cd "$(dirname "$0")/../.."
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 RAY_AUTH_MODE=disabled TOKENIZERS_PARALLELISM=false
export PYTHONPATH=$PWD:$PWD/.venv/verl-ref:$PWD/.venv/verl-trainer
export MLFLOW_TRACKING_URI=sqlite:////tmp/verl-mlflow.db ARCTIC_RL_STATE_DIR=/tmp/verl-arctic-state
unset RAY_ADDRESS
exec .venv/bin/python -m recipes.verl.main \
  data.train_files=/tmp/verl-data/train.parquet data.val_files=/tmp/verl-data/test.parquet \
  data.train_batch_size=2 data.max_prompt_length=256 data.max_response_length=16 data.dataloader_num_workers=0 \
  actor_rollout_ref.model.path=/tmp/verl-tiny actor_rollout_ref.actor.optim.lr=1e-4 \
  actor_rollout_ref.actor.ppo_mini_batch_size=2 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4 \
  actor_rollout_ref.actor.use_kl_loss=True actor_rollout_ref.actor.kl_loss_coef=0.001 \
  actor_rollout_ref.rollout.n=4 actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4 \
  actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4 \
  +actor_rollout_ref.arctic.training_config.dtype=float32 +actor_rollout_ref.arctic.vllm_config.dtype=float32 \
  algorithm.adv_estimator=grpo reward.num_workers=1 \
  trainer.use_v1=False trainer.device=cpu trainer.n_gpus_per_node=1 trainer.nnodes=1 \
  trainer.total_training_steps=2 trainer.val_before_train=False trainer.test_freq=-1 trainer.save_freq=-1 \
  trainer.logger='[console,mlflow]' trainer.project_name=gsm8k trainer.experiment_name=verl-arctic-tiny \
  +ray_kwargs.ray_init.num_cpus=16 +ray_kwargs.ray_init.address=local "$@"
