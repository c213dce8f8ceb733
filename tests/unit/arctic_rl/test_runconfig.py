"""The run config: both shipped recipe configs load, overrides parse as YAML, bad keys name their path."""

from __future__ import annotations

from pathlib import Path

import pytest
from repo_paths import REPO

from arctic_rl.cli import main as cli_main
from arctic_rl.errors import ConfigError
from arctic_rl.loop.data import step_indices, step_seed
from arctic_rl.loop.state import latest_checkpoint
from arctic_rl.runconfig import apply_overrides, load_run_config, parse_run_config

ROOT = REPO
BIRD = ROOT / "recipes/text2sql/configs/bird_qwen3_32b.yaml"
LONGQA = ROOT / "recipes/longqa/configs/longqa_qwen3_32b.yaml"
TINY = ROOT / "tests/configs/tiny_loop.yaml"


def minimal(**extra) -> dict:
    return {
        "model": {"name_or_path": "org/model"},
        "recipe": {"name": "toy"},
        "train": {"steps": 2, "prompts_per_step": 4},
        **extra,
    }


def test_shipped_configs_load():
    bird = load_run_config(BIRD)
    assert bird.train.prompts_per_mini_batch == 64 and bird.sampling.n == 8 and not bird.use_reference
    cc = bird.client_config()
    assert cc.training_config.zero_stage == 3 and cc.training_config.dtype == "bfloat16"
    assert cc.training_config.micro_batch_size == 8  # 1 prompt group x n = 8 rows
    assert cc.arctic_inference_config.zorro_inference.enable
    longqa = load_run_config(LONGQA)
    assert longqa.model.yarn.factor == 4.0
    with pytest.raises(ConfigError, match=r"model\.yarn: cannot read rope_theta"):  # hub name, offline
        longqa.client_config()


def test_yarn_switch_sets_the_backend_overrides(tiny_llama):
    cfg = load_run_config(LONGQA, [f"model.name_or_path={tiny_llama}"]).client_config()
    rope = cfg.model_overrides["rope_parameters"]
    assert rope["rope_type"] == "yarn" and rope["factor"] == 4.0 and rope["rope_theta"] == 10000.0
    assert cfg.model_overrides["max_position_embeddings"] == 4 * rope["original_max_position_embeddings"]


def test_overrides_are_yaml_scalars():
    cfg = load_run_config(
        BIRD,
        [
            "train.steps=7",
            "sampling.temperature=0.5",
            "sampling.stop=['x']",
            "resume=never",
            "async.enable=true",
            "recipe.options.data_dir=/data/bird",
            "backend.training_config.optimizer.lr=2e-6",
        ],
    )
    assert cfg.train.steps == 7 and cfg.sampling.temperature == 0.5 and cfg.sampling.stop == ["x"]
    assert cfg.resume == "never" and cfg.async_.enable and cfg.recipe.options["data_dir"] == "/data/bird"
    assert cfg.client_config().training_config.optimizer.lr == 2e-6
    assert apply_overrides({"a": None}, ["a.b=1"]) == {"a": {"b": 1}}


@pytest.mark.parametrize(
    "override, match",
    [
        (["train.stpes=3"], r"train\.stpes: Extra inputs.*allowed: steps, prompts_per_step"),
        (["bogus=1"], r"bogus: Extra inputs"),
        (["async.bogus=1"], r"async\.bogus: Extra inputs.*allowed: enable, max_staleness"),
        (["backend.training_config.zero=3"], r"backend\.training_config\.zero: Extra inputs.*allowed: .*zero_stage"),
        (["backend.vllm_config.bogus=1"], r"backend\.vllm_config\.bogus"),
        (["backend.training_config.optimizer.lr=-1"], r"backend\.training_config\.optimizer\.lr"),
        (["backend.model_name=x"], r"backend\.model_name: set model\.name_or_path"),
        (["advantage.estimator=ppo"], r"advantage\.estimator.*'ppo'"),
        (["train.mini_batch_size=48"], r"mini_batch_size=48 must divide prompts_per_step=128"),
        (["backend.training_config.micro_batch_size=3"], r"micro_batch_size=3 disagrees"),
        (["train"], r"expected dotted\.key=value"),
        (["train.steps.x=1"], r"train\.steps is 300, not a mapping"),
        (["env.name=sql", "async.enable=true"], r"env\.name='sql' with async\.enable=true"),
        (
            ["env.name=sql", "async.enable=false", "overlong.buffer_len=8"],
            r"env\.name='sql' with overlong\.buffer_len=8",
        ),
        (["env.max_turns=0"], r"env\.max_turns"),
    ],
)
def test_errors_name_the_dotted_path(override, match):
    with pytest.raises(ConfigError, match=match):
        load_run_config(BIRD, override)


def test_missing_sections_and_files():
    with pytest.raises(ConfigError, match=r"train: Field required"):
        parse_run_config({"model": {"name_or_path": "org/m"}, "recipe": {"name": "toy"}})
    with pytest.raises(ConfigError, match="does not exist"):
        load_run_config("/no/such.yaml")
    with pytest.raises(ConfigError, match=r"model\.name_or_path.*does not exist"):
        load_run_config(TINY)  # the tiny config needs model.name_or_path=...
    cfg = parse_run_config(minimal(loss={"config": {"use_kl_loss": True}}))
    assert cfg.use_reference and cfg.checkpoint_dir == Path("runs/toy/run")
    assert not parse_run_config(
        minimal(reference={"enable": False}, loss={"config": {"use_kl_loss": True}})
    ).use_reference
    # the backend deploys a reference model only for a run that uses it
    assert not parse_run_config(minimal())._client_config(resolve_yarn=False).use_reference
    assert cfg._client_config(resolve_yarn=False).use_reference
    with pytest.raises(ConfigError, match="backend.use_reference=True disagrees with reference.enable"):
        parse_run_config(minimal(backend={"use_reference": True}))


