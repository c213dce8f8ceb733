"""Scoring many completions at once: a process pool sized by the CPUs this process may use.

    scores = score_all(recipe.reward, completions, examples)   # == [recipe.reward(c, e) for c, e in ...]
    score = score_one(recipe.reward, completion, example)      # one, from one of many threads

Rewards are CPU work (SQL execution, answer parsing) and one step scores prompts x n of them, so they run
in worker processes, one per CPU in os.sched_getaffinity (Slurm's and taskset's limits, not the machine's
count), in order, with the same results as scoring them one by one. The pool starts once per process
(workers are spawned, not forked: the driver holds Ray and torch threads) and is reused every step, by every
thread (SkyRL's generator scores each batch from a thread of its own, many at once). With
one CPU, or fewer items than two, scoring stays in this process. The reward function must be importable
by name (a module-level function such as recipes.<name>.reward).
"""

from __future__ import annotations

import atexit
import math
import multiprocessing
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any

WORKERS_ENV = "ARCTIC_RL_REWARD_WORKERS"  # overrides the pool size (1 = serial)
_pools: dict[int, ProcessPoolExecutor] = {}
_pools_lock = threading.Lock()  # threads making their first call at once must not each start a pool


def num_workers() -> int:
    env = os.environ.get(WORKERS_ENV)
    if env:
        try:
            n = int(env)
        except ValueError:
            raise ValueError(f"{WORKERS_ENV}={env!r} is not an integer") from None
        if n < 1:
            raise ValueError(f"{WORKERS_ENV}={env!r} must be >= 1")
        return n
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def _pool(workers: int) -> ProcessPoolExecutor:
    with _pools_lock:
        if workers not in _pools:
            _pools[workers] = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"))
        return _pools[workers]


def _call(fn: Callable, args: tuple) -> Any:
    return fn(*args)


def score_all(fn: Callable[..., Any], *columns: Sequence[Any], workers: int | None = None) -> list[float]:
    """[float(fn(*row)) for row in zip(*columns)], in a process pool when there are CPUs to spare."""
    rows = list(zip(*columns))
    workers = workers or num_workers()
    if min(workers, len(rows)) < 2:
        return [float(fn(*row)) for row in rows]
    # One pool of `workers` whatever the batch size (a pool per size kept each one's processes alive)
    chunk = max(1, math.ceil(len(rows) / (4 * workers)))  # a few chunks per worker: even load, little IPC
    return [float(x) for x in _pool(workers).map(_call, [fn] * len(rows), rows, chunksize=chunk)]


def score_one(fn: Callable[..., Any], *args: Any) -> float:
    """float(fn(*args)) in a pool worker; callers that score from many threads at once (verl's reward loop
    runs each sample's compute_score in a thread) get as many processes."""
    workers = num_workers()
    if workers < 2:
        return float(fn(*args))
    return float(_pool(workers).submit(_call, fn, args).result())


@atexit.register
def shutdown() -> None:
    with _pools_lock:
        for pool in _pools.values():
            pool.shutdown(cancel_futures=True)
        _pools.clear()
