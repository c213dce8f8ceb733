"""Continuous generation with partial rollouts (`async.enable` and `async.partial_rollouts`).

The sampler always has work: the rollouts of steps t .. t + max_staleness are generated one chunk of
`async.chunk_tokens` tokens at a time, the next chunk submitted as soon as the last returns, while the trainer
trains step t. A weight sync does not wait for whole rollouts: `before_sync` stops submitting and waits for
the one chunk in flight, the sync loads the new weights, `after_sync` continues every unfinished sample under
them. A continued sample keeps its tokens and its behaviour log-probs: its next chunk's prompt is the prompt
plus the tokens so far, as token ids (token in, token out: nothing is decoded and encoded again), so the trainer
scores exactly the tokens the sampler produced. Each token records the policy version that produced it
(`token_versions` in the sample, `rollout_policy_version` in the batch), and the loss sees per-token behaviour
log-probs from whichever version produced each token.

A sample whose oldest token is more than max_staleness versions behind the trainer when its step trains is
never trained on: `async.stale: regenerate` generates it again from its prompt under the current weights,
`drop` drops its prompt's group (and regenerates only when every group would go).

Sampling: a step's first chunk is its request as the loop made it (n samples per prompt, the step's seed);
the chunks that continue a sample are one request each with n = 1 and no seed, since one seed for every
continued sample would give them all the same random draws. A run in this mode is therefore not reproducible
bit for bit (where the syncs fall in the chunks depends on timing anyway). Stop strings are checked across chunk
boundaries too: a stop split between two chunks ends the sample where a single request would have.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field

from arctic_rl.client.client import ArcticRLClient
from arctic_rl.rollout.pipeline import Request, Rollout


@dataclass
class _Sample:
    prompt: list[int]
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None  # None: still generating

    def as_dict(self) -> dict:
        return {
            "prompt_token_ids": self.prompt,
            "token_ids": self.tokens,
            "text": self.text,
            "logprobs": self.logprobs,
            "finish_reason": self.finish_reason,
            "token_versions": self.versions,
        }


@dataclass
class _Step:
    examples: list[dict]
    params: dict
    prompts: list[list[int]]
    samples: list[_Sample] = field(default_factory=list)  # empty until the first chunk returns
    submitted: float = 0.0
    gen_s: float = 0.0

    def unfinished(self) -> list[_Sample]:
        return [s for s in self.samples if s.finish_reason is None]

    def done(self) -> bool:
        return bool(self.samples) and not self.unfinished()


def stop_across(before: str, new: str, stops: list[str]) -> int | None:
    """Where a stop string that starts in `before` and ends in `new` begins (an index into before + new), or
    None. A stop wholly inside `new` is the sampler's to find; one wholly inside `before` was found already."""
    text = before + new
    best = None
    for stop in stops:
        start = max(0, len(before) - len(stop) + 1)
        i = text.find(stop, start)
        if i != -1 and i < len(before) and (best is None or i < best):
            best = i
    return best


