"""Multi-turn rollouts (arctic_rl.rollout.multiturn) and environments (arctic_rl.envs) against a deterministic toy
sampler over the tests' tiny BPE tokenizer: each next token is a function of the exact token prefix, so a turn
shows whether it was sampled from the conversation's own tokens (token in) and the sample shows whether they
were kept as sampled (token out). The real sampler and trainer run the same code in tests/e2e/test_multiturn.py."""

from __future__ import annotations

import copy
import hashlib
import sys

import pytest
import torch
from repo_paths import REPO

from arctic_rl.batch import from_samples
from arctic_rl.chat import ObservationTemplate
from arctic_rl.envs import ENVS, Step, make_env, register_env
from arctic_rl.errors import ConfigError, UnknownNameError
from arctic_rl.rollout.multiturn import play

sys.path.insert(0, str(REPO / "tests"))
from tiny_models import make_tokenizer  # noqa: E402


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return make_tokenizer(tmp_path_factory.mktemp("tok"))


def next_token(prefix: list[int], vocab: int, eos: int, first_free: int) -> int:
    d = hashlib.sha256(str(prefix).encode()).digest()
    return eos if d[0] % 6 == 0 else first_free + d[1] * 256 % (vocab - first_free) + d[2] % 7


class ToySampler:
    """vLLM's semantics for what play() reads: n samples per prompt (prompt-major), max_tokens, EOS ends a
    sample (finish 'stop', EOS included in token_ids, not in text), else 'length'."""

    def __init__(self, tok):
        self.tok, self.calls, self.keys = tok, [], []
        self.eos = tok.convert_tokens_to_ids(tok.eos_token)
        self.first_free = max(tok.convert_tokens_to_ids(t) for t in tok.all_special_tokens) + 1

    def continuation(self, prompt: list[int], max_tokens: int, salt: int) -> tuple[list[int], str]:
        tokens: list[int] = []
        while len(tokens) < max_tokens:
            t = next_token([salt, *prompt, *tokens], len(self.tok), self.eos, self.first_free)
            tokens.append(min(t, len(self.tok) - 1))
            if tokens[-1] == self.eos and len(tokens) > 1:
                return tokens, "stop"
            if tokens[-1] == self.eos:
                tokens[-1] = self.first_free
        return tokens, "length"

    def generate(self, prompts, params, routing_keys=None):
        self.calls.append(dict(params))
        self.keys.append(routing_keys)
        out = []
        for p in prompts:
            for k in range(params.get("n", 1)):
                tokens, finish = self.continuation(p, params["max_tokens"], k)
                text = self.tok.decode([t for t in tokens if t != self.eos])
                lps = [-0.01 * (j + 1) for j in range(len(tokens))]
                out.append(
                    {"prompt_token_ids": p, "token_ids": tokens, "text": text, "logprobs": lps, "finish_reason": finish}
                )
        return out


class Countdown:
    """Answers each turn with an observation naming the turn; done with reward turn/10 at turn `turns`."""

    def __init__(self, turns: int = 3):
        self.turns = turns

    def reset(self, example):
        self.seen, self.example = [], example

    def step(self, turn):
        self.seen.append(turn)
        if len(self.seen) == self.turns:
            return Step(done=True, reward=len(self.seen) / 10 + self.example["bonus"])
        return Step(observation=f"turn {len(self.seen)} said {turn[:12]!r}; the rows: (1, 'ok')")


PROMPT_TEXTS = ("list the tables", "count the rows of orders")


def prompts(tok) -> list[list[int]]:
    msgs = [[{"role": "user", "content": t}] for t in PROMPT_TEXTS]
    texts = [tok.apply_chat_template(m, add_generation_prompt=True, tokenize=False) for m in msgs]
    return [tok(t, add_special_tokens=False)["input_ids"] for t in texts]  # as the loop's prompt_ids


