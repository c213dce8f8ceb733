"""Partial rollouts (arctic_rl.rollout.partial) against a deterministic toy sampler: each next token is a function
of the exact prefix and of the weights' version, so a continued sample shows whether it was continued from its
own tokens under the version that was loaded. The same class runs on the real vLLM sampler in
tests/e2e/test_partial_rollouts.py."""

from __future__ import annotations

import hashlib
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from arctic_rl.batch import from_samples
from arctic_rl.rollout.partial import PartialRollouts, _Sample, _Step, stop_across
from arctic_rl.rollout.pipeline import Rollout

EOS = 0
STOP = "be"  # a stop string of two tokens' text: it may be split between two chunks


def next_token(prefix: list[int], version: int) -> int:
    digest = hashlib.sha256(f"{prefix}/{version}".encode()).digest()
    return digest[0] % 16 if digest[0] % 16 < 10 else 1 + digest[1] % 9  # EOS (0) about one token in 16


def text_of(tokens: list[int]) -> str:
    return "".join(" abcdefghi"[t] for t in tokens if t)


class ToySampler:
    """generate with vLLM's semantics for what the class reads: n samples per prompt (prompt-major), max_tokens,
    EOS ends a sample (finish 'stop'), a stop string ends it with its text cut before the stop and its tokens
    through the one completing it (finish 'stop'), else 'length'. The weights' version moves the tokens."""

    def __init__(self, delay_s: float = 0.0, eos: bool = True):
        self.version, self.delay_s, self.eos, self.calls = 0, delay_s, eos, []
        self._pool = ThreadPoolExecutor(max_workers=2)

    def submit(self, op, *args, **kwargs):
        return self._pool.submit(op, *args, **kwargs)

    def generate(self, prompts, params):
        self.calls.append(dict(params))
        time.sleep(self.delay_s)
        out = []
        for p in prompts:
            for _ in range(params.get("n", 1)):
                tokens: list[int] = []
                finish = "length"
                while len(tokens) < params["max_tokens"]:
                    t = next_token(p + tokens, self.version) or (0 if self.eos else 1)
                    tokens.append(t)
                    if t == EOS:
                        finish = "stop"
                        break
                    if any(s in text_of(tokens) for s in params.get("stop") or []):
                        finish = "stop"
                        break
                text = text_of(tokens)
                for s in params.get("stop") or []:
                    text = text.split(s)[0]
                lps = [-0.1 * (self.version + 1)] * len(tokens)
                out.append(
                    {"prompt_token_ids": p, "token_ids": tokens, "text": text, "logprobs": lps, "finish_reason": finish}
                )
        return out

    def sync(self, rollouts: PartialRollouts) -> None:
        rollouts.before_sync()
        self.version += 1
        rollouts.after_sync()


PROMPTS = [[3, 1, 4], [1, 5, 9], [2, 6, 5], [3, 5, 8]]


def request(stop: list[str], max_tokens: int = 40, n: int = 2):
    def make(step: int):
        prompts = [PROMPTS[(step + i) % len(PROMPTS)] for i in range(2)]
        return prompts, {"n": n, "max_tokens": max_tokens, "stop": stop, "seed": step}, [{"i": i} for i in range(2)]

    return make


def test_chunks_equal_one_request_token_by_token() -> None:
    """No sync in between: chunked generation yields what one request per prompt yields, token for token, with the
    same text, log-probs and finish, including samples whose stop string is split between two chunks."""
    toy = ToySampler()
    make = request([STOP])
    r = PartialRollouts(toy, make, max_staleness=1, last_step=4, chunk_tokens=3, decode=text_of)  # type: ignore[arg-type]
    split = 0
    for step in (1, 2, 3):
        got = r.get(step).samples
        prompts, params, _ = make(step)
        want = toy.generate(prompts, params)
        assert [s["token_ids"] for s in got] == [w["token_ids"] for w in want]
        assert [s["text"] for s in got] == [w["text"] for w in want]
        assert [s["finish_reason"] for s in got] == [w["finish_reason"] for w in want]
        assert [s["logprobs"] for s in got] == [w["logprobs"] for w in want]
        for w in want:
            full = text_of(w["token_ids"])
            split += w["finish_reason"] == "stop" and STOP in full and full.index(STOP) % 3 == 2
    r.close()
    assert split, "no sample had its stop split between chunks: the case the class must handle is not exercised"
    assert any("seed" not in c and c.get("n", 1) == 1 for c in toy.calls)  # continued samples: n=1, no seed


def test_a_sync_lands_mid_rollout_and_samples_continue_from_their_own_tokens() -> None:
    toy = ToySampler(delay_s=0.005, eos=False)  # every sample runs to max_tokens: 10 chunks
    r = PartialRollouts(toy, request([]), max_staleness=1, last_step=3, chunk_tokens=4)  # type: ignore[arg-type]
    r.get(1)  # step 2's first chunk was submitted when step 1 finished, under version 0
    toy.sync(r)
    rollout = r.get(2)
    r.close()
    for s in rollout.samples:
        versions = s["token_versions"]
        assert versions[0] == 0 and versions[-1] == 1 and versions == sorted(versions)
        for i, (t, v) in enumerate(zip(s["token_ids"], versions)):
            assert t == (
                next_token(s["prompt_token_ids"] + s["token_ids"][:i], v) or 1
            )  # the exact prefix, that version
        assert s["logprobs"] == [-0.1 * (v + 1) for v in versions]  # each token's behaviour log-prob, its version
    assert rollout.version == 0 and rollout.row_versions(2) == [0] * len(rollout.samples)
    batch = from_samples(rollout.samples, list(range(len(rollout.samples))))
    rpv = batch["rollout_policy_version"]
    assert (
        set(rpv[batch["response_mask"].bool()].tolist()) == {0, 1} and (rpv[~batch["response_mask"].bool()] == -1).all()
    )


