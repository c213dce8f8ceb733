"""Sleep and wake on CUDA (scripts/gpu_check.sh; skipped without CUDA): one DeepSpeed rank of the training
engine on a small model, and the reference worker beside it. After sleep, torch.cuda.memory_allocated is
down by at least 90% of what the worker held; after wake every parameter, gradient and optimizer-state
tensor is bit-identical (sha256) to before, and training goes on. The CPU counterpart is tests/e2e/test_sleep.py
(there sleep would free nothing, so it is a no-op that moves nothing and says so; here the same code path moves)."""

from __future__ import annotations

import socket

import pytest
import torch

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="GPU checks (scripts/gpu_check.sh)"),
]
MIN_FREED = 0.9


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def small_model(tmp_path_factory):
    from tiny_models import make_tiny_model

    # ~30M parameters: large enough that DeepSpeed's fixed allocations do not hide what sleep moves
    return make_tiny_model(tmp_path_factory.mktemp("models") / "small", "llama", hidden=512, layers=6, heads=8)


@pytest.fixture(scope="module")
def port():
    return _free_port()


def _worker(model, port: int, zero_stage: int, trainable: bool = True):
    from arctic_rl.config import ArcticRLClientConfig
    from arctic_rl.engines.training import TrainingWorker

    cfg = ArcticRLClientConfig(
        model_name=str(model),
        seed=0,
        training_config={"dtype": "bfloat16", "zero_stage": zero_stage, "optimizer": {"lr": 1e-4}},
    )
    w = TrainingWorker(cfg.to_json(), rank=0, world_size=1, trainable=trainable)
    w.setup("127.0.0.1", port)
    return w


def _held(before_build: int) -> int:
    torch.cuda.synchronize()
    return torch.cuda.memory_allocated() - before_build


@pytest.mark.parametrize("zero_stage", [0, 1, 2, 3])
def test_trainer_sleep_frees_the_device_and_wake_is_bit_exact(small_model, port, zero_stage):
    from e2e.test_training import fixed_batch

    batch = fixed_batch()
    base = torch.cuda.memory_allocated()
    w = _worker(small_model, port, zero_stage)
    w.forward_backward([batch], "sft", {})
    w.optimizer_step()
    w.forward_backward([batch], "sft", {})  # gradients pending across the sleep
    digest, held = w.state_digest(), _held(base)
    slept = w.sleep()
    left = _held(base)
    print(f"ZeRO-{zero_stage}: held {held / 2**20:.1f} MiB, asleep {left / 2**20:.1f} MiB, {slept}")
    assert left <= (1 - MIN_FREED) * held, (zero_stage, held, left, slept)
    assert slept["freed_bytes"] >= MIN_FREED * held
    assert slept["no_op"] is False and slept["moved_bytes"] == slept["state_bytes"] > 0, slept
    w.wake()
    assert _held(base) >= held * 0.99  # back on the device
    assert w.state_digest() == digest
    assert w.optimizer_step()["grad_norm"] > 0  # training goes on (tests/e2e/test_sleep.py: identically)


@pytest.mark.parametrize("zero_stage", [1, 3])  # a plain module (ZeRO-0/1/2), ZeRO-3 without optimizer
def test_reference_sleep_frees_the_device(small_model, port, zero_stage):
    base = torch.cuda.memory_allocated()
    r = _worker(small_model, port, zero_stage, trainable=False)
    digest, held = r.state_digest(), _held(base)
    slept = r.sleep()
    assert _held(base) <= (1 - MIN_FREED) * held, (zero_stage, held, _held(base))
    assert slept["no_op"] is False and slept["moved_bytes"] > 0, slept
    r.wake()
    assert r.state_digest() == digest
