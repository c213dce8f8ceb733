"""Under ZeRO-3 over several ranks each trainer rank loads only its partitions (engines/zero3_load.py): its
memory peak while loading (the weights' load, before DeepSpeed's engine: TrainingWorker.load_peak) is about its
share of the model, not the whole model in fp32 as before (what made
Qwen3-235B's plan refuse the start-up host memory). Two trainer ranks in two processes (gloo), a random
Llama of about 80M parameters (16 layers: one layer gathered is a small part): the same two ranks under ZeRO-2 (which loads the whole model on every rank) are
the comparison. The loaded weights are the checkpoint's: tests/e2e/test_moe.py's ZeRO-3 trainer computes the
sampler's log-probs, and here every rank's gathered parameters equal the checkpoint."""

from __future__ import annotations

import multiprocessing as mp
import socket

import pytest
import torch
from tiny_models import make_tiny_model

pytestmark = pytest.mark.slow


def _rank(cfg_json: str, rank: int, port: int, out) -> None:
    import deepspeed
    from safetensors.torch import load_file

    from arctic_rl.config import ArcticRLClientConfig
    from arctic_rl.engines.training import TrainingWorker

    w = TrainingWorker(cfg_json, rank=rank, world_size=2)
    w.setup("127.0.0.1", port)
    ckpt = load_file(f"{ArcticRLClientConfig.from_json(cfg_json).model_name}/model.safetensors")
    equal = True
    for name, p in w.module.model.named_parameters():
        with deepspeed.zero.GatheredParameters([p]) if hasattr(p, "ds_id") else torch.no_grad():
            equal = equal and torch.equal(p.detach().float(), ckpt[name].float())
    out.put((rank, w.load_peak, equal))


def load_peaks(model, zero_stage: int) -> list[tuple[int, int, bool]]:
    from arctic_rl.config import ArcticRLClientConfig

    cfg = ArcticRLClientConfig(model_name=str(model), training_config={"dtype": "float32", "zero_stage": zero_stage})
    with socket.socket() as s:
        s.bind(("", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(cfg.to_json(), r, port, out)) for r in range(2)]
    for p in procs:
        p.start()
    results = sorted(out.get(timeout=600) for _ in procs)
    for p in procs:
        p.join(timeout=60)
    return results


def test_a_zero3_rank_loads_about_its_share(tmp_path):
    # saved in bf16, as hub checkpoints are: a whole-model load makes the fp32 copy the plan counts (an fp32 file
    # would be mapped, not copied, until DeepSpeed reads it)
    model = make_tiny_model(
        tmp_path / "llama", "llama", hidden=768, layers=16, heads=12, kv_heads=4, dtype=torch.bfloat16
    )
    from transformers import AutoConfig

    c = AutoConfig.from_pretrained(model)
    params = sum(
        n
        for n in (
            2 * c.vocab_size * c.hidden_size,
            c.num_hidden_layers
            * (2 * c.hidden_size**2 + 2 * c.hidden_size * 256 + 3 * c.hidden_size * c.intermediate_size),
        )
    )
    whole = 4 * params  # the fp32 model every rank held before
    full = load_peaks(model, 2)
    parts = load_peaks(model, 3)
    assert all(equal for _, _, equal in full + parts)  # every rank computes with the checkpoint's weights
    assert all(peak >= 0.9 * whole for _, peak, _ in full), (full, whole)
    # its half of the model, one decoder layer gathered (rank 0: also read), and the allocator's slack
    assert all(peak < 0.8 * whole for _, peak, _ in parts), (parts, whole)
