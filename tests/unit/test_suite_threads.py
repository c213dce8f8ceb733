"""The suite's own process computes on every core even under make test's OMP_NUM_THREADS=1 (tests/conftest.py),
while what it deploys still reads that variable."""

from __future__ import annotations

import os

import torch

from arctic_rl.config import CpuConfig


def test_the_test_process_uses_every_core_and_deployments_still_get_one_thread(monkeypatch) -> None:
    assert torch.get_num_threads() == len(os.sched_getaffinity(0))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert CpuConfig().resolved().threads == 1
