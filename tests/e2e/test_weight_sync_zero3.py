"""Streaming weight sync under ZeRO-3 over two trainer ranks, on a real deployment (Ray, DeepSpeed, vLLM-CPU):
both ranks gather each bucket in lockstep, 1 MiB buckets split the tiny model into several, and after one
optimizer step the sampler is caught stale, then holds the trainer's weights exactly once synced."""

from __future__ import annotations

import pytest
import ray
import torch

from arctic_rl import ArcticRLClientConfig, create_arctic_rl_client
from arctic_rl.batch import from_samples
from arctic_rl.errors import WeightSyncError

pytestmark = pytest.mark.slow
N = 4


def test_zero3_over_two_ranks_syncs_in_several_buckets(ray_cluster, tiny_llama):
    c = create_arctic_rl_client(
        ArcticRLClientConfig(
            model_name=str(tiny_llama),
            training_gpus=2,
            training_config={"dtype": "float32", "zero_stage": 3, "optimizer": {"lr": 1e-3}, "micro_batch_size": 4},
            vllm_config={"max_seq_len": 256, "sync_bucket_mb": 1},
        )
    )
    check = c._t.handle.check_weights
    try:
        samples = c.generate(["the quick brown fox", "select count(*)"], {"n": N, "max_tokens": 8, "seed": 0})
        batch = from_samples(samples, [i // N for i in range(len(samples))])
        batch["old_log_probs"] = c.log_probs(batch)["log_probs"]
        batch["advantages"] = torch.tensor([1.0, -1.0] * (len(samples) // 2))
        c.forward_backward(batch, "grpo", {})
        c.optimizer_step()
        with pytest.raises(ray.exceptions.RayTaskError) as info:
            ray.get(check.remote())
        assert isinstance(info.value.cause, WeightSyncError)
        assert "first stale tensor model." in str(info.value.cause)
        sync = c.sync_weights()
        assert sync["buckets"] > 1 and sync["checked_tensors"] > 0
        assert sync["probe_max_abs_logprob_diff"] < 1e-3
        assert ray.get(check.remote())["checked_tensors"] == sync["checked_tensors"]
    finally:
        c.shutdown()