def test_data_order_and_seeds_are_functions_of_seed_and_step():
    steps = [step_indices(s, 10, 4, seed=0) for s in (1, 2, 3, 4, 5)]
    flat = [i for s in steps for i in s]
    assert sorted(flat[:10]) == list(range(10)) and sorted(flat[10:20]) == list(range(10))  # epoch-wise
    assert flat[:10] != flat[10:20]  # reshuffled each epoch
    assert step_indices(3, 10, 4, seed=0) == steps[2] and step_indices(3, 10, 4, seed=1) != steps[2]
    assert step_seed(0, 3) == step_seed(0, 3) != step_seed(0, 4)


def test_latest_checkpoint_skips_half_written(tmp_path):
    assert latest_checkpoint(tmp_path / "none") is None
    for k in (1, 2, 10):
        (tmp_path / f"step_{k}").mkdir()
    (tmp_path / "step_1" / "loop_state.json").write_text("{}")
    (tmp_path / "step_2" / "loop_state.json").write_text("{}")
    (tmp_path / "step_10" / ".loop_state.json.1.tmp").write_text("{")  # crashed mid-write
    assert latest_checkpoint(tmp_path) == tmp_path / "step_2"


def test_cli_usage_and_config_errors(capsys):
    assert cli_main([]) == 2
    assert cli_main(["frobnicate"]) == 2 and "unknown command 'frobnicate'" in capsys.readouterr().err
    assert cli_main(["run", str(BIRD), "train.stpes=1"]) == 2
    assert "train.stpes" in capsys.readouterr().err


@pytest.mark.parametrize("native", [True, False])
def test_model_dtype_auto_is_bf16_only_where_the_machine_computes_it(monkeypatch, native: bool):
    """The CPU demos say `model.dtype: auto`: bfloat16 where oneDNN (or CUDA) computes it, float32 on a CPU that
    would emulate it. The check is torch's own (oneDNN's bf16 support), asked at client_config time."""
    import torch

    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: native)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    cfg = parse_run_config(minimal(model={"name_or_path": "org/model", "dtype": "auto"})).client_config()
    assert cfg.training_config.dtype == ("bfloat16" if native else "float32")
    for demo in ("text2sql", "longqa"):
        assert load_run_config(ROOT / f"recipes/{demo}/configs/cpu_demo.yaml").model.dtype == "auto"


def test_base_config_is_read_first_and_merged_key_by_key(tmp_path: Path) -> None:
    (tmp_path / "base.yaml").write_text(
        "model: {name_or_path: demo}\ntrain: {steps: 2, prompts_per_step: 2}\n"
        "recipe: {name: text2sql, options: {limit: 20, difficulties: [simple]}}\n"
        "sampling: {n: 8, stop: ['```']}\nloss: {name: grpo, config: {clip_ratio_low: 0.2}}\n"
    )
    (tmp_path / "variant.yaml").write_text(
        "base: base.yaml\nrecipe: {options: {difficulties: null}}\nsampling: {stop: ['x']}\n"
        "loss: {config: {rollout_is: token}}\n"
    )
    cfg = load_run_config(tmp_path / "variant.yaml", ["sampling.n=4"])
    assert cfg.recipe.options == {"limit": 20, "difficulties": None}  # merged, null replaces
    assert cfg.sampling.stop == ["x"] and cfg.sampling.n == 4  # lists replaced; overrides last
    assert cfg.loss.config == {"clip_ratio_low": 0.2, "rollout_is": "token"}


def test_a_base_that_loops_or_is_missing_is_refused_naming_it(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("base: b.yaml\n")
    (tmp_path / "b.yaml").write_text("base: a.yaml\n")
    with pytest.raises(ConfigError, match="loops back to itself"):
        load_run_config(tmp_path / "a.yaml")
    (tmp_path / "c.yaml").write_text("base: gone.yaml\n")
    with pytest.raises(ConfigError, match=r"gone.yaml' \(base of .*c.yaml'\) does not exist"):
        load_run_config(tmp_path / "c.yaml")
    (tmp_path / "d.yaml").write_text("base: [a.yaml]\n")
    with pytest.raises(ConfigError, match="base must be a config file's path"):
        load_run_config(tmp_path / "d.yaml")


def test_the_async_cpu_demo_is_the_sync_one_plus_async() -> None:
    configs = REPO / "recipes" / "text2sql" / "configs"
    sync_cfg, variant_cfg = (load_run_config(configs / name) for name in ("cpu_demo.yaml", "cpu_demo_async.yaml"))
    assert variant_cfg.client_config().cpu.split and not sync_cfg.client_config().cpu.split  # disjoint cores
    sync, variant = sync_cfg.model_dump(), variant_cfg.model_dump()
    differ = {k for k in sync if sync[k] != variant[k]}
    assert differ == {"async_", "loss", "tracking"}, differ
    assert variant["async_"]["enable"] is True and variant["async_"]["max_staleness"] == 1
    assert variant["loss"]["name"] == sync["loss"]["name"]
    assert {k: variant["loss"]["config"][k] for k in sync["loss"]["config"]} == sync["loss"]["config"]
    assert {k: v for k, v in variant["loss"]["config"].items() if k not in sync["loss"]["config"]} == {
        "rollout_is": "token",
        "rollout_is_threshold": 2.0,
    }
