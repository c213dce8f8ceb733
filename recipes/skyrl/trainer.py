"""`ArcticPPOTrainer`: skyrl-train 0.3.1's `RayPPOTrainer` with arctic-rl as policy, reference and sampler.

SkyRL's `train()` runs unmodified: its data loader, `prepare_generator_input`, reward post-processing,
`convert_to_training_input`, advantage estimators (`compute_advantages_and_returns`), KL-in-reward, eval,
metrics and tracker. The methods that reach SkyRL's Ray worker groups are the ones replaced here, each by
arctic-rl client ops:

  build_models / init_weight_sync_state       the client (its deployment owns the devices)
  fwd_logprobs_values_reward                  log_probs (policy) and log_probs(reference=True)
  train_critic_and_policy                     forward_backward("grpo") + optimizer_step per mini-batch
  sync_policy_weights_to_inference_engines    sync_weights
  update_ref_with_policy                      update_reference
  save_checkpoints / load_checkpoints         save_checkpoint / load_checkpoint (SkyRL's folder names)
  _remove_tail_data / pad_batch               no data-parallel padding: arctic-rl balances its own ranks

SkyRL's algorithm config maps onto our GRPO loss (arctic_rl/losses/grpo.py) by `loss_config_from_skyrl`;
a SkyRL setting with no arctic-rl equivalent (a critic, clip_cov, ...) is refused by name, never ignored.
"""

from __future__ import annotations

import os
from collections import defaultdict
from typing import Any

import numpy as np
from skyrl_train.trainer import RayPPOTrainer
from skyrl_train.utils import Timer

from arctic_rl.batch import select_rows
from recipes.skyrl.layout import to_arctic

GLOBAL_STEP_PREFIX = "global_step_"  # SkyRL's checkpoint folder names
LATEST_FILE = "latest_ckpt_global_step.txt"
# SkyRL policy_loss_type / loss_reduction / kl_estimator_type -> our names
POLICY_LOSSES = {"regular": "ppo", "dual_clip": "ppo", "gspo": "gspo", "cispo": "cispo"}
REDUCTIONS = {
    "token_mean": "token-mean",
    "sequence_mean": "seq-mean-token-mean",
    "seq_mean_token_sum_norm": "seq-mean-token-sum-norm",
}
KL_TYPES = {"k1": "k1", "k2": "k2", "k3": "k3", "abs": "abs"}
# Our loss metrics under SkyRL's policy/* names (its PolicyWorker's train_status keys).
STATUS_NAMES = {
    "actor/pg_loss": "policy_loss",
    "actor/pg_clipfrac": "ppo_clip_ratio",
    "actor/entropy": "policy_entropy",
    "actor/kl_loss": "policy_kl",
    "actor/grad_norm": "grad_norm",
    "actor/lr": "policy_lr",
}


def _bad(key: str, value: Any, known) -> ValueError:
    return ValueError(f"SkyRL config {key}={value!r} has no arctic-rl equivalent; supported: {sorted(known)}")


def loss_config_from_skyrl(cfg) -> dict[str, Any]:
    """The `grpo` loss_config equal to SkyRL's policy loss for `cfg.trainer.algorithm`."""
    alg = cfg.trainer.algorithm
    if alg.policy_loss_type not in POLICY_LOSSES:
        raise _bad("trainer.algorithm.policy_loss_type", alg.policy_loss_type, POLICY_LOSSES)
    if alg.loss_reduction not in REDUCTIONS:
        raise _bad("trainer.algorithm.loss_reduction", alg.loss_reduction, REDUCTIONS)
    out: dict[str, Any] = {
        "policy_loss": POLICY_LOSSES[alg.policy_loss_type],
        "clip_ratio_low": float(alg.eps_clip_low),
        "clip_ratio_high": float(alg.eps_clip_high),
        # SkyRL's "regular" PPO has no dual clip; ours always applies it at clip_ratio_c, so put it out of reach.
        "clip_ratio_c": float(alg.clip_ratio_c) if alg.policy_loss_type == "dual_clip" else 1e30,
        "loss_agg_mode": REDUCTIONS[alg.loss_reduction],
        "use_kl_loss": bool(alg.use_kl_loss),
    }
    if alg.loss_reduction == "seq_mean_token_sum_norm":
        out["loss_scale_factor"] = float(cfg.generator.sampling_params.max_generate_length)
    if alg.use_kl_loss:
        kl = alg.kl_estimator_type
        if kl not in KL_TYPES:
            raise _bad("trainer.algorithm.kl_estimator_type", kl, KL_TYPES)
        out.update(kl_loss_coef=float(alg.kl_loss_coef), kl_loss_type=KL_TYPES[kl])
    if alg.get("use_entropy_loss", False):
        out["entropy_coeff"] = float(alg.entropy_loss_coef)
    if alg.get("use_tis", False):
        # Truncated importance sampling: weight by min(pi_old / pi_rollout, cap) per token.
        out.update(rollout_is="token", rollout_is_threshold=float(alg.tis_imp_ratio_cap))
    if alg.policy_loss_type == "cispo":
        out.update(
            clip_ratio_low=float(alg.cispo.cispo_eps_clip_low), clip_ratio_high=float(alg.cispo.cispo_eps_clip_high)
        )
    return out


