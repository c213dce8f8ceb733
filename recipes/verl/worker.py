"""`ArcticActorRolloutRefWorker`: verl's ActorRolloutRef role backed by arctic-rl.

verl's `RayPPOTrainer` calls the same worker-group methods on it as on verl's own
`verl.workers.engine_workers.ActorRolloutRefWorker` (compute_log_prob, compute_ref_log_prob, update_actor,
save/load_checkpoint), with the same no-padding TensorDicts; each maps onto arctic-rl client ops. The worker
group has one process: it holds the client, and arctic-rl places and runs its own engines (DeepSpeed trainer,
reference, vLLM samplers) on the cluster.
"""

from __future__ import annotations

import time
from collections import defaultdict

import numpy as np
import torch
from omegaconf import OmegaConf
from tensordict import TensorDict
from verl.single_controller.base import Worker
from verl.single_controller.base.decorator import Dispatch, make_nd_compute_dataproto_dispatch_fn, register
from verl.utils import tensordict_utils as tu

from recipes.verl.layout import to_arctic, to_no_padding

# verl actor config keys that our GRPO loss (arctic_rl/losses/grpo.py, verl semantics) reads by the same name.
LOSS_KEYS = (
    "clip_ratio_low",
    "clip_ratio_high",
    "clip_ratio_c",
    "loss_agg_mode",
    "entropy_coeff",
    "use_kl_loss",
    "kl_loss_coef",
    "kl_loss_type",
)


def client_config_from_verl(config) -> ArcticRLClientConfig:  # noqa: F821
    """An ArcticRLClientConfig from verl's `actor_rollout_ref` config; `actor_rollout_ref.arctic` (optional,
    add it with `+actor_rollout_ref.arctic.<field>=...`) overrides any field, nested ones included."""
    from arctic_rl import ArcticRLClientConfig

    c = config
    extra = OmegaConf.to_container(c.get("arctic", None) or OmegaConf.create({}), resolve=True)
    clip = c.actor.get("grad_clip", c.actor.optim.get("clip_grad", 1.0))
    training = {
        "optimizer": _optimizer_from_verl(c.actor.optim),
        "lr_scheduler": _scheduler_from_verl(c.actor.optim),
        "grad_clip": float(clip or 0.0),
    }
    micro = c.actor.get("ppo_micro_batch_size_per_gpu")
    if micro:
        training["micro_batch_size"] = int(micro)
    max_len = int(c.rollout.prompt_length) + int(c.rollout.response_length)
    vllm = {"max_seq_len": max_len}
    kw = {"model_name": str(c.model.path), "training_config": training, "vllm_config": vllm}
    return ArcticRLClientConfig(**_deep_merge(kw, extra))


def _deep_merge(base: dict, override: dict) -> dict:
    # A nested override (training_config.optimizer.eps) must keep its siblings (the lr verl set).
    out = dict(base)
    for key, val in override.items():
        out[key] = _deep_merge(out[key], val) if isinstance(val, dict) and isinstance(out.get(key), dict) else val
    return out


def _optimizer_from_verl(optim) -> dict:
    out = {"lr": float(optim.lr), "weight_decay": float(optim.get("weight_decay", 0.0))}
    if optim.get("betas") is not None:
        out["betas"] = tuple(float(b) for b in optim.betas)
    return out


def _scheduler_from_verl(optim) -> dict:
    """verl's warmup + constant/cosine schedule (`lr_scheduler_type`, or the older `warmup_style`)."""
    from arctic_rl.errors import ConfigError

    kind = optim.get("lr_scheduler_type") or optim.get("warmup_style") or "constant"
    if kind not in ("constant", "cosine"):
        raise ConfigError(
            f"actor_rollout_ref.actor.optim.lr_scheduler_type={kind!r}: arctic-rl runs 'constant' or 'cosine'"
        )
    total = max(int(optim.get("total_training_steps", -1) or -1), 0)
    warmup = int(optim.get("lr_warmup_steps", -1) or -1)
    if warmup < 0:  # verl: a negative step count means "use the ratio"
        warmup = int(float(optim.get("lr_warmup_steps_ratio", 0.0) or 0.0) * total)
    return {
        "type": kind,
        "warmup_steps": warmup,
        "total_steps": total,
        "min_lr_ratio": float(optim.get("min_lr_ratio", 0.0) or 0.0),
    }


