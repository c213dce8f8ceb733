"""Every config is a strict model: each shipped YAML loads through the run config, and a wrong key in any of
its sections (backend, loss.config, sampling, recipe.options) fails there, naming the key and the keys allowed."""

from __future__ import annotations

import pytest
from repo_paths import REPO

from arctic_rl.config import ArcticRLClientConfig
from arctic_rl.errors import ConfigError
from arctic_rl.losses.config import GRPOConfig, parse_loss_config
from arctic_rl.runconfig import load_run_config
from arctic_rl.server.requests import check_sampling_params

SHIPPED = sorted([*REPO.glob("recipes/*/configs/*.yaml"), *REPO.glob("tests/configs/*.yaml")])
# tests/configs take the model from an override (a hub-like name needs nothing on disk to parse)
MODEL = {"tiny_loop.yaml": ["model.name_or_path=org/tiny-model"]}

# section override -> words the error must hold besides the key: keys allowed there
SECTIONS = {
    "backend.bogus_key=1": ["allowed:", "comm_protocol", "training_config"],
    "loss.config.bogus_key=1": ["known:", "'loss_agg_mode'", "'global_num_tokens'"],
    "sampling.bogus_key=1": ["allowed:", "max_tokens", "temperature"],
    "recipe.options.bogus_key=1": ["recipe.options", "known:", "'seed'"],
}


def test_the_shipped_configs_are_found():
    assert {p.parent.parent.name for p in SHIPPED} >= {"text2sql", "longqa", "toy", "tests"}


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(p.relative_to(REPO)))
def test_every_shipped_config_loads(path):
    cfg = load_run_config(path, MODEL.get(path.name, []))
    assert cfg.recipe.name and cfg.train.steps >= 1


@pytest.mark.parametrize("override", list(SECTIONS))
@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(p.relative_to(REPO)))
def test_a_wrong_key_in_each_section_names_it_and_the_allowed_keys(path, override):
    with pytest.raises(ConfigError) as e:
        load_run_config(path, [*MODEL.get(path.name, []), override])
    msg = str(e.value)
    assert "bogus_key" in msg
    for word in SECTIONS[override]:
        assert word in msg, msg


def test_the_stage_options_are_checked_over_the_recipe_options():
    path = REPO / "recipes/toy/configs/default.yaml"
    with pytest.raises(ConfigError, match=r"eval\.options.*\['prompt_wrds'\].*known:"):
        load_run_config(path, ["eval.split=test", "eval.options.prompt_wrds=3"])
    assert load_run_config(path, ["eval.split=test", "eval.options.prompt_words=3"]).eval.split == "test"


def test_the_standalone_mappings_name_key_value_and_allowed():
    cfg = ArcticRLClientConfig(model_name="org/m")
    with pytest.raises(ConfigError, match=r"unknown sampling_params key\(s\) \['bogus'\]; known: .*'top_p'"):
        check_sampling_params({"bogus": 1}, cfg)
    with pytest.raises(ConfigError, match=r"sampling_params\['n'\] = 0: must be an int in \[1, 256\]"):
        check_sampling_params({"n": 0}, cfg)
    with pytest.raises(ConfigError, match=r"loss_config\['loss_agg_mode'\] = 'x': .*'token-mean'"):
        parse_loss_config("sft", {"loss_agg_mode": "x"})
    assert parse_loss_config("my_plugin_loss", {"anything": 1}) is None  # a plugin's config is its own
    assert isinstance(parse_loss_config("grpo", None), GRPOConfig)


def test_a_hostile_value_is_cut_in_the_message():
    with pytest.raises(ConfigError) as e:
        check_sampling_params({"stop": [1] * 100_000}, ArcticRLClientConfig(model_name="org/m"))
    assert "sampling_params['stop']" in str(e.value) and len(str(e.value)) < 300
    with pytest.raises(ConfigError) as e:  # so may its keys be
        check_sampling_params(
            {f"k{i}" + "x" * 10_000: 1 for i in range(1000)}, ArcticRLClientConfig(model_name="org/m")
        )
    assert str(e.value).startswith("unknown sampling_params key(s) ['k0xxx") and len(str(e.value)) < 4000


def test_a_zorro_inference_dict_is_checked_by_its_model():
    from arctic_rl.zorro.inference import vllm_engine_kwargs

    # a typo left ZoRRo Inference silently off before
    with pytest.raises(ConfigError, match=r"unknown zorro_inference key\(s\) \['enabel'\]; known: \['enable'"):
        vllm_engine_kwargs({"enabel": True}, "cpu")


def test_lora_is_off_by_default_and_fills_alpha_from_the_rank():
    assert ArcticRLClientConfig(model_name="org/m").training_config.lora is None
    lora = ArcticRLClientConfig(model_name="org/m", training_config={"lora": {"rank": 16}}).training_config.lora
    assert (lora.rank, lora.alpha, lora.dropout, lora.target_modules, lora.scale) == (16, 32.0, 0.0, "all-linear", 2.0)
    cfg = ArcticRLClientConfig(
        model_name="org/m", training_config={"lora": {"rank": 4, "alpha": 8, "target_modules": ["q_proj"]}}
    )
    assert ArcticRLClientConfig.from_json(cfg.to_json()).training_config.lora == cfg.training_config.lora


def test_the_run_config_takes_lora_by_a_dotted_override():
    cfg = load_run_config(REPO / "recipes/text2sql/configs/cpu_demo.yaml", ["backend.training_config.lora.rank=16"])
    assert cfg.backend["training_config"]["lora"] == {"rank": 16}
    assert cfg.client_config().training_config.lora.alpha == 32.0


@pytest.mark.parametrize(
    "lora, words",
    [
        ({"rank": 0}, ["training_config.lora.rank", "(got 0)"]),
        ({"rank": 4, "dropout": 1.0}, ["training_config.lora.dropout", "(got 1.0)"]),
        ({"rank": 4, "alpha": -1}, ["training_config.lora.alpha", "(got -1)"]),
        ({"rank": 4, "target_modules": []}, ["training_config.lora.target_modules", "[]"]),
        ({"rank": 4, "target_modules": "all"}, ["training_config.lora.target_modules", "'all'"]),
        ({"rank": 4, "rnak": 4}, ["training_config.lora.rnak", "allowed: rank, alpha, dropout, target_modules"]),
    ],
)
def test_a_bad_lora_config_names_the_field_and_the_value(lora, words):
    with pytest.raises(ConfigError) as e:
        ArcticRLClientConfig(model_name="org/m", training_config={"lora": lora})
    assert all(w in str(e.value) for w in words), str(e.value)


def test_lora_with_zero3_is_refused_naming_both_and_the_fix():
    with pytest.raises(ConfigError) as e:
        ArcticRLClientConfig(model_name="org/m", training_config={"zero_stage": 3, "lora": {"rank": 4}})
    assert all(w in str(e.value) for w in ["training_config.lora", "zero_stage=3", "zero_stage 0, 1 or 2"])