def _scheduler(opt) -> dict[str, Any]:
    kinds = {"constant_with_warmup": "constant", "constant": "constant"}
    if opt.scheduler not in kinds:
        raise _bad("trainer.policy.optimizer_config.scheduler", opt.scheduler, kinds)
    return {"type": kinds[opt.scheduler], "warmup_steps": int(opt.num_warmup_steps)}


def client_config_from_skyrl(cfg) -> ArcticRLClientConfig:  # noqa: F821
    """An ArcticRLClientConfig from SkyRL's trainer/generator config; `trainer.arctic` (optional, add it with
    `+trainer.arctic.<field>=...`) overrides any field, e.g. comm_protocol, port, server_python."""
    from omegaconf import OmegaConf

    from arctic_rl import ArcticRLClientConfig

    t, g = cfg.trainer, cfg.generator
    if t.critic.model.path is not None or t.algorithm.advantage_estimator == "gae":
        raise ValueError(
            "SkyRL with a critic (trainer.critic.model.path / advantage_estimator=gae): arctic-rl has "
            "no value model; use a critic-free estimator (grpo, rloo, reinforce++)"
        )
    if t.policy.model.lora.rank > 0:
        raise _bad("trainer.policy.model.lora.rank", t.policy.model.lora.rank, ["0"])
    opt = t.policy.optimizer_config
    extra = OmegaConf.to_container(t.get("arctic", None) or OmegaConf.create({}), resolve=True)
    p = t.placement
    data: dict[str, Any] = {
        "model_name": t.policy.model.path,
        "training_gpus": int(p.policy_num_gpus_per_node * p.policy_num_nodes),
        "sampling_gpus": int(g.num_inference_engines * g.inference_engine_tensor_parallel_size),
        "colocate": bool(p.colocate_all),
        # a reference model only for a KL term (in the loss or in the reward)
        "use_reference": bool(t.algorithm.use_kl_loss or t.algorithm.use_kl_in_reward),
        "seed": int(t.seed),
        "training_config": {
            "dtype": "bfloat16" if t.bf16 else "float32",
            "optimizer": {
                "lr": float(opt.lr),
                "weight_decay": float(opt.weight_decay),
                "betas": [float(b) for b in opt.adam_betas],
            },
            "lr_scheduler": _scheduler(opt),
            "grad_clip": float(opt.max_grad_norm or 0.0),
            "micro_batch_size": int(t.micro_train_batch_size_per_gpu),
            "gradient_checkpointing": bool(t.gradient_checkpointing),
        },
        "vllm_config": {
            "max_seq_len": int(t.max_prompt_length + g.sampling_params.max_generate_length),
            "tensor_parallel_size": int(g.inference_engine_tensor_parallel_size),
            "gpu_memory_utilization": float(g.gpu_memory_utilization),
            "enforce_eager": bool(g.enforce_eager),
        },
        # The server writes and reads checkpoints under SkyRL's ckpt_path only.
        "server": {"checkpoint_root": os.path.abspath(str(t.ckpt_path))},
    }
    for key, val in extra.items():  # nested dicts merge one level deep (training_config.zorro_train, ...)
        if isinstance(val, dict) and isinstance(data.get(key), dict):
            data[key] = {**data[key], **val}
        else:
            data[key] = val
    return ArcticRLClientConfig(**data)


