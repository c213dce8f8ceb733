"""verl 0.9.1's own actor update vs arctic-rl's training engine: one GRPO update on the same batch.

Same batch (one long prompt, G responses; ids from a fixed seed), same weights (one saved model folder
that every side loads), same loss (verl's GRPO defaults: vanilla PPO clip 0.2, dual clip 3.0,
token-mean, no entropy or KL term), fp32, one micro-batch holding the whole group:
  verl          verl's FSDPEngineWithLMHead (FSDP2 over a one-rank process group, its AdamW and
                gradient clipping) built by its own initialize() from the model folder; one update is
                its train_batch (forward_backward_batch with verl.workers.utils.losses.ppo_loss, then
                optimizer_step) on the TensorDict verl's trainer makes (left_right_2_no_padding)
  verl+fused    the same engine with verl's fused kernels (model.use_fused_kernels, impl_backend "torch":
                verl.utils.experimental.torch_functional.FusedLinearForPPO, the LM head and log-probs in
                chunks without the [tokens, vocab] logits; its "triton" backend is CUDA-only)
  verl+pg       the same engine and module; the forward is verl's PrefixGrouper integration
                (verl.trainer.ppo.prefix_grouper_utils.forward_micro_batch_with_prefix_grouper, with
                verl's apply_prefix_grouper_patch on transformers' attention functions), the loss
                verl's vanilla policy loss (core_algos), then the engine's optimizer_step
  arctic        arctic_rl.engines.training.TrainingWorker (DeepSpeed, ZeRO-0), forward_backward + optimizer_step
  arctic+zorro  the same with training_config.zorro_train.enable

Before timing, each variant is compared with verl on a batch of its own (check_batch: three prompt groups
of different prompt lengths, ragged responses with padding, advantages of both signs, old log-probs within
0.3 of the model's own, so no row's ratio sits clipped at a constant): the loss, the gradients before any
optimizer step and the weight change of one optimizer step; the largest per-parameter relative difference
(||g - g_verl|| / ||g_verl||, the same for the change) must be <= --grad-tol (fp32; --step-tol for the
change), or the script exits 1 without timing. `--break-zorro` shifts the position ids of ZoRRo's responses by one (an off-by-one a packing
bug would make), `--break-zorro one-row` only those of the row with the most negative advantage; the check
must fail either way (tests/unit/test_vs_verl.py).

What of verl does not run here, on a CPU: verl 0.9.1 registers its FSDP engine for CUDA and NPU only and
has no CPU platform, so this script registers one through verl's platform plugin API
(verl.plugin.platform.set_platform: device "cpu", backend gloo) and builds the engine class directly
instead of through EngineRegistry; Ray and the worker group around the engine (ActorRolloutRefWorker,
its mini-batch iterator, timers and metrics) do not run; FSDP2 shards over one rank; attention is SDPA
(flash-attn is CUDA-only), so verl runs with model.use_remove_padding=False (padded batch) - its
remove-padding path needs flash-attn's varlen kernel to keep packed sequences apart. verl 0.9.1's engine
no longer calls its PrefixGrouper forward (the legacy dp_actor that did is gone), so verl+pg calls it on
the engine's module; PrefixGrouper hands the attention function flash-attn's 2-D key masks (causal aligned
bottom-right), which transformers' SDPA function cannot take, so `flash_mask_sdpa` turns them into SDPA's
4-D boolean masks (verl's own patch then wraps that function); PrefixGrouper's prefix call (queries and keys
the prompt alone, no padding) goes to SDPA as a causal call without a mask, as flash-attn runs it, so the
prompt's attention skips the masked half. Its suffix call takes each response's copy of the prompt's keys and
values (PrefixGrouper's batch_repeat_cat, prefix_grouper/forward.py: the same on CUDA). Gradient checkpointing
is off on every side (verl's default turns it on, which would add a forward to verl's time).

Times are the median and interquartile range over --reps interleaved updates (wall clock and process CPU
time; a warm-up update first). The FLOP limit is benchmarks/zorro_train.py's: the padded batch's FLOPs over
ZoRRo's, linear layers, LM head and causal attention (scores and values) counted. Peak memory is the resident
high-water mark above the level before the update (VmHWM, reset just before), in a fresh process per
variant; on CUDA the allocator's high-water mark. Each variant's update times also go to MLflow
(experiment "vs_verl", tags framework/backend/recipe/model/n/...), for `arctic-rl compare`.

    python benchmarks/vs_verl.py                  # W1 (prompt 1024, response 128, G 16) and the demo model
    python benchmarks/vs_verl.py --quick          # small sizes, for development
    python benchmarks/vs_verl.py --check-only --quick [--break-zorro [one-row]]
    python benchmarks/vs_verl.py --device cuda    # the same on a GPU (fp32)
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import types
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch
from report import Report, add_report_args
from zorro_train import MODELS, _status_bytes, flops

# verl (and prefix_grouper beside it) and its trainer deps live --no-deps beside the venv (scripts/setup_env.sh)
VENV = Path(sys.executable).parent.parent
VERL_DIRS = ("verl-trainer", "verl-ref")
ROOT = Path(__file__).resolve().parents[1]  # for recipes.verl.native's CPU platform

VARIANTS = ("verl", "verl+fused", "verl+pg", "arctic", "arctic+zorro")
LEFT_OUT = next(p for p in __doc__.split("\n\n") if p.startswith("What of verl does not run here"))
WORKLOADS = {
    # W1 (benchmarks/zorro_train.py): its small model, prompt 1024, response 128, G 16
    "w1": dict(model="small", prompt=1024, response=128, group=16),
    # the demo model's shape (SmolLM2-135M-Instruct: arctic_rl/demo_model.py), random weights
    # Five engines of this model (weights, gradients, AdamW state and verl's logits) in one process pass 19 GiB and
    # the machine's 24 GiB with the memory runs (killed twice on 2026-12-05): its default leaves verl+fused out,
    # which `--workloads demo --variants verl,verl+fused` times on its own
    "demo": dict(
        model="smollm2-135m", prompt=256, response=32, group=8, variants=("verl", "verl+pg", "arctic", "arctic+zorro")
    ),
    # for tests/unit/test_vs_verl.py: seconds, not minutes
    "tiny": dict(model="tiny", prompt=48, response=8, group=4),
}
QUICK = dict(prompt=128, response=16, group=4)
MODELS.setdefault(
    "tiny",
    dict(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        vocab_size=512,
    ),
)
MODELS.setdefault(
    "smollm2-135m",
    dict(
        hidden_size=576,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        intermediate_size=1536,
        vocab_size=49152,
    ),
)
# (framework, backend) tags of each variant's MLflow run: `arctic-rl compare` sets arctic-rl rows against verl's
RUN_TAGS = {
    "verl": ("verl", "native"),
    "verl+fused": ("verl+fused_kernels", "native"),
    "verl+pg": ("verl+prefix_grouper", "native"),
    "arctic": ("arctic-rl without ZoRRo", "arctic-rl"),  # a framework of its own: compare labels by framework
    "arctic+zorro": ("arctic-rl", "arctic-rl"),
}
LR = 1e-6  # verl's actor default
GRAD_CLIP = 1.0
WEIGHT_DECAY = 0.01


# ---------------------------------------------------------------------------------------------
# the shared inputs: a model folder every side loads, and the batch


def model_folder(name: str, out: Path, max_len: int) -> Path:
    """Random weights of MODELS[name]'s shape (seed 0), saved once; every variant loads this folder."""
    from transformers import LlamaConfig, LlamaForCausalLM

    folder = out / f"{name}-{max_len}"
    if (folder / "config.json").exists():
        return folder
    torch.manual_seed(0)
    cfg = LlamaConfig(**MODELS[name], max_position_embeddings=max_len, tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg)
    tmp = folder.with_name(folder.name + ".tmp")
    model.save_pretrained(tmp)
    tmp.rename(folder)  # whole or not at all
    return folder


