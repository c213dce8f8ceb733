"""text2sql and longqa as verl data + verl custom_reward_function (recipes/verl/recipe_data.py, reward_fn.py):
rows round-trip through parquet, and verl's compute_score signature scores a right and a wrong completion."""

from __future__ import annotations

import json
import os

import pandas as pd
import pytest
from repo_paths import REPO

from recipes.verl.recipe_data import prepare, recipe_options, to_verl_rows
from recipes.verl.reward_fn import compute_score


def _rows(tmp_path, recipe, options, val_split):
    train, val = prepare(recipe, tmp_path / recipe, options, "train", val_split, max_train=2, max_val=1)
    df = pd.read_parquet(train)
    assert len(df) == 2 and len(pd.read_parquet(val)) == 1
    return [r for _, r in df.iterrows()]


def _score(row, completion):
    return compute_score(row["data_source"], completion, row["reward_model"]["ground_truth"], row["extra_info"])


def test_text2sql_rows_and_reward(tmp_path):
    row = _rows(tmp_path, "text2sql", {"schema_tables": "relevant"}, "dev")[0]
    assert row["data_source"] == "arctic_rl/text2sql" and row["prompt"][-1]["role"] == "user"
    gold = row["reward_model"]["ground_truth"]
    assert json.loads(row["extra_info"]["example"])["gold_sql"] == gold
    assert _score(row, f"```sql\n{gold}\n```") == 1.0
    assert _score(row, "I do not know.") == 0.0


def test_longqa_rows_and_reward(tmp_path):
    row = _rows(tmp_path, "longqa", {"num_examples": 4, "context_tokens": 300}, "validation")[0]
    assert row["data_source"] == "arctic_rl/longqa" and row["prompt"][0]["role"] == "user"
    answers = json.loads(row["reward_model"]["ground_truth"])
    assert _score(row, answers[0]) == 1.0
    assert _score(row, "zzzz qqqq") == 0.0


def test_prefill_is_refused_and_options_merge(tmp_path):
    with pytest.raises(ValueError, match="prefill"):
        to_verl_rows("text2sql", [{"messages": [], "assistant_prefix": "```sql\nSELECT"}], "train")
    cfg = tmp_path / "c.yaml"
    cfg.write_text("recipe:\n  options:\n    num_shots: 2\n    prefill: true\n")
    assert recipe_options(cfg, ["prefill=false", "limit=3"]) == {"num_shots": 2, "prefill": False, "limit": 3}


