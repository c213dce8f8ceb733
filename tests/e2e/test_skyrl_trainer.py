"""SkyRL's own trainer loop (skyrl-train 0.3.1 RayPPOTrainer.train, unmodified) with arctic-rl as policy,
reference and sampler: 2 GRPO steps on the tiny model (CPU), through recipes/skyrl/run_tiny.sh, in SkyRL's
own Python 3.12 environment (.venv-skyrl, scripts/setup_skyrl_env.sh) talking HTTP to an arctic-rl server
in .venv. Then the MLflow run SkyRL's logger wrote, and the checkpoint it saved through arctic-rl."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest
from frameworks import check_skyrl_run, skip_if_run_on_two_hosts
from repo_paths import REPO
from skyrl_env import skyrl_python

ROOT = REPO


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
@pytest.mark.parametrize("data", ["toy", "gsm8k"])
def test_skyrl_trainer_two_grpo_steps_on_arctic(tiny_llama, tmp_path, data, new_mlflow_store):
    """toy: an arctic-rl recipe through env_class "arctic"; gsm8k: SkyRL's own GSM8K layout and skyrl-gym env.
    With the two-host Slurm up, both skip: the two-host job is the same run on the toy recipe, and
    test_generator_one_request_per_group_length scores SkyRL's GSM8K rows with skyrl-gym's own env."""
    skip_if_run_on_two_hosts("tests/e2e/test_jobs_multinode.py::test_framework_path_on_two_nodes[skyrl]")
    skyrl_py = skyrl_python()
    out = subprocess.run(
        [str(skyrl_py), "-c", "import sys, skyrl_train; print(sys.version_info[:2])"], capture_output=True, text=True
    )
    assert out.stdout.strip() == "(3, 12)", out.stderr
    uri = new_mlflow_store(tmp_path / "mlflow.db")
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "MLFLOW_RUN_ID", "MLFLOW_RUN_CONTEXT")}
    env.update(
        SKYRL_DATA=str(tmp_path / "data"),
        SKYRL_OUT=str(tmp_path / "out"),
        MLFLOW_TRACKING_URI=uri,
        ARCTIC_RL_STATE_DIR=str(tmp_path / "state"),
        ARCTIC_RL_PORT=str(_free_port()),
    )
    if data == "gsm8k":  # else run_tiny.sh writes the toy recipe's data
        subprocess.run(
            [
                sys.executable,
                "-m",
                "recipes.skyrl.data",
                "--recipe",
                "gsm8k",
                "--out",
                str(tmp_path / "data"),
                "--max-train",
                "8",
                "--max-val",
                "4",
            ],
            cwd=ROOT,
            check=True,
        )
    log = tmp_path / "skyrl.log"
    with open(log, "w") as f:
        proc = subprocess.run(
            ["bash", str(ROOT / "recipes/skyrl/run_tiny.sh"), str(tiny_llama), "trainer.project_name=skyrl-ci"],
            cwd=ROOT,
            env=env,
            stdout=f,
            stderr=subprocess.STDOUT,
            timeout=900,
        )
    tail = "\n".join(log.read_text(errors="replace").splitlines()[-60:])
    assert proc.returncode == 0, f"SkyRL run failed (exit {proc.returncode}):\n{tail}"

    check_skyrl_run(uri, "skyrl-ci", tiny_llama, tmp_path / "out", tail)


def test_skyrl_config_mapping_names_bad_values():
    """The SkyRL -> arctic-rl config and loss mapping, in SkyRL's own environment (its Hydra config)."""
    skyrl_py = skyrl_python()
    code = r"""
from hydra import compose, initialize_config_dir
from skyrl_train.entrypoints.main_base import config_dir
from recipes.skyrl.trainer import client_config_from_skyrl, loss_config_from_skyrl
with initialize_config_dir(config_dir=config_dir, version_base=None):
    cfg = compose("ppo_base_config", overrides=[
        "trainer.algorithm.policy_loss_type=dual_clip",
        "trainer.algorithm.loss_reduction=seq_mean_token_sum_norm", "trainer.algorithm.kl_estimator_type=k1",
        "trainer.placement.policy_num_gpus_per_node=2", "+trainer.arctic.comm_protocol=http",
        "+trainer.arctic.training_config.zero_stage=3"])
    loss = loss_config_from_skyrl(cfg)
    assert loss == {"policy_loss": "ppo", "clip_ratio_low": 0.2, "clip_ratio_high": 0.2, "clip_ratio_c": 3.0,
                    "loss_agg_mode": "seq-mean-token-sum-norm", "use_kl_loss": True, "loss_scale_factor": 1024.0,
                    "kl_loss_coef": 0.001, "kl_loss_type": "k1"}, loss
    cc = client_config_from_skyrl(cfg)
    assert cc.training_gpus == 2 and cc.training_config.zero_stage == 3 and cc.training_config.dtype == "bfloat16"
    assert cc.training_config.optimizer.lr == 1e-6 and cc.vllm_config.tensor_parallel_size == 4 and cc.colocate
    cfg.trainer.algorithm.policy_loss_type = "clip_cov"
    try:
        loss_config_from_skyrl(cfg)
    except ValueError as e:
        assert "policy_loss_type='clip_cov'" in str(e), e
    else:
        raise AssertionError("clip_cov accepted")
print("ok")
"""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    out = subprocess.run([str(skyrl_py), "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stdout[-2000:] + out.stderr[-4000:]


@pytest.mark.parametrize("recipe", ["gsm8k", "text2sql", "longqa"])
def test_skyrl_baseline_configs_compose(recipe):
    """recipes/skyrl/configs/<recipe>.sh: both backends' overrides compose with SkyRL's own Hydra config, pass
    SkyRL's validate_cfg, and the arctic-rl side gets the same device counts as the native placement."""
    skyrl_py = skyrl_python()
    script = ROOT / "recipes/skyrl/configs" / f"{recipe}.sh"
    args = {
        b: subprocess.run(
            ["bash", str(script), f"print-{b}"], capture_output=True, text=True, check=True
        ).stdout.splitlines()
        for b in ("arctic", "native")
    }
    assert args["arctic"][0] == "python -m recipes.skyrl.main" and args["native"][0] == "python -m recipes.skyrl.native"
    code = r"""
import json, sys
from hydra import compose, initialize_config_dir
from skyrl_train.entrypoints.main_base import config_dir
from skyrl_train.utils import validate_cfg
from recipes.skyrl.main import apply_arctic_defaults
from recipes.skyrl.trainer import client_config_from_skyrl, loss_config_from_skyrl
args = json.loads(sys.argv[1])
with initialize_config_dir(config_dir=config_dir, version_base=None):
    native = compose("ppo_base_config", overrides=args["native"][1:])
    arctic = compose("ppo_base_config", overrides=args["arctic"][1:])
validate_cfg(native)
apply_arctic_defaults(arctic)
validate_cfg(arctic)
cc = client_config_from_skyrl(arctic)
p, g = native.trainer.placement, native.generator
assert cc.training_gpus == p.policy_num_nodes * p.policy_num_gpus_per_node, cc.training_gpus
assert cc.sampling_gpus == g.num_inference_engines * g.inference_engine_tensor_parallel_size, cc.sampling_gpus
assert cc.training_config.zorro_train.enable and cc.comm_protocol == "http"
assert loss_config_from_skyrl(arctic) == loss_config_from_skyrl(native)
for key in ("trainer.train_batch_size", "generator.n_samples_per_prompt", "trainer.policy.optimizer_config.lr"):
    a, n = arctic, native
    for part in key.split("."):
        a, n = a[part], n[part]
    assert a == n, (key, a, n)
print("ok", cc.training_gpus, cc.sampling_gpus)
"""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    out = subprocess.run(
        [str(skyrl_py), "-c", code, __import__("json").dumps(args)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0 and "ok" in out.stdout, out.stdout[-2000:] + out.stderr[-4000:]


def test_generator_one_request_per_group_length():
    """ArcticGenerator turns SkyRL's repeated rows back into groups: runs of a prompt -> one request with n = run
    length (one call per distinct length), samples back in row order, rewards from the `arctic` skyrl-gym env,
    and from skyrl-gym's own `gsm8k` env on SkyRL's GSM8K rows.
    The client here only records calls (the end-to-end test above uses the real one)."""
    skyrl_py = skyrl_python()
    code = r"""
import asyncio, json
from omegaconf import OmegaConf
from recipes.skyrl.generator import ArcticGenerator

class Tok:
    def apply_chat_template(self, messages, tokenize, add_generation_prompt):
        return messages[0]["content"]
    def __call__(self, text, add_special_tokens):
        return {"input_ids": [ord(c) for c in text]}

class Recorder:
    calls = []
    def generate(self, ids, params):
        self.calls.append((len(ids), params["n"], params["seed"]))
        return [{"prompt_token_ids": p, "token_ids": [j], "text": "a e i" if j % 2 else "xyz", "logprobs": [-1.0],
                 "finish_reason": "stop"} for p in ids for j in range(params["n"])]

cfg = OmegaConf.create({"trainer": {"seed": 0}, "generator": {}, "environment": {"skyrl_gym": {}}})
client = Recorder()
gen = ArcticGenerator(cfg, Tok(), client)
ex = lambda t: {"arctic_recipe": "toy", "arctic_example": json.dumps({"target": "aeiou", "id": t})}
rows = ["A"] * 3 + ["B"] * 3 + ["C"]
out = asyncio.run(gen.generate({"prompts": [[{"role": "user", "content": r}] for r in rows],
                                "env_classes": ["arctic"] * 7, "env_extras": [ex(r) for r in rows],
                                "sampling_params": {"temperature": 1.0, "top_k": -1, "logprobs": None},
                                "trajectory_ids": None, "batch_metadata": None}))
assert sorted(c[:2] for c in client.calls) == [(1, 1), (2, 3)], client.calls
assert [chr(p[0]) for p in out["prompt_token_ids"]] == rows
assert [r[0] for r in out["response_ids"]] == [0, 1, 2, 0, 1, 2, 0]
assert out["rewards"] == [0.0, 1.0, 0.0, 0.0, 1.0, 0.0, 0.0], out["rewards"]

# SkyRL's own GSM8K rows (recipes.skyrl.data --recipe gsm8k), their columns passed on as SkyRL's dataset does
# (everything but prompt and env_class becomes env_extras), scored by skyrl-gym's gsm8k env.
gsm8k = json.loads(GSM8K_ROWS)
truth = [r["reward_spec"]["ground_truth"] for r in gsm8k]
questions = [r["prompt"][0]["content"] for r in gsm8k]
class Answers(Recorder):
    def generate(self, ids, params):
        out = super().generate(ids, params)
        for s in out:  # odd samples answer right, in GSM8K's "#### <answer>" format
            q = questions.index("".join(map(chr, s["prompt_token_ids"])))
            s["text"] = f"#### {truth[q]}" if s["token_ids"][0] % 2 else "no idea"
        return out
gen = ArcticGenerator(cfg, Tok(), Answers())
out = asyncio.run(gen.generate({"prompts": [r["prompt"] for r in gsm8k for _ in range(2)],
                                "env_classes": [r["env_class"] for r in gsm8k for _ in range(2)],
                                "env_extras": [{k: v for k, v in r.items() if k not in ("prompt", "env_class")}
                                               for r in gsm8k for _ in range(2)],
                                "sampling_params": None, "trajectory_ids": None, "batch_metadata": None}))
assert out["rewards"] == [0.0, 1.0] * len(gsm8k), out["rewards"]
print("ok")
"""
    from recipes.skyrl.data import gsm8k_rows

    code = code.replace("GSM8K_ROWS", repr(json.dumps(gsm8k_rows(None, "train", 3))))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([str(skyrl_py), "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stdout[-2000:] + out.stderr[-4000:]
