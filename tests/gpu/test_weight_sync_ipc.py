"""Bucketed weight sync over CUDA IPC between two processes on one GPU delivers identical weights
(tests/gpu/ipc_sync.py; scripts/gpu_check.sh runs it on a CUDA machine, skipped everywhere else)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from repo_paths import REPO

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="GPU checks (scripts/gpu_check.sh)"),
]


def test_bucketed_sync_over_cuda_ipc_delivers_identical_weights():
    out = subprocess.run(
        [sys.executable, str(REPO / "tests" / "gpu" / "ipc_sync.py"), "--bucket-kib", "1024"],
        capture_output=True,
        text=True,
        timeout=240,
    )
    print(out.stdout, out.stderr)
    assert out.returncode == 0, out.stdout + out.stderr
    assert " 0 differ" in out.stdout