class PartialRollouts:
    """Rollouts generated continuously, chunk by chunk, across weight syncs (see the module docstring)."""

    def __init__(
        self,
        client: ArcticRLClient,
        make_request: Callable[[int], Request],
        max_staleness: int,
        last_step: int,
        chunk_tokens: int,
        stale: str = "regenerate",
        decode: Callable[[list[int]], str] | None = None,
    ):
        if max_staleness < 1:
            raise ValueError(f"async.max_staleness must be >= 1, got {max_staleness}")
        if chunk_tokens < 1:
            raise ValueError(f"async.chunk_tokens must be >= 1, got {chunk_tokens}")
        if stale not in ("regenerate", "drop"):
            raise ValueError(f"async.stale must be 'regenerate' or 'drop', got {stale!r}")
        self.client, self.make_request = client, make_request
        self.max_staleness, self.last_step, self.chunk = max_staleness, last_step, chunk_tokens
        self.stale, self.decode = stale, decode
        self.version = 0  # syncs the sampler has received (set from the first step asked for)
        self.steps: dict[int, _Step] = {}
        self._cv = threading.Condition()
        self._inflight: Future | None = None
        self._paused = False
        self._error: BaseException | None = None
        self.chunks = 0  # generate calls made (a metric)

    # -- the chain of chunks ------------------------------------------------------------------------------------
    def _next_work(self) -> tuple[int, _Step] | None:
        for step in sorted(self.steps):
            if not self.steps[step].done():
                return step, self.steps[step]
        return None

    def _pump(self) -> None:
        """Submits the next chunk unless one is in flight, the chain is paused or there is nothing to do.
        Called with the lock held."""
        if self._inflight is not None or self._paused or self._error is not None:
            return
        work = self._next_work()
        if work is None:
            return
        step, st = work
        if not st.samples:  # the step's first chunk: its request as made, n samples per prompt
            prompts, params = st.prompts, {**st.params, "max_tokens": min(self.chunk, st.params["max_tokens"])}
            targets = None
            st.submitted = time.perf_counter()
        else:
            targets = st.unfinished()
            prompts = [s.prompt + s.tokens for s in targets]
            left = min(st.params["max_tokens"] - len(s.tokens) for s in targets)
            params = {k: v for k, v in st.params.items() if k not in ("seed", "n")}
            params["max_tokens"] = min(self.chunk, left)
        version = self.version
        fut = self.client.submit(self.client.generate, prompts, params)
        self._inflight = fut
        self.chunks += 1
        fut.add_done_callback(lambda f: self._landed(f, st, targets, version))

    def _landed(self, fut: Future, st: _Step, targets: list[_Sample] | None, version: int) -> None:
        with self._cv:
            self._inflight = None
            try:
                out = fut.result()
                if targets is None:
                    n = st.params.get("n", 1)
                    st.samples = [_Sample(list(p)) for p in st.prompts for _ in range(n)]
                    targets = st.samples
                for s, o in zip(targets, out, strict=True):
                    self._append(st, s, o, version)
                if st.done():
                    st.gen_s = time.perf_counter() - st.submitted
                self._pump()
            except BaseException as e:  # noqa: BLE001 - raised to whoever waits (a callback's error would be lost)
                self._error = e
            self._cv.notify_all()

    def _append(self, st: _Step, s: _Sample, o: dict, version: int) -> None:
        new = list(o["token_ids"])
        stops = list(st.params.get("stop") or [])
        cut = stop_across(s.text, o["text"], stops)
        if cut is not None and self.decode is not None:
            # The stop began in the earlier chunk: keep the tokens up to the one whose text completes it.
            base = self.decode(s.tokens)
            for k in range(1, len(new) + 1):
                if stop_across(base, self.decode(s.tokens + new[:k])[len(base) :], stops) is not None:
                    new = new[:k]
                    break
        s.tokens += new
        s.logprobs += list(o["logprobs"])[: len(new)]
        s.versions += [version] * len(new)
        if cut is not None:
            s.text, s.finish_reason = (s.text + o["text"])[:cut], "stop"
            return
        s.text += o["text"]
        if o["finish_reason"] == "length" and len(s.tokens) < st.params["max_tokens"]:
            return  # only this chunk's budget ran out: the sample goes on
        s.finish_reason = o["finish_reason"]

    def _wait(self, until: Callable[[], bool]) -> None:
        with self._cv:
            while not until():
                if self._error is not None:
                    raise self._error
                self._cv.wait(timeout=1.0)
            if self._error is not None:
                raise self._error

    # -- what the loop calls ------------------------------------------------------------------------------------
    def get(self, step: int) -> Rollout:
        t0 = time.perf_counter()
        with self._cv:
            if not self.steps:
                self.version = step - 1  # the sampler holds the weights after step - 1 updates
            for ahead in range(step, min(step + self.max_staleness, self.last_step) + 1):
                if ahead not in self.steps:
                    prompts, params, examples = self.make_request(ahead)
                    self.steps[ahead] = _Step(examples, dict(params), [list(p) for p in prompts])
            self._pump()
        self._wait(lambda: self.steps[step].done())
        st = self.steps[step]
        self._enforce_staleness(st)
        with self._cv:  # the chain iterates the steps under the lock
            self.steps.pop(step)
        samples = [s.as_dict() for s in st.samples]
        oldest = min((v for s in st.samples for v in s.versions), default=self.version)
        return Rollout(step, st.examples, samples, version=oldest, wait_s=time.perf_counter() - t0, gen_s=st.gen_s)

    def _enforce_staleness(self, st: _Step) -> None:
        def stale(s: _Sample) -> bool:
            return bool(s.versions) and self.version - min(s.versions) > self.max_staleness

        n = st.params.get("n", 1)
        groups = [st.samples[i * n : (i + 1) * n] for i in range(len(st.examples))]
        bad = [any(stale(s) for s in g) for g in groups]
        if not any(bad):
            return
        if self.stale == "drop" and not all(bad):
            st.examples = [e for e, b in zip(st.examples, bad) if not b]
            st.samples = [s for g, b in zip(groups, bad) if not b for s in g]
            return
        with self._cv:  # regenerate from the prompt, under the current weights, before anything else
            for s in st.samples:
                if stale(s):
                    s.tokens, s.logprobs, s.versions, s.text, s.finish_reason = [], [], [], "", None
            self._pump()
        self._wait(st.done)

    def before_sync(self) -> None:
        """No chunk starts until after_sync; the one in flight finishes on the weights it started with."""
        with self._cv:
            self._paused = True
        self._wait(lambda: self._inflight is None)

    def after_sync(self) -> None:
        with self._cv:
            self.version += 1
            self._paused = False
            self._pump()

    def close(self) -> None:
        with self._cv:
            self._paused = True
        try:
            self._wait(lambda: self._inflight is None)
        except BaseException:  # noqa: BLE001 - a failed look-ahead chunk is no longer needed
            pass
        with self._cv:
            self.steps.clear()