def test_samples_beyond_the_staleness_bound_are_regenerated_never_trained_on() -> None:
    toy = ToySampler(delay_s=0.005, eos=False)
    r = PartialRollouts(toy, request([]), max_staleness=1, last_step=3, chunk_tokens=4)  # type: ignore[arg-type]
    r.get(1)
    toy.sync(r)
    toy.sync(r)  # two versions since step 2's first chunk: its version-0 tokens are 2 behind
    rollout = r.get(2)
    r.close()
    for s in rollout.samples:
        assert set(s["token_versions"]) == {2}
        assert s["token_ids"][0] == (next_token(s["prompt_token_ids"], 2) or 1)


def test_drop_removes_only_the_stale_groups() -> None:
    r = PartialRollouts(None, None, max_staleness=1, last_step=1, chunk_tokens=4, stale="drop")  # type: ignore[arg-type]
    r.version = 2
    samples = [_Sample([1], [5], [-0.1], [v], "x", "stop") for v in (0, 2, 1, 2)]
    st = _Step([{"g": 0}, {"g": 1}], {"n": 2, "max_tokens": 4}, [[1], [1]], samples)
    r._enforce_staleness(st)
    assert st.examples == [{"g": 1}] and [s.versions for s in st.samples] == [[1], [2]]


def test_stop_across_finds_only_a_stop_split_at_the_boundary() -> None:
    assert stop_across("xxb", "ayy", ["ba"]) == 2
    assert stop_across("xx", "bay", ["ba"]) is None  # wholly in the new chunk: the sampler's to find
    assert stop_across("xbax", "y", ["ba"]) is None  # wholly before: found already


def test_rollout_rows_are_as_old_as_their_oldest_token() -> None:
    samples = [{"token_versions": [3, 4]}, {"token_versions": [4]}]
    assert Rollout(5, [{}], samples, version=3, wait_s=0, gen_s=0).row_versions(2) == [3, 4]


@pytest.mark.parametrize("bad", [{"max_staleness": 0}, {"chunk_tokens": 0}, {"stale": "keep"}])
def test_bad_settings_name_the_key(bad: dict) -> None:
    kwargs = {"max_staleness": 1, "chunk_tokens": 4, "stale": "regenerate", **bad}
    with pytest.raises(ValueError, match=f"async.{next(iter(bad))}"):
        PartialRollouts(None, None, last_step=1, **kwargs)  # type: ignore[arg-type]


def test_partial_rollouts_need_async() -> None:
    from arctic_rl.errors import ConfigError
    from arctic_rl.runconfig import parse_run_config

    base = {
        "model": {"name_or_path": "m"},
        "train": {"steps": 1, "prompts_per_step": 1},
        "recipe": {"name": "text2sql"},
    }
    with pytest.raises(ConfigError, match="partial_rollouts=true needs async.enable=true"):
        parse_run_config({**base, "async": {"partial_rollouts": True}})
    assert parse_run_config({**base, "async": {"enable": True, "partial_rollouts": True}}).async_.chunk_tokens >= 1


def test_a_failed_chunk_is_raised_to_the_loop_not_lost_in_a_callback() -> None:
    class Broken(ToySampler):
        def generate(self, prompts, params):
            if "seed" not in params:  # the first continuation chunk
                raise RuntimeError("sampler died")
            return super().generate(prompts, params)

    r = PartialRollouts(Broken(eos=False), request([]), 1, 2, 4)  # type: ignore[arg-type]
    raised = get_within(r, 1)
    assert isinstance(raised, RuntimeError) and "sampler died" in str(raised)
    r.close()


def get_within(r: PartialRollouts, step: int, timeout_s: float = 20.0) -> BaseException | None:
    """r.get(step) in a thread: what it raised (None if it returned); fails the test if it hangs."""
    raised: list[BaseException] = []

    def get() -> None:
        try:
            r.get(step)
        except BaseException as e:  # noqa: BLE001
            raised.append(e)

    t = threading.Thread(target=get, daemon=True)
    t.start()
    t.join(timeout=timeout_s)
    assert not t.is_alive(), f"get({step}) hung on a chunk that failed"
    return raised[0] if raised else None


def test_an_answer_that_breaks_the_chain_is_raised_not_hung_on() -> None:
    """A chunk whose answer cannot be applied (here: fewer samples than asked) fails get(); the error is raised
    in a Future's callback thread, where it would otherwise be lost and get() wait forever."""

    class Short(ToySampler):
        def generate(self, prompts, params):
            out = super().generate(prompts, params)
            return out if "seed" in params else out[:-1]

    r = PartialRollouts(Short(eos=False), request([]), 1, 2, 4)  # type: ignore[arg-type]
    assert isinstance(get_within(r, 1), ValueError)
    r.close()
