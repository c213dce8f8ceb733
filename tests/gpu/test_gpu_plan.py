"""`arctic-rl plan`'s memory model against torch.cuda.max_memory_allocated (scripts/gpu_check.sh; skipped without
CUDA): one DeepSpeed rank of the training engine (ZeRO-1, ZeRO-3, LoRA) and a frozen reference, bf16, on a
77M-parameter random Llama. Each worker marks its baseline before it loads weights (arctic_rl/engines/memory.py
resets torch's peak counter there); after two optimizer steps (or a reference forward) its peak must agree
within TOLERANCE with arctic_rl.plan.engine_memory on Device.gpu(): the same function `arctic-rl plan` sums
per GPU, less its CUDA context (torch's allocator does not count it). The CPU counterpart, on whole
deployments and peak RSS, is tests/e2e/test_plan_memory.py."""

from __future__ import annotations

import socket

import pytest
import torch

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="GPU checks (scripts/gpu_check.sh)"),
]
TOLERANCE = 0.25
SHAPE = {"hidden": 1024, "layers": 8, "heads": 16, "kv_heads": 8}  # as tests/e2e/test_plan_memory.py
CASES = {
    "zero1": ({"zero_stage": 1}, True),
    "zero3": ({"zero_stage": 3}, True),
    "lora": ({"zero_stage": 1, "lora": {"rank": 16}}, True),
    "reference": ({"zero_stage": 1}, False),
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from tiny_models import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("models") / "plan-77m", "llama", **SHAPE)


@pytest.mark.parametrize("case", list(CASES))
def test_plan_predicts_cuda_max_memory_allocated(model, case):
    from e2e.test_training import fixed_batch
    from transformers import AutoConfig

    from arctic_rl.config import ArcticRLClientConfig
    from arctic_rl.engines.training import TrainingWorker
    from arctic_rl.plan import CUDA_CONTEXT, Device, engine_memory, model_shape

    over, trainable = CASES[case]
    tc = {"dtype": "bfloat16", "micro_batch_size": 4, "optimizer": {"lr": 1e-4}} | over
    cfg = ArcticRLClientConfig(model_name=str(model), seed=0, training_config=tc)
    w = TrainingWorker(cfg.to_json(), rank=0, world_size=1, trainable=trainable)
    w.setup("127.0.0.1", _free_port())
    batch = fixed_batch()
    if trainable:
        for _ in range(2):
            w.forward_backward([batch], "sft", {})
            w.optimizer_step()
    else:
        w.log_probs([batch], {})
    assert w.memory is not None
    measured = w.memory.report()["cuda_max_allocated"]
    shape = model_shape(AutoConfig.from_pretrained(model), str(model))
    tokens = min(cfg.training_config.micro_batch_size, batch["input_ids"].shape[0]) * batch["input_ids"].shape[1]
    parts = engine_memory(shape, cfg, tokens, Device.gpu())["training" if trainable else "reference"]
    plan = sum(parts.values()) - CUDA_CONTEXT
    print(f"{case}: torch.cuda.max_memory_allocated {measured / 2**20:.0f} MiB, plan {plan / 2**20:.0f} MiB", parts)
    assert abs(measured / plan - 1) <= TOLERANCE, (case, measured, plan, parts)
    del w
    torch.cuda.empty_cache()
