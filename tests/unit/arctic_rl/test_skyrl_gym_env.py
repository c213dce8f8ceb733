"""SkyRL-gym environments through arctic-rl's environment interface (arctic_rl/envs/skyrl_gym.py), on the real
skyrl_gym package: its gsm8k_multi_turn environment scores the turns, and a multi-turn rollout runs it. Ids that run
the model's text as code are refused without env.allow_unsandboxed_code, and with it their child processes start
without the loop's secrets."""

from __future__ import annotations

import json

import pytest
from test_multiturn import ToySampler, tok  # noqa: F401  (the module's tokenizer fixture)

from arctic_rl.chat import ObservationTemplate
from arctic_rl.envs import Step, make_env
from arctic_rl.errors import ConfigError
from arctic_rl.rollout.multiturn import play
from arctic_rl.runconfig import parse_run_config


def test_gsm8k_multi_turn_scores_each_turn_and_sums_the_rewards():
    env = make_env("skyrl_gym", {"id": "gsm8k_multi_turn"})
    env.reset({"answer": "42"})
    # its own max_turns is 5: a wrong but well-formed answer earns the format score (0.2 / 5) and a hint
    first = env.step("Two sixes make 12, so #### 41")
    assert first.observation and "####" in first.observation and not first.done
    last = env.step("Correcting myself: #### 42")
    assert last == Step(done=True, reward=pytest.approx(0.2 / 5 + 1.0))
    # the example's env_extras, as recipes/skyrl/data.py writes them, take precedence
    env.reset({"answer": "1", "env_extras": {"reward_spec": {"ground_truth": "7"}, "max_turns": 1}})
    assert env.step("#### 7") == Step(done=True, reward=1.0)


def test_bad_options_and_examples_are_named():
    with pytest.raises(ValueError, match="env.options.id='nope' is not a SkyRL-gym environment; known: .*gsm8k"):
        make_env("skyrl_gym", {"id": "nope"})
    env = make_env("skyrl_gym", {"id": "gsm8k", "ground_truth_key": "solution"})
    with pytest.raises(ValueError, match="neither env_extras nor 'solution'"):
        env.reset({"answer": "3"})


def test_a_rollout_plays_the_gym_environment(tok):  # noqa: F811
    """play() with the gym's environment: each conversation ends when the gym says done (its own max_turns, here
    2) with the summed reward, and the gym's hints are masked observations between the model's turns."""
    sampler = ToySampler(tok)
    prompts = [tok("one two three", add_special_tokens=False)["input_ids"]]
    samples = play(
        sampler.generate,
        prompts,
        {"n": 2, "max_tokens": 6, "seed": 1},
        [{"answer": "5", "env_extras": {"reward_spec": {"ground_truth": "5"}, "max_turns": 2}}],
        lambda: make_env("skyrl_gym", {"id": "gsm8k_multi_turn"}),
        ObservationTemplate(tok),
        tok.decode,
        max_turns=4,
    )
    assert len(samples) == 2 and any(s["finish_reason"] != "length" for s in samples)
    for s in samples:
        if s["finish_reason"] == "length":  # a turn the toy sampler cut ends the conversation first
            continue
        assert s["num_turns"] == 2 and s["reward"] == 0.0  # the toy model never writes "#### 5"
        assert 0 in s["loss_mask"] and s["loss_mask"][0] == 1


# --- which gym ids run: the ones that run the model's text as code need env.allow_unsandboxed_code ----------------

SECRETS = {
    "ARCTIC_RL_TOKEN": "arctic-secret-1",
    "RAY_AUTH_TOKEN": "ray-secret-2",
    "MLFLOW_TRACKING_URI": "https://user:mlflow-secret-3@mlflow.example",
    "AWS_SECRET_ACCESS_KEY": "aws-secret-4",
    "HF_TOKEN": "hf-secret-5",
    "DATABASE_URL": "postgres://me:db-secret-6@db.example/x",
}


@pytest.mark.parametrize("gym_id", ["searchcode", "lcb", "text2sql"])
def test_an_id_that_runs_the_model_s_code_is_refused_without_the_flag(gym_id):
    fix = r"Fix: use an id that runs no code \(aime, gsm8k, gsm8k_multi_turn, search\).*allow_unsandboxed_code: true"
    with pytest.raises(
        ConfigError, match=rf"env\.options\.id='{gym_id}' .*env\.allow_unsandboxed_code is false.*{fix}"
    ):
        make_env("skyrl_gym", {"id": gym_id})
    # the run config refuses it when it is read, before any engine starts, naming the field
    with pytest.raises(ConfigError, match=rf"env: .*env\.options\.id='{gym_id}'.*env\.allow_unsandboxed_code"):
        parse_run_config(run_config(gym_id))
    assert parse_run_config(run_config(gym_id, allow_unsandboxed_code=True)).env.allow_unsandboxed_code
    assert parse_run_config(run_config("gsm8k_multi_turn")).env.allow_unsandboxed_code is False


def test_the_flag_is_a_field_of_env_not_an_option():
    with pytest.raises(ConfigError, match=r"env\.options\.allow_unsandboxed_code=True: the opt-in is env\.allow_uns"):
        make_env("skyrl_gym", {"id": "searchcode", "allow_unsandboxed_code": True})


def test_searchcode_s_python_child_gets_no_secrets(monkeypatch):
    """With the flag, searchcode runs the model's Python (`python -c`, a real child process); what that child finds
    in os.environ carries none of the loop's tokens, keys or credentialed URLs, and the rest of the environment."""
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("ARCTIC_RL_TEST_PLAIN_SETTING", "x")  # arctic-rl's own prefix: dropped too
    monkeypatch.setenv("PLAIN_SETTING_KEPT", "kept-7")
    env = make_env("skyrl_gym", {"id": "searchcode"}, allow_unsandboxed_code=True)
    env.reset({"answer": "1", "env_extras": {"reward_spec": {"ground_truth": "1"}, "max_turns": 3}})
    step = env.step("<tool><python>import os, json; print(json.dumps(dict(os.environ)))</python></tool>")
    seen = json.loads(step.observation)
    assert seen["PLAIN_SETTING_KEPT"] == "kept-7" and "PATH" in seen
    leaked = {k: v for k, v in seen.items() if any(s in v for s in SECRETS.values()) or k.startswith("ARCTIC_RL_")}
    assert leaked == {}


def run_config(gym_id: str, **env) -> dict:
    return {
        "model": {"name_or_path": "org/model"},
        "recipe": {"name": "toy"},
        "train": {"steps": 2, "prompts_per_step": 4},
        "env": {"name": "skyrl_gym", "options": {"id": gym_id}, **env},
    }