def run(tok, sampler, turns=3, max_turns=4, budget=4096, n=2, max_tokens=40, window=None):
    template = ObservationTemplate(tok)
    params = {"n": n, "max_tokens": max_tokens, "temperature": 1.0, "seed": 7}
    examples = [{"bonus": 0.0}, {"bonus": 0.5}]
    samples = play(
        sampler.generate,
        prompts(tok),
        params,
        examples,
        lambda: Countdown(turns),
        template,
        tok.decode,
        max_turns=max_turns,
        max_response_tokens=budget,
        window=window,
    )
    return samples, template


def test_a_conversation_is_one_token_sequence_of_the_samplers_tokens(tok):
    sampler = ToySampler(tok)
    samples, template = run(tok, sampler)
    assert len(samples) == 4 and all(s["num_turns"] == 3 and s["finish_reason"] == "stop" for s in samples)
    assert [s["reward"] for s in samples] == [0.3, 0.3, 0.8, 0.8]  # the environment's, per example
    for i, s in enumerate(samples):
        # Replay: each model turn is what the sampler makes from the exact token prefix (salt: the sample's
        # index in its group for turn 1; later turns are n=1 requests, salt 0), the observation what the
        # chat template makes of the environment's answer.
        prefix, pos = list(s["prompt_token_ids"]), 0
        for turn in range(3):
            want, _ = sampler.continuation(prefix, 40, i % 2 if turn == 0 else 0)
            got = s["token_ids"][pos : pos + len(want)]
            assert got == want, (i, turn)
            assert s["loss_mask"][pos : pos + len(want)] == [1] * len(want)
            assert s["logprobs"][pos : pos + len(want)] == [-0.01 * (j + 1) for j in range(len(want))]
            prefix, pos = prefix + want, pos + len(want)
            if turn < 2:
                obs = template.ids(f"turn {turn + 1} said {s['turn_texts'][turn][:12]!r}; the rows: (1, 'ok')")
                assert s["token_ids"][pos : pos + len(obs)] == obs
                assert s["loss_mask"][pos : pos + len(obs)] == [0] * len(obs)
                assert s["logprobs"][pos : pos + len(obs)] == [0.0] * len(obs)
                prefix, pos = prefix + obs, pos + len(obs)
        assert pos == len(s["token_ids"]) == len(s["loss_mask"]) == len(s["logprobs"])
    # Decoding and encoding the conversations again does not give their tokens back: an implementation that
    # re-tokenized would have failed above.
    assert any(tok.encode(s["text"], add_special_tokens=False) != s["token_ids"] for s in samples)


def test_turn_two_on_is_one_request_per_turn_with_n_1_and_no_seed(tok):
    sampler = ToySampler(tok)
    run(tok, sampler)
    first, *later = sampler.calls
    assert first == {"n": 2, "max_tokens": 40, "temperature": 1.0, "seed": 7}  # the loop's request as made
    assert later and all(c == {"n": 1, "max_tokens": 40, "temperature": 1.0} for c in later)


def test_the_observation_is_the_chat_templates_rendering(tok):
    template = ObservationTemplate(tok)
    ids = template.ids("3 rows")
    assert tok.decode(ids) == "\n<|im_start|>user\n3 rows<|im_end|>\n<|im_start|>assistant\n"
    # Appended to a rendered assistant turn, it gives the template's own rendering of the conversation.
    conv = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "SELECT 1"}]
    turn = tok.apply_chat_template(conv, tokenize=False)
    turn = turn[: turn.rindex("<|im_end|>") + len("<|im_end|>")]
    whole = tok.apply_chat_template([*conv, {"role": "user", "content": "3 rows"}], tokenize=False)
    assert turn + tok.decode(ids) == whole + "<|im_start|>assistant\n"


def test_episodes_end_at_max_turns_and_at_the_budget_without_reward(tok):
    samples, _ = run(tok, ToySampler(tok), turns=5, max_turns=2)
    assert all(s["num_turns"] == 2 and s["finish_reason"] == "length" and s["reward"] == 0.0 for s in samples)
    samples, _ = run(tok, ToySampler(tok), turns=5, budget=60)
    assert all(s["finish_reason"] == "length" and s["reward"] == 0.0 for s in samples)
    assert all(len(s["token_ids"]) <= 60 for s in samples)
    window = 90  # the sampler's max_seq_len: prompt and response together
    samples, _ = run(tok, ToySampler(tok), turns=5, budget=None, window=window)
    assert all(s["finish_reason"] == "length" for s in samples)
    assert all(len(s["prompt_token_ids"]) + len(s["token_ids"]) <= window for s in samples)


