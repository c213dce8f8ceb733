"""The lock a killed JIT build leaves behind.

DeepSpeed builds some ops on first use with torch's cpp_extension (on a CPU, every `init_distributed` loads its
shared-memory all-reduce, `deepspeed_shm_comm`). torch guards the build folder with a `lock` file and, in every
later load, waits for that file to go, without limit and without a word. A build killed midway (Ray's memory
monitor, a Ctrl-C, a preempted job) leaves the file behind, and from then on every engine start on the machine
hangs. The lock holds no owner, so it is judged by what can be seen: torch runs the build (ninja) with the build
folder as its working directory, so a lock with no process working in its folder, older than a build's first
seconds, has no owner left and is removed.

A home folder shared between hosts shares the build folder too, and a build on another host is not visible here;
`TORCH_EXTENSIONS_DIR` on local disk (one per host) keeps builds apart.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

# A lock younger than this may belong to a build that has not started ninja yet (torch writes the ninja file first).
MIN_STALE_AGE_S = 60.0
POLL_S = 2.0


def build_folder(name: str) -> Path:
    from torch.utils.cpp_extension import _get_build_directory

    return Path(_get_build_directory(name, verbose=False))


def building_in(folder: Path) -> bool:
    """Whether a live process on this host works in `folder`."""
    target = folder.resolve()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if Path(os.readlink(proc / "cwd")) == target:
                return True
        except OSError:  # gone meanwhile, or not ours to read
            continue
    return False


def await_build_lock(name: str, min_age_s: float = MIN_STALE_AGE_S) -> bool:
    """Returns once op `name`'s build folder holds no lock: a live build's lock goes when the build ends, and a
    dead build's is removed once it is `min_age_s` old. True when a stale lock was removed."""
    lock = build_folder(name) / "lock"
    while True:
        try:
            age = time.time() - lock.stat().st_mtime
        except FileNotFoundError:
            return False
        if age >= min_age_s and not building_in(lock.parent):
            lock.unlink(missing_ok=True)
            print(
                f"[arctic-rl] removed {lock}: left {age:.0f}s ago by a build that no longer runs "
                "(torch would have waited for it forever)",
                flush=True,
            )
            return True
        time.sleep(POLL_S)