class ArcticActorRolloutRefWorker(Worker):
    def __init__(self, config, role: str = "actor_rollout_ref", distillation_config=None, **kwargs):
        Worker.__init__(self)
        self.config = config
        self.role = role
        self.client = None
        for mesh in ("actor", "ref"):
            self._register_dispatch_collect_info(mesh_name=mesh, dp_rank=0, is_collect=True)

    # -- lifecycle ----------------------------------------------------------------------------------------------
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self):
        from arctic_rl import create_arctic_rl_client
        from arctic_rl.tracking import placement_tags

        self.client = create_arctic_rl_client(client_config_from_verl(self.config))
        print(f"[arctic-rl] placement: {placement_tags(self.client.health())['placement']}", flush=True)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def arctic_placement(self) -> dict[str, str]:
        """Where the deployment's engines run (arctic_rl.tracking.placement_tags): tags of verl's MLflow run."""
        from arctic_rl.tracking import placement_tags

        return placement_tags(self.client.health())

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def arctic_config(self) -> str:
        """The running deployment's config (with its job id): other processes attach with it."""
        return self.client.config.to_json()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def arctic_sync_weights(self) -> dict:
        return self.client.sync_weights()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def arctic_shutdown(self):
        if self.client is not None:
            self.client.shutdown()
            self.client = None

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, local_path, hdfs_path=None, global_step=0, max_ckpt_to_keep=None):
        return self.client.save_checkpoint(local_path)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, local_path, hdfs_path=None, del_local_after_load=False):
        out = self.client.load_checkpoint(local_path)
        self.client.wake("sampling")  # verl puts the sampler to sleep before it loads a checkpoint
        self.client.sync_weights()
        return out

    # -- compute ------------------------------------------------------------------------------------------------
    def _log_probs(self, data: TensorDict, reference: bool) -> TensorDict:
        batch = to_arctic(data)
        entropy = bool(tu.get(data, "calculate_entropy", False)) and not reference
        temperature = float(tu.get(data, "temperature", self.config.rollout.temperature))
        out = self.client.log_probs(batch, reference=reference, compute_entropy=entropy, temperature=temperature)
        tensors = {"log_probs": to_no_padding(out["log_probs"].float(), data)}
        if entropy:
            tensors["entropy"] = to_no_padding(out["entropy"].float(), data)
        return tu.get_tensordict(tensors, non_tensor_dict={"metrics": {"mfu": 0.0}})

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="actor"))
    def compute_log_prob(self, data: TensorDict) -> TensorDict:
        return self._log_probs(data, reference=False)

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="ref"))
    def compute_ref_log_prob(self, data: TensorDict) -> TensorDict:
        return self._log_probs(data, reference=True)

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="actor"))
    def update_actor(self, data: TensorDict) -> TensorDict:
        """verl's update: `epochs` passes over mini-batches of `mini_batch_size` rows; forward_backward +
        optimizer_step per mini-batch (arctic-rl splits micro-batches inside forward_backward)."""
        from arctic_rl.batch import select_rows

        t0 = time.perf_counter()
        batch = to_arctic(data)
        B = batch["input_ids"].shape[0]
        mini = int(tu.get(data, "mini_batch_size", B) or B)
        epochs = int(tu.get(data, "epochs", 1) or 1)
        shuffle = bool((tu.get(data, "dataloader_kwargs", {}) or {}).get("shuffle", False))
        seed = int(tu.get(data, "seed", 0) or 0)
        actor = self.config.actor
        loss_config = {k: actor[k] for k in LOSS_KEYS if actor.get(k) is not None}
        pl = actor.get("policy_loss", {}) or {}
        if pl.get("loss_mode", "vanilla") not in ("vanilla", "ppo"):
            loss_config["policy_loss"] = pl.get("loss_mode")
        if loss_config.get("loss_agg_mode") == "seq-mean-token-sum-norm" and actor.get("loss_scale_factor"):
            loss_config["loss_scale_factor"] = actor.get("loss_scale_factor")
        loss_config["temperature"] = float(tu.get(data, "temperature", self.config.rollout.temperature))
        if "ref_log_prob" not in batch:
            loss_config["use_kl_loss"] = False
        metrics: dict[str, list[float]] = defaultdict(list)
        g = torch.Generator().manual_seed(seed)
        for _ in range(epochs):
            order = torch.randperm(B, generator=g).tolist() if shuffle else list(range(B))
            for start in range(0, B, mini):
                rows = order[start : start + mini]
                out = self.client.forward_backward(select_rows(batch, rows), "grpo", loss_config)
                opt = self.client.optimizer_step()
                for k, v in out.items():
                    if k.startswith("actor/"):
                        metrics[k[len("actor/") :]].append(float(v))
                metrics["grad_norm"].append(float(opt["grad_norm"]))
                metrics["lr"].append(float(opt["lr"]))
        metrics["mfu"] = [0.0]
        metrics["update_s"] = [time.perf_counter() - t0]
        return tu.get_tensordict({}, non_tensor_dict={"metrics": {k: float(np.mean(v)) for k, v in metrics.items()}})
