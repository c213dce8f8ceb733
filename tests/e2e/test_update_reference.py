"""update_reference (reference := current policy) under each ZeRO stage, on a real deployment: after one
optimizer step and the call, the reference's log-probs equal the policy's."""

from __future__ import annotations

import pytest
import torch

from arctic_rl import ArcticRLClientConfig, create_arctic_rl_client
from arctic_rl.batch import from_samples

pytestmark = pytest.mark.slow
N = 4


@pytest.mark.parametrize("zero_stage", [1, 2, 3])
def test_reference_equals_the_policy_after_update_reference(ray_cluster, tiny_llama, zero_stage):
    c = create_arctic_rl_client(
        ArcticRLClientConfig(
            model_name=str(tiny_llama),
            training_config={
                "dtype": "float32",
                "zero_stage": zero_stage,
                "optimizer": {"lr": 1e-3},
                "micro_batch_size": 4,
            },
            vllm_config={"max_seq_len": 256},
        )
    )
    try:
        samples = c.generate(["the quick brown fox", "select count(*)"], {"n": N, "max_tokens": 8, "seed": 0})
        batch = from_samples(samples, [i // N for i in range(len(samples))])
        mask = batch["response_mask"].bool()
        batch["old_log_probs"] = c.log_probs(batch)["log_probs"]
        batch["advantages"] = torch.tensor([1.0, -1.0] * (len(samples) // 2))
        c.forward_backward(batch, "grpo", {})
        c.optimizer_step()
        policy = c.log_probs(batch)["log_probs"]
        assert (policy - c.log_probs(batch, reference=True)["log_probs"])[mask].abs().max() > 1e-3  # it moved
        c.update_reference()
        reference = c.log_probs(batch, reference=True)["log_probs"]
        assert (policy - reference)[mask].abs().max() < 1e-5
    finally:
        c.shutdown()
