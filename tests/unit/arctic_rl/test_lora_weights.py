"""What leaves a LoRA trainer as the policy's weights (engines.lora.policy_weights): the base model's names and
shapes, each adapted weight merged. On an MoE model PEFT's 'all-linear' adapts the stacked experts
(experts.gate_up_proj [experts, ...], one low-rank update per expert) and the router's weight as parameters
(ParamWrapper, nested once per parameter of a module); a plain model loaded with the merged weights computes
what the adapted model computes."""

from __future__ import annotations

import pytest
import torch
from test_zorro_train import tiny_model

from arctic_rl.config import LoraConfig
from arctic_rl.engines.lora import adapted_layers, apply_lora, policy_weights


@pytest.mark.parametrize("name", ["qwen3", "qwen3_moe"])
def test_merged_policy_weights_compute_what_the_adapted_model_computes(name):
    model = tiny_model(name, seed=4).eval()
    base = {n: p.shape for n, p in model.named_parameters()}
    apply_lora(model, LoraConfig(rank=4))
    torch.manual_seed(4)
    for layer in adapted_layers(model).values():  # PEFT starts B at zero: a merge of nothing would pass
        torch.nn.init.normal_(layer.lora_B["default"].weight, std=0.5)
    weights = {n: value() for n, (_, value) in policy_weights(model).items()}
    assert {n: w.shape for n, w in weights.items()} == base  # no adapter, no wrapper path, every base tensor
    if name == "qwen3_moe":
        adapted = set(adapted_layers(model))
        assert {
            "model.layers.0.mlp.experts",
            "model.layers.0.mlp.experts.base_layer",
            "model.layers.0.mlp.gate",
        } <= adapted
    plain = tiny_model(name, seed=5).eval()
    plain.load_state_dict(weights, strict=True)
    ids = torch.randint(1, 101, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(plain(ids).logits, model(ids).logits, atol=1e-5, rtol=0)
