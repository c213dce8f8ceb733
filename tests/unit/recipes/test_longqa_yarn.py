"""The YaRN helper: its config builds a model whose long-range logits change, and trainer and
sampler read the same rope settings."""

import importlib.util

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from arctic_rl.yarn import rope_theta_of, yarn_overrides

ORIGINAL = 64


def _tiny_config() -> LlamaConfig:
    return LlamaConfig(
        vocab_size=97,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=ORIGINAL,
        rope_theta=10_000.0,
    )


def test_overrides_shape():
    y = yarn_overrides(4, 32768, rope_theta=1e6)
    assert y.hf_config == y.vllm_hf_overrides and y.hf_config is not y.vllm_hf_overrides
    assert y.hf_config["max_position_embeddings"] == 131072
    params = y.hf_config["rope_parameters"]
    assert params["rope_type"] == "yarn" and params["factor"] == 4.0 and params["rope_theta"] == 1e6
    assert params["original_max_position_embeddings"] == 32768
    y.hf_config["rope_parameters"]["factor"] = 8.0
    assert y.vllm_hf_overrides["rope_parameters"]["factor"] == 4.0  # independent copies


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"factor": 1.0, "original_max_position_embeddings": 64}, "factor"),
        ({"factor": "4", "original_max_position_embeddings": 64}, "factor"),
        ({"factor": 4.0, "original_max_position_embeddings": 0}, "original_max_position_embeddings"),
        ({"factor": 4.0, "original_max_position_embeddings": 64.5}, "original_max_position_embeddings"),
    ],
)
def test_bad_values_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        yarn_overrides(**kwargs, rope_theta=1e4)


def test_yarn_config_changes_logits_beyond_the_original_window():
    torch.manual_seed(0)
    base_config = _tiny_config()
    base = LlamaForCausalLM(base_config).eval()
    config = _tiny_config()
    config.update(yarn_overrides(4.0, ORIGINAL, rope_theta=rope_theta_of(base_config)).hf_config)
    scaled = LlamaForCausalLM(config).eval()
    scaled.load_state_dict(base.state_dict())  # same weights: only the rope differs
    assert scaled.model.rotary_emb.rope_type == "yarn"
    assert scaled.model.rotary_emb.attention_scaling == pytest.approx(0.1 * torch.log(torch.tensor(4.0)).item() + 1)
    input_ids = torch.randint(0, 97, (1, 3 * ORIGINAL))
    with torch.no_grad():
        logits_base = base(input_ids).logits[0]
        logits_yarn = scaled(input_ids).logits[0]
    assert torch.isfinite(logits_yarn).all()
    beyond = (logits_yarn[ORIGINAL:] - logits_base[ORIGINAL:]).abs().amax(dim=-1)
    assert (beyond > 1e-4).all()


def test_config_round_trips_through_save_pretrained(tmp_path):
    config = _tiny_config()
    config.update(yarn_overrides(2.0, ORIGINAL, rope_theta=10_000.0).hf_config)
    config.save_pretrained(tmp_path)
    loaded = LlamaConfig.from_pretrained(tmp_path)
    assert loaded.rope_parameters["rope_type"] == "yarn" and loaded.rope_parameters["factor"] == 2.0
    assert loaded.max_position_embeddings == 2 * ORIGINAL and rope_theta_of(loaded) == 10_000.0


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM not installed")
def test_vllm_rope_equals_transformers_rope():
    """vLLM's YaRN built from the overrides gives the same cos/sin table as the trainer's."""
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.rotary_embedding import get_rope

    y = yarn_overrides(4.0, ORIGINAL, rope_theta=10_000.0)
    config = _tiny_config()
    config.update(y.hf_config)
    num_positions = 4 * ORIGINAL
    cos, sin = LlamaRotaryEmbedding(config)(torch.zeros(1, num_positions, 1), torch.arange(num_positions)[None])
    head_dim = config.hidden_size // config.num_attention_heads
    with set_current_vllm_config(VllmConfig()):
        rope = get_rope(
            head_dim, num_positions, True, rope_parameters=y.vllm_hf_overrides["rope_parameters"], dtype=torch.float32
        )
    vllm_cos, vllm_sin = rope.cos_sin_cache[:num_positions].chunk(2, dim=-1)
    torch.testing.assert_close(vllm_cos, cos[0, :, : head_dim // 2], atol=1e-6, rtol=0)
    torch.testing.assert_close(vllm_sin, sin[0, :, : head_dim // 2], atol=1e-6, rtol=0)
