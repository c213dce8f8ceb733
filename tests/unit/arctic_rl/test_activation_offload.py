"""training_config.offload_activations: the layers' checkpointed inputs go through torch's host offload hooks
(save_on_cpu) and the gradients are exactly those of plain gradient checkpointing, with and
without ZoRRo Train. On CPU the "host" is the device, so this checks the path and its exactness; what it frees
on a GPU is checked by scripts/gpu_check.sh."""

from __future__ import annotations

import pytest
import torch
from test_zorro_train import make_batch
from tiny_models import make_tiny_model

from arctic_rl.config import TrainingConfig
from arctic_rl.engines.forward import response_log_probs
from arctic_rl.engines.model import load_hf_model
from arctic_rl.errors import ConfigError

LAYERS = 3


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("m") / "tiny", "qwen3", layers=LAYERS, hidden=64)


def _grads(model_dir, offload: bool, zorro: bool, batch) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    model = load_hf_model(str(model_dir), {}, torch.float32, gradient_checkpointing=True, offload_activations=offload)
    model.train()
    out = response_log_probs(model, batch, zorro=zorro)
    (out["log_probs"] * batch["response_mask"]).sum().backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


class _CountingOffload(torch.autograd.graph.save_on_cpu):
    """torch's own save_on_cpu, recording the shape of each tensor it moves to the host."""

    packed: list[tuple[int, ...]] = []

    def __init__(self, pin_memory: bool = False, device_type: str = "cuda"):
        super().__init__(pin_memory=pin_memory, device_type=device_type)
        inner = self.pack_hook

        def pack(t):
            _CountingOffload.packed.append(tuple(t.shape))
            return inner(t)

        self.pack_hook = pack


@pytest.mark.parametrize("zorro", [False, True])
def test_offloaded_activations_give_the_same_gradients(model_dir, monkeypatch, zorro):
    batch = make_batch([(40, [5, 9, 3]), (25, [7, 2])], P=48, R=10)
    batch["input_ids"] = batch["input_ids"] % 400  # the tiny tokenizer's vocabulary
    plain = _grads(model_dir, False, zorro, batch)
    monkeypatch.setattr(torch.autograd.graph, "save_on_cpu", _CountingOffload)
    _CountingOffload.packed = []
    offloaded = _grads(model_dir, True, zorro, batch)
    # every decoder layer's input went through the host offload
    assert len(_CountingOffload.packed) >= LAYERS, _CountingOffload.packed
    assert plain.keys() == offloaded.keys()
    for name in plain:
        assert torch.equal(plain[name], offloaded[name]), name


def test_offload_without_checkpointing_names_both_fields():
    with pytest.raises(ConfigError, match="gradient_checkpointing=True"):
        from arctic_rl.config import ArcticRLClientConfig

        ArcticRLClientConfig(model_name="m", training_config={"offload_activations": True})
    assert TrainingConfig(gradient_checkpointing=True, offload_activations=True).offload_activations
