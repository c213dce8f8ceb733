"""The published-setup config parses, its recipe options are ones the recipe knows, and its YaRN
section produces a 128K rope for Qwen3's 32K window."""

from pathlib import Path

import yaml

import recipes.longqa as longqa
from arctic_rl.yarn import yarn_overrides

CONFIG = Path(longqa.__file__).parent / "configs" / "longqa_qwen3_32b.yaml"


def test_qwen3_32b_config():
    config = yaml.safe_load(CONFIG.read_text())
    assert set(config) == {"model", "backend", "recipe", "sampling", "train", "loss", "advantage", "checkpoint"}
    assert config["checkpoint"]["every"] > 0  # a requeued job resumes
    assert config["recipe"]["name"] == "longqa"
    assert set(config["recipe"]["options"]) <= longqa._KNOWN_OPTIONS
    yarn = yarn_overrides(**config["model"]["yarn"], rope_theta=1_000_000.0)
    assert yarn.vllm_hf_overrides["max_position_embeddings"] == 131072
    assert config["backend"]["vllm_config"]["max_seq_len"] >= 16384 + config["sampling"]["max_tokens"]
    assert config["backend"]["training_config"]["zorro_train"]["enable"] is True
    assert config["backend"]["arctic_inference_config"]["zorro_inference"]["enable"] is True
