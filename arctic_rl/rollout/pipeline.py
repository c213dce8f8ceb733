"""Where the reference loop's rollouts come from: in step (sync) or one or more steps ahead (async).

Sync: step t samples with the policy of version t - 1 (the weights after t - 1 updates), then trains.

Async (`async.enable: true`, `async.max_staleness: s`): when step t asks for its rollout, the rollouts
of steps t + 1 .. t + s are submitted too (`client.submit(client.generate, ...)`), so generation of
step t + 1 runs on the sampler while step t trains on the trainer. A rollout submitted while the
sampler holds version v and trained at step u has staleness (u - 1) - v <= s. Before `sync_weights`
the loop calls `before_sync()`, which waits for the rollouts in flight: they finish on the weights
they started with, so every rollout's policy version is known exactly (and the sync never races a
generate). Overlap is generate(t + 1) with old_log_prob/ref/update_actor(t).

The loss must then correct for off-policy data (decoupled PPO): the loop keeps the sampler's
log-probs as `rollout_log_probs` (behaviour policy), recomputes `old_log_probs` with the current
trainer weights (the proximal policy), and sets `rollout_is: token` in the loss_config unless the
run config chose otherwise; the policy ratio is clipped against the proximal policy and each token
is weighted by the truncated pi_prox / pi_behaviour (see arctic_rl/losses/grpo.py).

Partial rollouts (`async.partial_rollouts: true`): arctic_rl/rollout/partial.py, where a sync lands between
chunks of the rollouts in flight instead of after them.

Known limit: a checkpoint does not hold in-flight rollouts; a resumed async run regenerates them
with the resumed weights, so its next steps are not bit-equal to an uninterrupted async run (the
sync loop's resume is exact).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass

from arctic_rl.client.client import ArcticRLClient

# (prompts as token ids, sampling params, examples) of one step
Request = tuple[list[list[int]], dict, list[dict]]
# A request's samples: one generate call, or conversations with an environment (arctic_rl.rollout.multiturn)
Sample = Callable[[list[list[int]], dict, list[dict]], list[dict]]


@dataclass
class Rollout:
    step: int
    examples: list[dict]
    samples: list[dict]  # len(examples) * n, prompt-major
    version: int  # optimizer-step count (loop steps) of the weights that sampled it
    wait_s: float  # time the loop waited for it (the whole generate in sync mode)
    gen_s: float  # time the generate itself took
    # Per example, where its groups come from different draws (dynamic sampling: arctic_rl.rollout.dynamic);
    # None: every group was sampled by `version`.
    group_versions: list[int] | None = None

    def row_versions(self, n: int) -> list[int]:
        """The policy version of each sample (n per example, prompt-major)."""
        if (
            self.samples and "token_versions" in self.samples[0]
        ):  # partial rollouts: a row is as old as its oldest token
            return [min(s["token_versions"], default=self.version) for s in self.samples]
        if self.group_versions is None:
            return [self.version] * len(self.samples)
        return [v for v in self.group_versions for _ in range(n)]


class SyncRollouts:
    def __init__(self, client: ArcticRLClient, make_request: Callable[[int], Request], sample: Sample | None = None):
        self.client, self.make_request = client, make_request
        self.sample = sample or (lambda prompts, params, examples: client.generate(prompts, params))

    def get(self, step: int) -> Rollout:
        prompts, params, examples = self.make_request(step)
        t0 = time.perf_counter()
        samples = self.sample(prompts, params, examples)
        dt = time.perf_counter() - t0
        return Rollout(step, examples, samples, version=step - 1, wait_s=dt, gen_s=dt)

    def before_sync(self) -> None:
        pass

    def after_sync(self) -> None:
        pass

    def close(self) -> None:
        pass


class AsyncRollouts:
    """Rollouts generated up to `max_staleness` steps ahead of training (see the module docstring)."""

    def __init__(
        self, client: ArcticRLClient, make_request: Callable[[int], Request], max_staleness: int, last_step: int
    ):
        if max_staleness < 1:
            raise ValueError(f"async.max_staleness must be >= 1, got {max_staleness}")
        self.client, self.make_request = client, make_request
        self.max_staleness, self.last_step = max_staleness, last_step
        # step -> (future, examples, sampler version at submit, submit time, [done time])
        self.inflight: dict[int, tuple[Future, list[dict], int, float, list[float]]] = {}
        self._last_done = 0.0

    def _submit(self, step: int, version: int) -> None:
        prompts, params, examples = self.make_request(step)
        fut = self.client.submit(self.client.generate, prompts, params)
        done: list[float] = []
        fut.add_done_callback(lambda _f: done.append(time.perf_counter()))
        self.inflight[step] = (fut, examples, version, time.perf_counter(), done)

    def get(self, step: int) -> Rollout:
        version = step - 1  # the sampler holds the weights after step - 1 updates
        for ahead in range(step, min(step + self.max_staleness, self.last_step) + 1):
            if ahead not in self.inflight:
                self._submit(ahead, version)
        t0 = time.perf_counter()
        fut, examples, v, submitted, done = self.inflight.pop(step)
        samples = fut.result()
        wait = time.perf_counter() - t0
        # Generates run one after another on the sampler: this one began when it was submitted or
        # when the previous one finished, whichever is later.
        end = done[0] if done else time.perf_counter()
        gen_s = end - max(submitted, self._last_done)
        self._last_done = end
        return Rollout(step, examples, samples, version=v, wait_s=wait, gen_s=gen_s)

    def before_sync(self) -> None:
        for fut, *_ in self.inflight.values():
            fut.result()

    def after_sync(self) -> None:
        pass

    def close(self) -> None:
        for fut, *_ in self.inflight.values():
            fut.cancel()
            try:
                fut.result()
            except Exception:  # a cancelled or failed look-ahead rollout is no longer needed
                pass
        self.inflight.clear()
