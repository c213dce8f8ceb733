"""DeepSpeed training through the client: ZeRO-1, 2 and 3 train the tiny model; 2 data-parallel workers
match 1 on the same global batch; a checkpoint restores log-probs and the next optimizer step exactly."""
from __future__ import annotations

import pytest
import torch

from arctic_rl import ArcticRLClientConfig, create_arctic_rl_client

pytestmark = pytest.mark.slow
STEPS = 3
DP_TOL = 2e-4  # fp32: 2 ranks sum gradients in a different order than 1


def fixed_batch() -> dict:
    """8 rows in 4 prompt groups of 2, left-padded prompts, ragged responses."""
    g = torch.Generator().manual_seed(0)
    P, R = 10, 8
    ids = torch.randint(3, 300, (8, P + R), generator=g)
    attn = torch.ones_like(ids)
    for i, pad in enumerate([0, 0, 3, 3, 1, 1, 5, 5]):  # the two rows of a group share their prompt
        attn[i, :pad] = 0
        ids[i, :pad] = 0
        ids[i, pad:P] = ids[i - i % 2, pad:P]
    for i, r in enumerate([8, 5, 8, 2, 6, 8, 3, 7]):
        attn[i, P + r:] = 0
        ids[i, P + r:] = 0
    return {"input_ids": ids, "attention_mask": attn, "responses": ids[:, P:].clone(),
            "response_mask": attn[:, P:].clone(), "uid": [0, 0, 1, 1, 2, 2, 3, 3]}


def start(model, zero_stage: int, workers: int, checkpoint_root=None):
    return create_arctic_rl_client(ArcticRLClientConfig(
        model_name=str(model), training_gpus=workers, seed=0,
        training_config={"dtype": "float32", "zero_stage": zero_stage, "optimizer": {"lr": 1e-3}, "micro_batch_size": 4},
        vllm_config={"max_seq_len": 256, "dtype": "float32"},
        server={"checkpoint_root": str(checkpoint_root)} if checkpoint_root else {}))


def train(client, batch, steps=STEPS) -> list[float]:
    losses = []
    for _ in range(steps):
        losses.append(client.forward_backward(batch, "sft")["loss"])
        client.optimizer_step()
    return losses


@pytest.fixture(scope="module")
def reference_run(ray_cluster, tiny_llama, tmp_path_factory):
    """ZeRO-1, one worker: losses, final log-probs, and a checkpoint after step 2 with what step 3 gave."""
    batch = fixed_batch()
    ckpt = tmp_path_factory.mktemp("ckpt") / "step2"
    c = start(tiny_llama, 1, 1, checkpoint_root=ckpt.parent)  # the server saves under its checkpoint_root only
    try:
        losses = train(c, batch, STEPS - 1)
        c.save_checkpoint(str(ckpt))
        lp_at_ckpt = c.log_probs(batch)["log_probs"]
        m3 = c.forward_backward(batch, "sft")
        s3 = c.optimizer_step()
        losses.append(m3["loss"])
        final = c.log_probs(batch)["log_probs"]
    finally:
        c.shutdown()
    return {"batch": batch, "losses": losses, "final": final, "ckpt": ckpt, "lp_at_ckpt": lp_at_ckpt,
            "loss3": m3["loss"], "grad_norm3": s3["grad_norm"]}


def test_zero1_trains(reference_run):
    losses = reference_run["losses"]
    assert all(b < a for a, b in zip(losses, losses[1:])), losses


@pytest.mark.parametrize("zero_stage", [2, 3])
def test_zero_stage_with_two_workers_matches_one(reference_run, tiny_llama, zero_stage):
    c = start(tiny_llama, zero_stage, 2)
    try:
        losses = train(c, reference_run["batch"])
        final = c.log_probs(reference_run["batch"])["log_probs"]
    finally:
        c.shutdown()
    assert all(b < a for a, b in zip(losses, losses[1:])), losses
    assert losses == pytest.approx(reference_run["losses"], abs=DP_TOL)
    mask = reference_run["batch"]["response_mask"].bool()
    assert (final - reference_run["final"])[mask].abs().max() < DP_TOL


def test_checkpoint_restores_log_probs_and_next_step(reference_run, tiny_llama):
    c = start(tiny_llama, 1, 1, checkpoint_root=reference_run["ckpt"].parent)
    try:
        c.load_checkpoint(str(reference_run["ckpt"]))
        batch = reference_run["batch"]
        mask = batch["response_mask"].bool()
        assert torch.equal(c.log_probs(batch)["log_probs"][mask], reference_run["lp_at_ckpt"][mask])
        m3 = c.forward_backward(batch, "sft")
        s3 = c.optimizer_step()
        assert m3["loss"] == reference_run["loss3"]
        assert s3["grad_norm"] == reference_run["grad_norm3"] and s3["step"] == STEPS
        assert torch.equal(c.log_probs(batch)["log_probs"][mask], reference_run["final"][mask])
    finally:
        c.shutdown()
