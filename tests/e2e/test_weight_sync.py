"""Sampler and trainer agree, on a real deployment (Ray, DeepSpeed, vLLM-CPU): the weight sync check compares
every tensor the sampler holds exactly, so a sampler that missed one optimizer step at lr 1e-6 is caught and
named, and a float32 trainer with the default sampler dtype syncs cleanly even when the checkpoint is bfloat16;
a float32 trainer with a bfloat16 sampler (fp32 master weights, bf16 rollouts) syncs, its check comparing the
trainer's weights as bfloat16 represents them, and a missed step is still named, and the loop's mismatch metrics
(rollout_corr/k3_kl) show its rounding as a KL well above a float32 sampler's; the sampler's log-probs are those
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
from arctic_rl.losses.mismatch import mismatch_metrics

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


def _sampler_trainer_mismatch(c, seed: int) -> dict[str, float]:
    """The loop's rollout_corr/ metrics (arctic_rl.losses.mismatch) of a few fresh samples: the sampler's log-probs
    against the trainer's (float32) for the same tokens, with the two holding the same weights."""
    c.sync_weights()
    samples = c.generate(["the quick brown fox", "how many albums"], {"n": N, "max_tokens": 12, "seed": seed})
    batch = from_samples(samples, [i // N for i in range(len(samples))])
    trainer = c.log_probs(batch)["log_probs"]
    return mismatch_metrics(trainer, batch["rollout_log_probs"], batch["response_mask"])


def test_a_bfloat16_sampler_shows_a_larger_mismatch_kl_than_a_float32_one(client, bf16_sampler_client):
    # Both module fixtures stay alive until the module ends, so this test adds no deployment: `client` samples in
    # float32 (the default sampler dtype follows the float32 trainer), `bf16_sampler_client` in bfloat16. Their
    # models are the same random one (make_tiny_model's seed 0; one checkpoint saved in bfloat16) after a few
    # different small steps, which does not matter at this scale: a float32 sampler differs from the float32
    # trainer only by summation order (log-prob gaps ~1e-6; the temperature test above: < 1e-4 everywhere), a
    # bfloat16 one by bfloat16's rounding of weights and activations (8 mantissa bits: gaps ~1e-3 to 1e-2), so k3
    # (~ the mean of gap^2 / 2) differs by several orders of magnitude; 10x leaves room for any seed. k3, not
    # verl's signed `kl` (a mean of gaps whose sign is noise at this size): k3 is >= 0 per token.
    fp32 = _sampler_trainer_mismatch(client, seed=11)
    bf16 = _sampler_trainer_mismatch(bf16_sampler_client, seed=11)
    assert bf16["rollout_corr/k3_kl"] > 10 * fp32["rollout_corr/k3_kl"], (fp32, bf16)
    assert bf16["rollout_corr/log_ppl_abs_diff"] > 10 * fp32["rollout_corr/log_ppl_abs_diff"], (fp32, bf16)
    assert abs(fp32["rollout_corr/ratio_max"] - 1) < 1e-3 and fp32["rollout_corr/staleness/frac_0"] == 1.0, fp32


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