@pytest.mark.parametrize("recipe", ["text2sql", "longqa"])
def test_launch_scripts_compose_with_verl(recipe, monkeypatch):
    """The overrides of recipes/verl/configs/<recipe>.sh compose into verl's Hydra config for both backends,
    with the same hyper-parameters; the arctic-rl one builds a valid ArcticRLClientConfig."""
    import subprocess
    import sys
    from pathlib import Path

    venv = Path(sys.executable).parent.parent
    for d in ("verl-ref", "verl-trainer"):
        if str(venv / d) not in sys.path:
            sys.path.append(str(venv / d))
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from recipes.verl.main import VERL_CONFIG_DIR, apply_arctic_defaults
    from recipes.verl.worker import client_config_from_verl

    root = REPO
    cfgs = {}
    for backend in ("arctic", "native"):
        out = subprocess.run(
            ["bash", str(root / f"recipes/verl/configs/{recipe}.sh"), f"print-{backend}"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.splitlines()
        assert out[0] == f"python -m {'recipes.verl.main' if backend == 'arctic' else 'verl.trainer.main_ppo'}"
        with initialize_config_dir(config_dir=VERL_CONFIG_DIR, version_base=None):
            cfgs[backend] = compose(config_name="ppo_trainer", overrides=out[1:])
    arctic, native = cfgs["arctic"], cfgs["native"]
    assert native.actor_rollout_ref.rollout.name == "vllm" and native.actor_rollout_ref.actor.strategy == "fsdp"
    assert native.reward.custom_reward_function.path.endswith("recipes/verl/reward_fn.py")
    for key in (
        "data.train_batch_size",
        "data.max_prompt_length",
        "data.max_response_length",
        "actor_rollout_ref.actor.optim.lr",
        "actor_rollout_ref.actor.ppo_mini_batch_size",
        "actor_rollout_ref.actor.clip_ratio_high",
        "actor_rollout_ref.actor.loss_agg_mode",
        "actor_rollout_ref.rollout.n",
        "actor_rollout_ref.rollout.temperature",
        "trainer.project_name",
        "reward.custom_reward_function.path",
        "algorithm.adv_estimator",
        "trainer.use_v1",
    ):
        assert OmegaConf.select(arctic, key) == OmegaConf.select(native, key), key
    monkeypatch.setenv("ARCTIC_RL_NODES", "2")  # what jobs.bootstrap gives the recipe command
    apply_arctic_defaults(arctic)
    assert arctic.actor_rollout_ref.rollout.name == "arctic"
    # The TaskRunner actor opens the MLflow run; the launcher's tags reach it through verl's job runtime_env.
    assert arctic.ray_kwargs.ray_init.runtime_env.env_vars.ARCTIC_RL_NODES == "2"
    client = client_config_from_verl(arctic.actor_rollout_ref)
    assert client.training_gpus == 32 and client.training_config.zero_stage == 3
    assert client.vllm_config.tensor_parallel_size == native.actor_rollout_ref.rollout.tensor_model_parallel_size
    assert client.training_config.optimizer.lr == 1e-6


def _verl_config(overrides):
    """verl's own composed ppo_trainer config with Hydra overrides."""
    import sys
    from pathlib import Path

    venv = Path(sys.executable).parent.parent
    for d in ("verl-ref", "verl-trainer"):
        if str(venv / d) not in sys.path:
            sys.path.append(str(venv / d))
    from hydra import compose, initialize_config_dir

    from recipes.verl.main import VERL_CONFIG_DIR

    with initialize_config_dir(config_dir=VERL_CONFIG_DIR, version_base=None):
        return compose(config_name="ppo_trainer", overrides=["actor_rollout_ref.model.path=tiny", *overrides])


def _verl_actor_rollout_ref(overrides):
    """verl's own composed `actor_rollout_ref` (its ppo_trainer config) with Hydra overrides."""
    return _verl_config(overrides).actor_rollout_ref


def test_verl_on_arctic_run_is_tagged_with_arctics_gpus(monkeypatch):
    """`arctic-rl compare` matches a verl + arctic-rl run with native verl by the `gpus` tag. verl's
    trainer.nnodes x n_gpus_per_node sizes verl's one-process client group there, not the GPUs arctic-rl's
    engines hold: a 2-node run with training_gpus=2 was tagged gpus=1 and refused beside native verl's 2."""
    import json

    from recipes.verl.main import set_mlflow_run_context

    for var in ("MLFLOW_RUN_CONTEXT", "ARCTIC_RL_GPUS", "ARCTIC_RL_NODES", "ARCTIC_RL_RECIPE", "SLURM_JOB_ID"):
        monkeypatch.delenv(var, raising=False)
    cfg = _verl_config(
        [
            "trainer.nnodes=1",
            "trainer.n_gpus_per_node=1",
            "+actor_rollout_ref.arctic.training_gpus=2",
            "+actor_rollout_ref.arctic.sampling_gpus=2",
        ]
    )
    set_mlflow_run_context(cfg)
    tags = json.loads(os.environ["MLFLOW_RUN_CONTEXT"])
    assert tags["gpus"] == "2" and tags["framework"] == "verl" and tags["backend"] == "arctic-rl"
    # A job launcher's count (jobs/bootstrap.py: --gpus-per-node x nodes) wins
    monkeypatch.delenv("MLFLOW_RUN_CONTEXT")
    monkeypatch.setenv("ARCTIC_RL_GPUS", "8")
    set_mlflow_run_context(cfg)
    assert json.loads(os.environ["MLFLOW_RUN_CONTEXT"])["gpus"] == "8"


def test_verl_optimizer_settings_reach_the_client_config():
    """verl's actor optim (lr, betas, weight decay, clip, scheduler) is applied, and a nested arctic override
    (training_config.optimizer.eps) adds to it instead of replacing the optimizer section."""
    a = "actor_rollout_ref.actor.optim."
    ref = _verl_actor_rollout_ref(
        [
            f"{a}lr=3e-7",
            f"{a}weight_decay=0.05",
            f"{a}betas=[0.8,0.95]",
            f"{a}lr_scheduler_type=cosine",
            f"{a}lr_warmup_steps=4",
            f"{a}total_training_steps=40",
            f"{a}min_lr_ratio=0.1",
            "actor_rollout_ref.actor.grad_clip=0.5",
            "+actor_rollout_ref.arctic.training_config.optimizer.eps=1e-6",
            "+actor_rollout_ref.arctic.training_config.zero_stage=2",
        ]
    )
    from recipes.verl.worker import client_config_from_verl  # needs verl on sys.path (above)

    training = client_config_from_verl(ref).training_config
    assert training.optimizer.lr == 3e-7 and training.optimizer.weight_decay == 0.05
    assert training.optimizer.betas == (0.8, 0.95) and training.optimizer.eps == 1e-6
    assert training.grad_clip == 0.5 and training.zero_stage == 2
    sched = training.lr_scheduler
    assert (sched.type, sched.warmup_steps, sched.total_steps, sched.min_lr_ratio) == ("cosine", 4, 40, 0.1)


def test_verl_warmup_ratio_and_unknown_scheduler():
    from arctic_rl.errors import ConfigError

    a = "actor_rollout_ref.actor.optim."
    ref = _verl_actor_rollout_ref([f"{a}lr_warmup_steps_ratio=0.25", f"{a}total_training_steps=20"])
    from recipes.verl.worker import client_config_from_verl  # needs verl on sys.path (above)

    assert client_config_from_verl(ref).training_config.lr_scheduler.warmup_steps == 5
    ref = _verl_actor_rollout_ref([f"{a}lr_scheduler_type=wsd"])
    with pytest.raises(ConfigError, match="lr_scheduler_type.*wsd"):
        client_config_from_verl(ref)