class ArcticPPOTrainer(RayPPOTrainer):
    """RayPPOTrainer whose worker-group calls are arctic-rl client ops (see the module docstring)."""

    client = None  # set by attach()
    _uids: list[str] | None = None

    def attach(self, client) -> None:
        self.client = client
        # SkyRL's colocate_all path offloads its own policy model and inference engines, which this trainer
        # has none of; arctic-rl's engines sleep at the same phase boundaries instead (generate, the forward
        # passes after it, the weight sync), through EngineSleep.
        self.colocate_all = False
        from arctic_rl.client.sleep import EngineSleep

        self.engine_sleep = EngineSleep(client, client.config.use_reference, enabled=client.config.colocate)
        self.engine_sleep.wake_all()
        self.loss_config = loss_config_from_skyrl(self.cfg)
        self.use_ref = bool(self.cfg.trainer.algorithm.use_kl_loss or self.cfg.trainer.algorithm.use_kl_in_reward)

    # -- models and weights ----------------------------------------------------------------------------------
    def build_models(self, PolicyWorker=None, CriticWorker=None, RefWorker=None):  # noqa: N803
        if self.client is None:
            raise RuntimeError("ArcticPPOTrainer.attach(client) must run before build_models")

    def init_weight_sync_state(self):
        pass  # the deployment wired trainer -> sampler sync when it started

    async def generate(self, input_batch):
        self.engine_sleep.before_gen()  # trainer and reference asleep while the sampler generates
        return await super().generate(input_batch)

    def sync_policy_weights_to_inference_engines(self):
        self.engine_sleep.before_sync()  # the sampler awake first: a level-2 sleep dropped its weights
        self.client.sync_weights()
        return []  # SkyRL ray.get()s the returned refs

    def update_ref_with_policy(self):
        self.client.update_reference()

    def _remove_tail_data(self, entries):
        return entries

    def pad_batch(self, training_input):
        training_input.metadata["pad_size"] = 0
        return training_input

    # -- forward passes ---------------------------------------------------------------------------------------
    def fwd_logprobs_values_reward(self, training_input):
        self.engine_sleep.after_gen()  # generation is over: sampler asleep, trainer (and reference) awake
        batch = to_arctic(training_input)
        # SkyRL drops metadata["uids"] after computing advantages; kept here for the update (ZoRRo groups by uid).
        self._uids = batch.get("uid")
        logp = self.client.log_probs(batch)["log_probs"]
        training_input["action_log_probs"] = logp
        training_input["base_action_log_probs"] = (
            self.client.log_probs(batch, reference=True)["log_probs"] if self.use_ref else None
        )
        training_input["values"] = None
        if self.cfg.generator.sampling_params.logprobs is not None:
            mask = training_input["loss_mask"] > 0
            diff = (training_input["rollout_logprobs"][mask] - logp[mask]).exp().abs()
            self.all_metrics.update(
                {
                    "policy/rollout_train_prob_diff_mean": diff.mean().item(),
                    "policy/rollout_train_prob_diff_std": diff.std().item(),
                }
            )
        return training_input

    def train_critic_and_policy(self, data):
        data.metadata["global_step"] = self.global_step
        batch = to_arctic(data)
        rows = int(batch["input_ids"].shape[0])
        if "uid" not in batch and self._uids is not None and len(self._uids) == rows:
            batch["uid"] = self._uids
        per_mini = int(self.cfg.trainer.policy_mini_batch_size) * int(self.cfg.generator.n_samples_per_prompt)
        stats: dict[str, list[float]] = defaultdict(list)
        with Timer("policy_train", self.all_timings):
            for _ in range(int(self.cfg.trainer.update_epochs_per_batch)):
                for start in range(0, rows, per_mini):  # SkyRL keeps a prompt's samples adjacent
                    mini = select_rows(batch, list(range(start, min(rows, start + per_mini))))
                    out = self.client.forward_backward(mini, "grpo", self.loss_config)
                    opt = self.client.optimizer_step()
                    for k, v in {**out, "actor/grad_norm": opt["grad_norm"], "actor/lr": opt["lr"]}.items():
                        stats[STATUS_NAMES.get(k, k.split("/", 1)[-1])].append(float(v))
        status = {k: float(np.mean(v)) for k, v in stats.items()}
        self.all_metrics.update({f"policy/{k}": v for k, v in status.items()})
        return status

    # -- checkpoints (SkyRL's layout: <ckpt_path>/global_step_N + latest_ckpt_global_step.txt) ---------------
    def save_checkpoints(self):
        root = self.cfg.trainer.ckpt_path
        path = os.path.join(root, f"{GLOBAL_STEP_PREFIX}{self.global_step}")
        self.client.save_checkpoint(os.path.abspath(path))
        tmp = os.path.join(root, LATEST_FILE + ".tmp")
        with open(tmp, "w") as f:
            f.write(str(self.global_step))
        os.replace(tmp, os.path.join(root, LATEST_FILE))  # written last: a step without it is not "latest"

    def load_checkpoints(self):
        from skyrl_train.utils.trainer_utils import ResumeMode

        root = self.cfg.trainer.ckpt_path
        if self.resume_mode == ResumeMode.NONE:
            return 0, None
        if self.resume_mode == ResumeMode.LATEST:
            latest = os.path.join(root, LATEST_FILE)
            if not os.path.exists(latest):
                return 0, None
            with open(latest) as f:
                path = os.path.join(root, f"{GLOBAL_STEP_PREFIX}{int(f.read().strip())}")
        else:
            path = self.cfg.trainer.resume_path
        name = os.path.basename(os.path.normpath(path))
        if not name.startswith(GLOBAL_STEP_PREFIX):
            raise ValueError(f"trainer.resume_path={path!r}: expected a {GLOBAL_STEP_PREFIX}<N> folder")
        self.client.load_checkpoint(os.path.abspath(path))
        self.client.sync_weights()
        return int(name[len(GLOBAL_STEP_PREFIX) :]), path

    def save_models(self):
        raise ValueError(
            "trainer.hf_save_interval: HF exports are not an arctic-rl op; use trainer.ckpt_interval "
            "(arctic-rl checkpoints) and export from one"
        )
