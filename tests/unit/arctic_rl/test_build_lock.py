"""A JIT build killed midway leaves torch's build lock behind; torch then waits for it forever, and every
engine start with it. await_build_lock removes a lock no live build owns, and waits for one a build does."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest

from arctic_rl.engines import build_lock
from arctic_rl.engines.build_lock import await_build_lock, build_folder

NAME = "deepspeed_shm_comm"
# The child says "ready" once torch is imported, so only the wait is timed: the import alone can take longer than
# the wait's limit on a loaded machine (it did in CI, with the e2e suite beside it).
WAIT = (
    "from torch.utils.file_baton import FileBaton; import sys; print('ready', flush=True); "
    "FileBaton(sys.argv[1]).wait()"
)


@pytest.fixture
def lock(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.setattr(build_lock, "POLL_S", 0.05)
    folder = build_folder(NAME)
    assert folder.is_relative_to(tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "lock"
    path.touch()
    old = time.time() - 3600
    os.utime(path, (old, old))  # left an hour ago
    return path


def torch_waits(lock) -> bool:
    """Whether torch's own wait on the lock (what every later load of the op does) is still waiting 3 s after it
    began (torch's import not counted)."""
    child = subprocess.Popen([sys.executable, "-c", WAIT, str(lock)], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        child.wait(timeout=3)
    except subprocess.TimeoutExpired:
        return True
    finally:
        child.kill()
        child.wait()
    return False


def test_a_dead_builds_lock_is_removed_and_torch_no_longer_waits(lock):
    assert torch_waits(lock)  # what an engine start did before: hang
    assert await_build_lock(NAME) is True
    assert not lock.exists()
    assert not torch_waits(lock)


def test_a_live_builds_lock_is_waited_for(lock):
    # a process working in the build folder, as ninja does while it builds
    build = subprocess.Popen(["sleep", "30"], cwd=lock.parent)
    try:
        done = threading.Event()
        waiter = threading.Thread(target=lambda: (await_build_lock(NAME), done.set()), daemon=True)
        waiter.start()
        assert not done.wait(1.0) and lock.exists()  # an hour old, but its build runs: kept
    finally:
        build.kill()
        build.wait()
    assert done.wait(10) and not lock.exists()  # the build died: the lock is stale now


def test_a_young_lock_is_left_to_its_build(lock):
    os.utime(lock)  # just taken: the build may not have started ninja yet
    result = []
    waiter = threading.Thread(target=lambda: result.append(await_build_lock(NAME, min_age_s=600)), daemon=True)
    waiter.start()
    time.sleep(0.5)
    assert lock.exists() and not result
    lock.unlink()  # the build ends and releases it
    waiter.join(5)
    assert result == [False]


def test_no_lock_returns_at_once(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    assert await_build_lock(NAME) is False