def make_batch(vocab: int, P: int, R: int, G: int, seed: int = 0) -> dict[str, Any]:
    """arctic-rl's padded batch: one prompt of P tokens shared by G responses of R tokens (no pad token 0)."""
    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(1, vocab, (P,), generator=g)
    resp = torch.randint(1, vocab, (G, R), generator=g)
    ids = torch.cat([prompt.expand(G, P), resp], 1)
    old = -torch.rand(G, R, generator=g) - 0.5
    return {
        "input_ids": ids,
        "attention_mask": torch.ones_like(ids),
        "responses": resp,
        "response_mask": torch.ones_like(resp),
        "uid": ["p0"] * G,
        "advantages": torch.randn(G, generator=g),
        "old_log_probs": old,
    }


def model_log_probs(folder: Path, ids: torch.Tensor, attention_mask: torch.Tensor, P: int) -> torch.Tensor:
    """[B, R] log-probs of the response tokens under the model folder's own weights (transformers, fp32)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="sdpa")
    positions = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=attention_mask, position_ids=positions).logits
    return logits[:, P - 1 : -1].log_softmax(-1).gather(-1, ids[:, P:, None]).squeeze(-1)


CHECK_VICTIM = 5  # a row of check_batch's second group


def check_batch(folder: Path, vocab: int, P: int, R: int, groups: int = 3, per_group: int = 3, seed: int = 1):
    """The equal-gradients check's batch: `groups` prompts of different lengths (left-padded), each with
    `per_group` responses of different lengths (right-padded), advantages of both signs, and old log-probs within
    0.3 of the model's own. Random old log-probs (the timing batch's) put every ratio near 0, so each row with a
    negative advantage is clipped to a constant and has no gradient: a bug confined to those rows would pass."""
    g = torch.Generator().manual_seed(seed)
    B = groups * per_group
    ids = torch.zeros(B, P + R, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for k in range(groups):
        p = P - k * max(1, P // (2 * groups))
        prompt = torch.randint(1, vocab, (p,), generator=g)
        for j in range(per_group):
            i, r = k * per_group + j, max(1, R - (k + 2 * j) % R)
            ids[i, P - p : P], ids[i, P : P + r] = prompt, torch.randint(1, vocab, (r,), generator=g)
            mask[i, P - p : P + r] = 1
    response_mask = mask[:, P:].clone()
    noise = 0.6 * torch.rand(B, R, generator=g) - 0.3
    old = (model_log_probs(folder, ids, mask, P) + noise) * response_mask
    advantages = torch.randn(B, generator=g).clamp(min=-1.0)
    advantages[CHECK_VICTIM] = -1.5  # the most negative: the row `--break-zorro one-row` breaks
    return {
        "input_ids": ids,
        "attention_mask": mask,
        "responses": ids[:, P:].clone(),
        "response_mask": response_mask,
        "uid": [f"p{i // per_group}" for i in range(B)],
        "advantages": advantages,
        "old_log_probs": old,
    }


# ---------------------------------------------------------------------------------------------
# verl


def init_process_group(device: str) -> None:
    """One rank for verl's FSDP2 and arctic-rl's DeepSpeed (DeepSpeed's init_distributed reuses it)."""
    import torch.distributed as dist

    if dist.is_initialized():
        return
    for d in VERL_DIRS:
        if not (VENV / d).is_dir():
            raise SystemExit(f"{VENV / d} is missing: run scripts/setup_env.sh (it installs verl there)")
        if str(VENV / d) not in sys.path:
            sys.path.insert(0, str(VENV / d))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    if device == "cpu":
        from verl.plugin.platform import set_platform

        if str(ROOT) not in sys.path:
            sys.path.insert(0, str(ROOT))
        from recipes.verl.native.cpu_platform import PlatformCPU

        set_platform(PlatformCPU())  # before verl's engine module reads the device name at import
    else:
        torch.cuda.set_device(0)
    dist.init_process_group("nccl" if device == "cuda" else "gloo")


def actor_config():
    from verl.workers.config import ActorConfig

    # every loss field at verl's default (vanilla policy loss, clip 0.2/0.2, dual clip 3, token-mean,
    # entropy_coeff 0, no KL loss)
    return ActorConfig(strategy="fsdp2", rollout_n=1, ppo_micro_batch_size_per_gpu=1)


def verl_engine(folder: Path, fused: bool = False):
    from verl.trainer.config import CheckpointConfig
    from verl.workers.config import FSDPEngineConfig, FSDPOptimizerConfig, HFModelConfig
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead

    fp32 = {"param_dtype": "fp32", "reduce_dtype": "fp32", "buffer_dtype": "fp32"}
    engine = FSDPEngineWithLMHead(
        HFModelConfig(
            path=str(folder),
            load_tokenizer=False,
            use_remove_padding=False,
            enable_gradient_checkpointing=False,
            override_config={"attn_implementation": "sdpa"},
            use_fused_kernels=fused,
            fused_kernel_options={"impl_backend": "torch"} if fused else {},
        ),
        FSDPEngineConfig(strategy="fsdp2", mixed_precision=fp32, model_dtype="fp32", use_torch_compile=False),
        FSDPOptimizerConfig(lr=LR, weight_decay=WEIGHT_DECAY, clip_grad=GRAD_CLIP, total_training_steps=1),
        CheckpointConfig(),
    )
    from transformers import LlamaForCausalLM

    plain = LlamaForCausalLM.forward
    with head_in_root_unit() if fused else contextlib.nullcontext():
        engine.initialize()
    if fused:
        # verl installs its fused forward on the model's class (verl/models/transformers/monkey_patch.py,
        # patch_forward_with_backends: model.__class__.forward = ...), which would give every other variant's
        # Llama in this process a forward that refuses their inputs: it goes on this engine's module alone.
        fused_forward, LlamaForCausalLM.forward = LlamaForCausalLM.forward, plain
        engine.module.forward = types.MethodType(fused_forward, engine.module)
    engine.mode = "train"
    engine.module.train()
    return engine


@contextlib.contextmanager
def head_in_root_unit():
    """verl's FSDP2 wrapping with the LM head in the root's unit instead of one of its own. verl 0.9.1's fused
    forward multiplies by `self.lm_head.weight` without calling the head (verl/models/transformers/dense_common.py,
    forward_with_torch_backend), and an untied head is wrapped alone (verl/utils/fsdp_utils.py,
    _select_fsdp2_wrap_targets), so its weight is still a sharded DTensor there: "aten.mm.default got mixed
    torch.Tensor and DTensor", on CUDA too (verl issue #5633). Tied heads are in the root's unit in verl's own code;
    this does the same for an untied one, so the root's forward gathers it. Over one rank the sharding is the same
    either way, and the equal-gradients check compares the result with plain verl. (verl's default FSDP1 does not
    run on a CPU: torch's FSDP1 refuses CPU parameters with verl's sync_module_states=True.)"""
    from verl.utils import fsdp_utils

    select = fsdp_utils._select_fsdp2_wrap_targets

    def without_head(model, *args, **kwargs):
        head = model.get_output_embeddings()
        return [m for m in select(model, *args, **kwargs) if m is not head]

    fsdp_utils._select_fsdp2_wrap_targets = without_head
    try:
        yield
    finally:
        fsdp_utils._select_fsdp2_wrap_targets = select


def verl_data(batch: dict, device: str, fused: bool = False):
    """The TensorDict verl's trainer hands update_actor (ray_trainer._update_actor, one mini-batch)."""
    from tensordict import TensorDict
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import left_right_2_no_padding

    B, R = batch["responses"].shape
    mask = batch["attention_mask"]
    td = TensorDict(
        {
            "input_ids": batch["input_ids"],
            "attention_mask": mask,
            "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
            "prompts": batch["input_ids"][:, :-R],
            "responses": batch["responses"],
            "response_mask": batch["response_mask"],
            "old_log_probs": batch["old_log_probs"],
            "advantages": batch["advantages"].unsqueeze(-1).expand(B, R).contiguous(),
        },
        batch_size=[B],
    ).to(device)
    td = left_right_2_no_padding(td)
    tu.assign_non_tensor(
        td,
        temperature=1.0,
        calculate_entropy=False,
        global_batch_size=B,
        use_remove_padding=False,
        use_dynamic_bsz=False,
        micro_batch_size_per_gpu=B,
        max_token_len_per_gpu=None,
        use_fused_kernels=fused,
    )
    return td


def verl_update(engine, batch: dict, step: bool, device: str, fused: bool = False) -> float:
    """verl's train_batch (zero_grad, forward_backward_batch, optimizer_step) and its lr-scheduler step;
    step=False stops after the backward (gradients kept)."""
    from verl.workers.utils.losses import ppo_loss

    loss_fn = partial(ppo_loss, config=actor_config())
    data = verl_data(batch, device, fused)
    if step:
        out = engine.train_batch(data, loss_function=loss_fn)
        engine.lr_scheduler_step()
    else:
        engine.optimizer_zero_grad()
        out = engine.forward_backward_batch(data, loss_fn)
    return float(sum(out["loss"]) if isinstance(out["loss"], list) else out["loss"])


def flash_mask_sdpa(sdpa):
    """transformers' SDPA attention that also takes flash-attn's convention, which PrefixGrouper's calls follow:
    a 2-D key-padding mask [b, kv] and causality aligned bottom-right (query i of nq valid ones sees the
    valid keys up to rank nk - nq + i). flash-attn is CUDA-only; 4-D masks and None pass through unchanged."""

    def attention(module, query, key, value, attention_mask, *args, **kwargs):
        if attention_mask is None or attention_mask.ndim != 2:
            return sdpa(module, query, key, value, attention_mask, *args, **kwargs)
        nq = query.shape[2]
        if nq == key.shape[2] and bool(attention_mask.all()):
            # PrefixGrouper's prefix call, nothing padded: plain causal attention, as flash-attn computes it
            # (SDPA given no mask runs causal and skips the masked half; a 4-D mask would make it score all)
            return sdpa(module, query, key, value, None, *args, **kwargs)
        kmask = attention_mask.bool()  # [b, kv]
        qmask = kmask[:, -nq:]  # flash-attn's _upad_input takes the queries' mask from the mask's tail
        krank, qrank = kmask.cumsum(-1) - 1, qmask.cumsum(-1) - 1
        shift = (kmask.sum(-1) - qmask.sum(-1)).view(-1, 1, 1)
        allowed = kmask[:, None, :] & (krank[:, None, :] <= shift + qrank[:, :, None])
        allowed |= ~qmask[:, :, None] & kmask[:, None, :]  # padding queries: any valid key (no NaN rows)
        return sdpa(module, query, key, value, allowed[:, None], *args, **kwargs)

    return attention


def verl_pg_update(engine, batch: dict, step: bool, device: str) -> float:
    """verl's PrefixGrouper forward on the engine's module, verl's policy loss, the engine's optimizer step."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
    from verl.models.transformers import monkey_patch
    from verl.models.transformers.monkey_patch import apply_prefix_grouper_patch
    from verl.trainer.ppo.core_algos import get_policy_loss_fn
    from verl.trainer.ppo.prefix_grouper_utils import forward_micro_batch_with_prefix_grouper

    if not monkey_patch._PREFIX_GROUPER_PATCHED:
        ALL_ATTENTION_FUNCTIONS["sdpa"] = flash_mask_sdpa(ALL_ATTENTION_FUNCTIONS["sdpa"])
        with contextlib.redirect_stdout(sys.stderr):  # it prints what it patched
            apply_prefix_grouper_patch()
    R = batch["responses"].shape[1]
    mb = {
        "prompts": batch["input_ids"][:, :-R].to(device),
        "responses": batch["responses"].to(device),
        "response_mask": batch["response_mask"].to(device),
        "uid": batch["uid"],
        "pad_token_id": 0,
    }
    engine.optimizer_zero_grad()
    _, log_probs = forward_micro_batch_with_prefix_grouper(
        mb, engine.module, temperature=1.0, calculate_entropy=False, device_name=device, param_dtype=torch.float32
    )
    cfg = actor_config()
    mask = mb["response_mask"].bool()
    cfg.global_batch_info.update(dp_size=1, batch_num_tokens=int(mask.sum()), global_batch_size=mask.shape[0])
    B = mask.shape[0]
    loss, _ = get_policy_loss_fn(cfg.policy_loss.get("loss_mode", "vanilla"))(
        old_log_prob=batch["old_log_probs"].to(device),
        log_prob=log_probs,
        advantages=batch["advantages"].to(device).unsqueeze(-1).expand(B, R),
        response_mask=mask,
        loss_agg_mode=cfg.loss_agg_mode,
        config=cfg,
    )
    loss.backward()
    if step:
        engine.optimizer_step()
        engine.lr_scheduler_step()
    return float(loss.detach())


def verl_weights(engine) -> dict[str, torch.Tensor]:
    from torch.distributed.tensor import DTensor

    out = {}
    for name, p in engine.module.named_parameters():
        w = p.full_tensor() if isinstance(p, DTensor) else p
        out[name] = w.detach().float().cpu().clone()
    return out


def verl_grads(engine) -> dict[str, torch.Tensor]:
    from torch.distributed.tensor import DTensor

    out = {}
    for name, p in engine.module.named_parameters():
        g = p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
        out[name] = g.detach().float().cpu().clone()
    return out


# ---------------------------------------------------------------------------------------------
# arctic-rl


def arctic_worker(folder: Path, zorro: bool, G: int):
    from arctic_rl.config import ArcticRLClientConfig
    from arctic_rl.engines.training import TrainingWorker

    cfg = ArcticRLClientConfig(
        model_name=str(folder),
        seed=0,
        training_config={
            "dtype": "float32",
            "zero_stage": 0,
            "micro_batch_size": G,
            "grad_clip": GRAD_CLIP,
            "optimizer": {"lr": LR, "weight_decay": WEIGHT_DECAY},
            "zorro_train": {"enable": zorro},
        },
    )
    threads = torch.get_num_threads()
    w = TrainingWorker(cfg.to_json(), rank=0, world_size=1)
    w.setup(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]))
    # An engine sets torch's threads to its CPU share (backend.cpu: OMP_NUM_THREADS, else 1); here every variant
    # shares this one process, so the threads are put back and all variants compute with the same count
    torch.set_num_threads(threads)
    return w


def arctic_update(worker, batch: dict, step: bool) -> float:
    worker.zero_grad()
    out = worker.forward_backward([batch], "grpo", {"compute_entropy": False})
    if step:
        worker.optimizer_step()
    return out[0]["loss"]


def arctic_grads(worker) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().float().cpu().clone() for n, p in worker.module.model.named_parameters()}


def arctic_weights(worker) -> dict[str, torch.Tensor]:
    return {n: p.detach().float().cpu().clone() for n, p in worker.module.model.named_parameters()}


def break_zorro(one_row: bool = False) -> None:
    """Shift ZoRRo's response position ids by one (an off-by-one a packing bug would make): every response's, or
    with one_row only that of check_batch's row CHECK_VICTIM, the most negative advantage: a row whose gradient a
    check with random old log-probs never saw. The gradients must then differ from verl's."""
    from arctic_rl.zorro import train

    build = train.build_plan

    def broken(*args, **kwargs):
        plan = build(*args, **kwargs)
        victim = CHECK_VICTIM if one_row else None
        for g in plan.groups:
            start = g.resp_start
            for row, n in zip(g.rows, g.resp_lens):
                if victim is None or row == victim:
                    plan.position_ids[0, start : start + n] += 1
                start += n
        return plan

    train.build_plan = broken


# ---------------------------------------------------------------------------------------------
# the four variants and the check


@dataclass
class Variant:
    name: str
    update: Any  # (batch, step: bool) -> loss
    grads: Any  # () -> {name: grad}
    weights: Any  # () -> {name: weight}


def variants(folder: Path, rows: int, device: str, only: tuple[str, ...] = VARIANTS) -> dict[str, Variant]:
    """The variants, each updating on the batch it is given (`rows` at most: one micro-batch)."""
    init_process_group(device)
    out: dict[str, Variant] = {}
    # verl and verl+pg each get an engine: the check compares one optimizer step of each from the same weights
    verls = (("verl", verl_update), ("verl+fused", partial(verl_update, fused=True)), ("verl+pg", verl_pg_update))
    for name, update in verls:
        if name in only:
            engine = verl_engine(folder, fused=name == "verl+fused")
            out[name] = Variant(
                name, partial(update, engine, device=device), partial(verl_grads, engine), partial(verl_weights, engine)
            )
    for name, zorro in (("arctic", False), ("arctic+zorro", True)):
        if name in only:
            w = arctic_worker(folder, zorro, rows)
            out[name] = Variant(name, partial(arctic_update, w), partial(arctic_grads, w), partial(arctic_weights, w))
    return out


def _worst(got: dict[str, torch.Tensor], ref: dict[str, torch.Tensor], name: str) -> tuple[str, float]:
    if set(got) != set(ref):
        raise RuntimeError(f"{name}: parameter names differ from verl's: {sorted(set(got) ^ set(ref))[:4]}")
    rel = {k: float((got[k] - ref[k]).norm() / ref[k].norm().clamp(min=1e-30)) for k in ref}
    worst = max(rel, key=rel.__getitem__)
    return worst, rel[worst]


def check_equal(vs: dict[str, Variant], batch: dict, grad_tol: float, step_tol: float) -> tuple[bool, list[dict]]:
    """Each variant against verl on `batch` (check_batch): the loss and the gradients before any optimizer step
    (within grad_tol), then the change one optimizer step makes to the weights (AdamW, gradient clipping, weight
    decay; within step_tol: AdamW's first step is lr * g / (|g| + eps) per entry, so an entry whose gradient is
    near eps carries its float32 rounding difference into the step about |g| / eps times larger)."""
    results = {}
    for name, v in vs.items():
        loss = v.update(batch, step=False)
        results[name] = (loss, v.grads())
    for name, v in vs.items():
        before = v.weights()
        v.update(batch, step=True)
        after = v.weights()
        results[name] += ({k: after[k] - before[k] for k in after},)
    ref_loss, ref, ref_delta = results["verl"]
    rows, ok = [], True
    for name, (loss, grads, delta) in results.items():
        worst, rel = _worst(grads, ref, name)
        worst_step, rel_step = _worst(delta, ref_delta, name)
        passed = rel <= grad_tol and rel_step <= step_tol and abs(loss - ref_loss) <= grad_tol * max(1.0, abs(ref_loss))
        ok &= passed
        rows.append(
            {
                "variant": name,
                "loss": f"{loss:.7f}",
                "|loss - verl|": f"{abs(loss - ref_loss):.1e}",
                "max grad rel diff": f"{rel:.1e}",
                "worst parameter": worst,
                "max update rel diff": f"{rel_step:.1e}",
                "equal": "yes" if passed else "NO",
            }
        )
    return ok, rows


def print_rows(rows: list[dict]) -> None:
    cols = list(rows[0])
    width = {c: max(len(c), *(len(str(r[c])) for r in rows)) for c in cols}
    print("  " + "  ".join(c.ljust(width[c]) for c in cols))
    for r in rows:
        print("  " + "  ".join(str(r[c]).ljust(width[c]) for c in cols))


# ---------------------------------------------------------------------------------------------
# memory: one update in a fresh process


def memory_worker(args, variant: str) -> None:
    folder, batch = Path(args.folder), make_batch(**json.loads(args.batch_spec))
    device = args.device
    v = variants(folder, batch["responses"].shape[0], device, only=(variant,))[variant]
    gc.collect()
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        v.update(batch, step=True)
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
    else:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS (Linux >= 4.0)
        base = _status_bytes("VmRSS")
        v.update(batch, step=True)
        peak = max(0, _status_bytes("VmHWM") - base)
    print(json.dumps({"peak_bytes": peak}))


def peak_memory(args, folder: Path, spec: dict, names) -> dict[str, int]:
    """One fresh process per variant, one at a time (a process's own high-water mark does not depend on the
    others', but five engines of the demo model at once do not fit in 24 GiB; on CUDA they would share the
    allocator's device)."""
    out = {}
    for v in names:
        cmd = [sys.executable, __file__, "--memory-worker", v, "--folder", str(folder), "--device", args.device]
        cmd += ["--batch-spec", json.dumps(spec)] + (["--threads", str(args.threads)] if args.threads else [])
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode:
            raise RuntimeError(f"memory worker for {v} failed:\n{p.stderr[-3000:]}")
        out[v] = json.loads(p.stdout.strip().splitlines()[-1])["peak_bytes"]
    return out


# ---------------------------------------------------------------------------------------------
# timing summaries


def quartiles(xs: list[float]) -> tuple[float, float]:
    """The 25th and 75th percentiles (statistics.quantiles' inclusive method: within the data's range)."""
    if len(xs) < 2:
        return xs[0], xs[0]
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return q[0], q[2]


def speedup_iqr(base: list[float], other: list[float]) -> str:
    """The interquartile range of the per-repetition ratios base/other (the repetitions are interleaved: the i-th
    of each ran side by side in time, so the ratio of a pair sees the same machine load)."""
    lo, hi = quartiles([b / o for b, o in zip(base, other)])
    return f"{lo:.2f}-{hi:.2f}x"


def decomposition(med: dict[str, float], wall: dict[str, list[float]], fl: dict) -> list[str]:
    """Where the speedup over verl comes from: the engine on the same padded work (arctic vs verl, and verl's own
    fused LM head), then ZoRRo alone (arctic+zorro vs arctic, against its FLOP limit)."""
    out = []
    if "arctic" in med:
        out.append(
            f"engine, same padded work: arctic-rl without ZoRRo {med['verl'] / med['arctic']:.2f}x verl "
            f"(pairs' IQR {speedup_iqr(wall['verl'], wall['arctic'])}); verl's padded path runs the LM head and a "
            "log-softmax over every position of every row (prompt and padding too) and keeps the [rows, positions, "
            "vocab] logits for the backward; arctic-rl's runs it over the valid response tokens only, in chunks "
            "(arctic_rl/logprob_head.py)"
        )
    if "verl+fused" in med:
        out.append(
            f"verl's own fused LM head (torch backend): {med['verl'] / med['verl+fused']:.2f}x verl "
            f"(pairs' IQR {speedup_iqr(wall['verl'], wall['verl+fused'])})"
        )
    if {"arctic", "arctic+zorro"} <= set(med):
        out.append(
            f"ZoRRo alone: arctic-rl+ZoRRo {med['arctic'] / med['arctic+zorro']:.2f}x arctic-rl without it "
            f"(pairs' IQR {speedup_iqr(wall['arctic'], wall['arctic+zorro'])}); its FLOP limit over the "
            f"response-only head is {fl['limit_response_head']:.2f}x"
        )
    return out


def log_mlflow(workload: str, model: str, P: int, R: int, G: int, device: str, times: dict[str, list[float]]) -> None:
    """One MLflow run per variant (experiment "vs_verl"), with the standard tags, so that `arctic-rl compare`
    shows them beside the rest: timing_s/update_actor (= timing_s/step) per update, step 0 the warm-up
    (which compare leaves out)."""
    from arctic_rl import tracking as t

    for v, seconds in times.items():
        framework, backend = RUN_TAGS[v]
        tags = {
            t.TAG_FRAMEWORK: framework,
            t.TAG_BACKEND: backend,
            t.TAG_RECIPE: f"vs_verl-{workload}",
            t.TAG_MODEL: model,
            t.TAG_NODES: 1,
            t.TAG_GPUS: int(device == "cuda"),
            t.TAG_PROMPTS_PER_STEP: 1,
            t.TAG_N: G,
            t.TAG_MAX_PROMPT_LENGTH: P,
            t.TAG_MAX_RESPONSE_LENGTH: R,
            "variant": v,
        }
        with t.Tracker.start("vs_verl", run_name=f"{workload}/{v}", tags=tags) as tracker:
            for step, s in enumerate(seconds):
                tracker.log_metrics({t.TIMING_UPDATE_ACTOR: s, t.TIMING_STEP: s}, step)


def run_workload(args, name: str, report: Report | None) -> bool:
    w = {**WORKLOADS[name], **(QUICK if args.quick else {})}
    P, R, G, model = w["prompt"], w["response"], w["group"], w["model"]
    folder = model_folder(model, args.out, P + R + 8)
    spec = dict(vocab=MODELS[model]["vocab_size"], P=P, R=R, G=G)
    batch = make_batch(**spec)
    check = check_batch(folder, spec["vocab"], P, R)
    only = args.variants or w.get("variants", VARIANTS)
    vs = variants(folder, max(G, check["responses"].shape[0]), args.device, only=only)
    c = MODELS[model]
    title = (
        f"{name}: model {model} (hidden {c['hidden_size']}, {c['num_hidden_layers']} layers, "
        f"{c['num_attention_heads']}/{c['num_key_value_heads']} heads, MLP {c['intermediate_size']}, "
        f"vocab {c['vocab_size']}), prompt {P}, response {R}, G {G}"
    )
    print(f"\n{title}")
    ok, rows = check_equal(vs, check, args.grad_tol, args.step_tol)
    print(
        f"equal loss, gradients and optimizer update (vs verl, tolerance {args.grad_tol:g}, update {args.step_tol:g}; "
        f"3 prompt groups, ragged lengths, old log-probs within 0.3 of the model's): {'passed' if ok else 'FAILED'}"
    )
    print_rows(rows)
    if report is not None:
        for r in rows:
            report.add(f"{name}: equal loss, gradients and optimizer update (before timing)", **r)
    if not ok or args.check_only:
        return ok

    print(f"timing with {torch.get_num_threads()} torch threads")
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    wall = {v: [] for v in vs}
    cpu = {v: [] for v in vs}
    warm = {}
    for v in vs.values():
        sync()
        t0 = time.perf_counter()
        v.update(batch, step=True)
        sync()
        warm[v.name] = time.perf_counter() - t0
    for _ in range(args.reps):
        for v in vs.values():  # interleaved: load from other processes hits all alike
            sync()
            t0, c0 = time.perf_counter(), time.process_time()
            v.update(batch, step=True)
            sync()
            wall[v.name].append(time.perf_counter() - t0)
            cpu[v.name].append(time.process_time() - c0)
    med = {v: statistics.median(t) for v, t in wall.items()}
    med_cpu = {v: statistics.median(t) for v, t in cpu.items()}
    if not args.no_mlflow:
        log_mlflow(name, model, P, R, G, args.device, {v: [warm[v], *wall[v]] for v in vs})
    names = list(vs)
    vs.clear()  # the engines' weights and optimizer states (gigabytes each on demo) go before the memory runs
    gc.collect()
    mem = {} if args.no_memory else peak_memory(args, folder, spec, names)
    fl = flops(model, P, R, G)
    print(
        f"FLOP limit {fl['limit']:.2f}x (padded batch / ZoRRo FLOPs; {fl['limit_head_all']:.2f}x with "
        "the LM head over prompt tokens too, as PrefixGrouper runs it)"
    )
    hdr = ["variant", "wall s", "IQR", "cpu s", "vs verl", "vs verl+pg", "peak MiB"]
    print("  " + "".join(f"{h:>14s}" for h in hdr))
    for v in names:
        sp, sp_pg = med["verl"] / med[v], med.get("verl+pg", float("nan")) / med[v]
        lo, hi = quartiles(wall[v])
        peak = mem[v] / 2**20 if mem else float("nan")
        print(
            f"  {v:>14s}{med[v]:14.3f}{f'{lo:.3f}-{hi:.3f}':>14s}{med_cpu[v]:14.3f}{sp:13.2f}x{sp_pg:13.2f}x"
            f"{peak:14.0f}"
        )
        if report is not None:
            report.add(
                f"{name}: one GRPO update (median and IQR over {args.reps} interleaved)",
                variant=v,
                **{"wall s": med[v], "wall IQR": f"{lo:.3g}-{hi:.3g}", "cpu s": med_cpu[v]},
                **{"vs verl": f"{sp:.2f}x", "vs verl IQR": speedup_iqr(wall["verl"], wall[v])},
                **{"vs verl+pg": f"{sp_pg:.2f}x", "FLOP limit": f"{fl['limit']:.2f}x"},
                **{"peak MiB": peak if mem else "", "memory vs verl": f"{mem[v] / mem['verl']:.2f}" if mem else ""},
            )
    for line in decomposition(med, wall, fl):
        print(line)
        if report is not None:
            report.note(f"**{name}**, {line}")
    if {"verl+pg", "arctic+zorro"} <= set(med):
        z, zc = med["arctic+zorro"], med_cpu["arctic+zorro"]
        summary = (
            f"arctic-rl+ZoRRo: {med['verl'] / z:.2f}x verl (target >= 5x), {med['verl+pg'] / z:.2f}x "
            f"verl+PrefixGrouper (target >= 3x) in median wall time; {med_cpu['verl'] / zc:.2f}x and "
            f"{med_cpu['verl+pg'] / zc:.2f}x in process CPU time; FLOP limit {fl['limit']:.2f}x over verl, "
            f"{fl['limit'] / fl['limit_head_all']:.2f}x over verl+PrefixGrouper (which also dedups the prompt; "
            "what it computes more is the LM head over prompt tokens)"
        )
        print(summary)
        if report is not None:
            report.note(f"**{name}**: {summary}.")
    return ok


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workloads", default="w1,demo", help=f"comma-separated: {', '.join(WORKLOADS)}")
    ap.add_argument(
        "--reps", type=int, default=7, help="timed updates per variant (interleaved; median and IQR reported)"
    )
    ap.add_argument("--quick", action="store_true", help=f"small sizes ({QUICK}), for development")
    ap.add_argument("--check-only", action="store_true", help="the equal-gradients check only; exit 1 if it fails")
    ap.add_argument(
        "--variants",
        type=lambda s: tuple(s.split(",")),
        default=None,
        help=f"comma-separated subset of {','.join(VARIANTS)} (verl always included: the reference); default: "
        "all, but for a workload that names its own",
    )
    ap.add_argument(
        "--break-zorro",
        nargs="?",
        const="all",
        choices=("all", "one-row"),
        help="perturb ZoRRo: every response's positions +1, or one row's (the most negative advantage)",
    )
    ap.add_argument("--grad-tol", type=float, default=1e-4, help="max relative gradient / loss difference")
    ap.add_argument("--step-tol", type=float, default=1e-3, help="max relative difference of one optimizer step")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--no-memory", action="store_true")
    ap.add_argument(
        "--no-mlflow", action="store_true", help="log no MLflow runs (default: MLFLOW_TRACKING_URI or runs/mlflow.db)"
    )
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--out", type=Path, default=Path("outputs/bench_vs_verl"), help="model folders")
    ap.add_argument("--memory-worker", metavar="VARIANT", choices=VARIANTS, help=argparse.SUPPRESS)
    ap.add_argument("--folder", help=argparse.SUPPRESS)
    ap.add_argument("--batch-spec", help=argparse.SUPPRESS)
    add_report_args(ap)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.break_zorro:
        break_zorro(one_row=args.break_zorro == "one-row")
    if args.memory_worker:
        memory_worker(args, args.memory_worker)
        return
    unknown = set(args.workloads.split(",")) - set(WORKLOADS)
    if unknown:
        raise SystemExit(f"--workloads: unknown {sorted(unknown)}; known: {sorted(WORKLOADS)}")
    unknown = set(args.variants or VARIANTS) - set(VARIANTS)
    if unknown or "verl" not in (args.variants or VARIANTS):
        raise SystemExit(f"--variants {','.join(args.variants)}: expected verl and any of {','.join(VARIANTS)}")
    args.out.mkdir(parents=True, exist_ok=True)
    cuda = args.device == "cuda"
    report = None
    if not args.check_only:
        report = Report.start(
            "vs_verl_cuda" if cuda else "vs_verl",
            f"verl 0.9.1's actor update vs arctic-rl's engine: one GRPO update, fp32 on {args.device}",
            args,
            device=args.device,
            bandwidth=not cuda,
        )
        report.note(__doc__.split("\n\n", 1)[1].split("\n    python")[0])
    where = torch.cuda.get_device_name() if cuda else f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
    print(f"verl vs arctic-rl, one GRPO update ({where}, {torch.get_num_threads()} threads, torch {torch.__version__})")
    print(LEFT_OUT)
    ok = all([run_workload(args, name, report) for name in args.workloads.split(",")])
    if not ok:
        print("equal-gradients check FAILED: the variants do not compute the same update; nothing timed")
        sys.exit(1)
    if report is not None:
        report.write()


if __name__ == "__main__":
    main()