def test_a_turn_cut_at_max_tokens_ends_its_episode_unseen_by_the_environment(tok):
    samples, _ = run(tok, ToySampler(tok), max_tokens=3)
    cut = [s for s in samples if s["finish_reason"] == "length"]
    assert cut and all(s["reward"] == 0.0 for s in cut)


def test_the_batch_takes_no_loss_on_observations(tok):
    samples, _ = run(tok, ToySampler(tok))
    batch = from_samples(samples, [0, 0, 1, 1])
    for i, s in enumerate(samples):
        r = len(s["token_ids"])
        assert batch["response_mask"][i, :r].tolist() == s["loss_mask"]
        assert batch["response_mask"][i, r:].sum() == 0 and batch["attention_mask"][i, -1] in (0, 1)
        assert torch.equal(batch["rollout_log_probs"][i, :r], torch.tensor(s["logprobs"]))
    bad = [dict(samples[0], loss_mask=samples[0]["loss_mask"][:-1])]
    with pytest.raises(ValueError, match="loss_mask has"):
        from_samples(bad, [0])


def test_environment_registry_and_steps():
    @register_env("countdown-test")
    class _C(Countdown):
        pass

    try:
        env = make_env("countdown-test", {"turns": 2})
        env.reset({"bonus": 0.0})
        assert env.step("a").observation and env.step("b") == Step(done=True, reward=0.2)
        with pytest.raises(ConfigError, match="env.options"):
            make_env("countdown-test", {"rounds": 2})
        with pytest.raises(UnknownNameError, match="countdown-test"):
            make_env("no-such-env")
    finally:
        ENVS.pop("countdown-test")
    with pytest.raises(ValueError, match="exactly one"):
        Step(observation="x", done=True, reward=1.0)
    with pytest.raises(ValueError, match="reward"):
        Step(done=True)


def test_a_tokenizer_without_chat_template_is_refused(tok):
    plain = copy.deepcopy(tok)
    plain.chat_template = None
    with pytest.raises(ConfigError, match="chat template"):
        ObservationTemplate(plain)


def test_a_prefilled_answer_opens_every_turn_and_the_environment_reads_it(tok):
    seen: list[str] = []

    class Recorder(Countdown):
        def step(self, turn):
            seen.append(turn)
            return super().step(turn)

    prefix = "```sql\nSELECT"
    samples = play(
        ToySampler(tok).generate,
        prompts(tok),
        {"n": 1, "max_tokens": 40, "seed": 1},
        [{"bonus": 0.0, "assistant_prefix": prefix}, {"bonus": 0.0, "assistant_prefix": prefix}],
        Recorder,
        ObservationTemplate(tok),
        tok.decode,
        max_turns=3,
    )
    assert len(seen) == 6 and all(t.startswith(prefix) for t in seen)
    obs = ObservationTemplate(tok).ids("3 rows", prefix)
    assert tok.decode(obs).endswith("<|im_start|>assistant\n" + prefix)
    s = samples[0]
    assert tok.decode(s["token_ids"]).count("<|im_start|>assistant\n" + prefix) == 2  # turns 2 and 3 open with it


def test_every_turn_of_a_group_carries_its_routing_key(tok):
    sampler = ToySampler(tok)
    samples, _ = run(tok, sampler)
    first, *later = sampler.keys
    assert len(first) == 2 and len(set(first)) == 2  # one key per prompt group
    for keys in later:
        assert set(keys) <= set(first)  # the same keys again: the same replicas
    assert all(s["prompt_tokens_sent"] >= len(s["prompt_token_ids"]) * s["num_turns"] for s in samples)
    other = ToySampler(tok)
    run(tok, other)
    assert not set(other.keys[0]) & set(first)  # another step's conversations are new keys
