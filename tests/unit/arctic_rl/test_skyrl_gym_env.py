"""SkyRL-gym environments through arctic-rl's environment interface (arctic_rl/envs/skyrl_gym.py), on the real
skyrl_gym package: its gsm8k_multi_turn environment scores the turns, and a multi-turn rollout runs it."""

from __future__ import annotations

import pytest
from test_multiturn import ToySampler, tok  # noqa: F401  (the module's tokenizer fixture)

from arctic_rl.chat import ObservationTemplate
from arctic_rl.envs import Step, make_env
from arctic_rl.rollout.multiturn import play


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
