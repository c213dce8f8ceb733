"""ArcticRLClientConfig checks that need no deployment: vllm_config.max_seq_len against the model's window."""

from __future__ import annotations

import json

import pytest
from tiny_models import make_tiny_model

from arctic_rl import ArcticRLClientConfig, ConfigError
from arctic_rl.config import MAX_DEFAULT_SEQ_LEN


@pytest.fixture(scope="module")
def short_model(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("models") / "window-2048", "llama", max_position_embeddings=2048)


def test_default_max_seq_len_follows_the_models_window(short_model):
    assert ArcticRLClientConfig(model_name=str(short_model)).vllm_config.max_seq_len == 2048
    # model_overrides (e.g. YaRN) widen the window the same way they do in the engines
    cfg = ArcticRLClientConfig(model_name=str(short_model), model_overrides={"max_position_embeddings": 8192})
    assert cfg.vllm_config.max_seq_len == 8192
    # the resolved value survives the JSON round trip a server or a reconnect makes
    assert ArcticRLClientConfig.from_json(cfg.to_json()).vllm_config.max_seq_len == 8192


def test_default_is_capped_for_a_huge_window(tmp_path, short_model):
    cfg = ArcticRLClientConfig(model_name=str(short_model), model_overrides={"max_position_embeddings": 10**7})
    assert cfg.vllm_config.max_seq_len == MAX_DEFAULT_SEQ_LEN


def test_a_max_seq_len_past_the_window_names_field_value_and_limit(short_model):
    with pytest.raises(ConfigError, match=r"vllm_config\.max_seq_len=4096.*max_position_embeddings=2048"):
        ArcticRLClientConfig(model_name=str(short_model), vllm_config={"max_seq_len": 4096})
    assert (
        ArcticRLClientConfig(model_name=str(short_model), vllm_config={"max_seq_len": 512}).vllm_config.max_seq_len
        == 512
    )


def test_window_of_a_multimodal_config_is_its_text_config(tmp_path):
    config = {"model_type": "x", "text_config": {"max_position_embeddings": 1024}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert ArcticRLClientConfig(model_name=str(tmp_path)).vllm_config.max_seq_len == 1024


def test_a_hub_name_not_on_disk_is_not_checked():
    cfg = ArcticRLClientConfig(model_name="no-such-org/no-such-model-xyz", vllm_config={"max_seq_len": 100000})
    assert cfg.vllm_config.max_seq_len == 100000
