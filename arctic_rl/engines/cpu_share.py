"""An engine actor's cores on a CPU node, applied as the actor starts. The controller's placer decides the share
(arctic_rl.server.placement.cpu_shares) and hands it over in the actor's environment: OMP_NUM_THREADS, which every
thread's OpenMP runtime reads when it starts, and CORES_ENV, the slice of the node's cores to pin to."""

from __future__ import annotations

import os

CORES_ENV = "ARCTIC_RL_CPU_CORES"  # "start:stop" over the process's allowed cores, ascending


def share_env(threads: int, cores: tuple[int, int] | None) -> dict[str, str]:
    """The actor environment that carries a share."""
    env = {"OMP_NUM_THREADS": str(threads)}
    if cores is not None:
        env[CORES_ENV] = f"{cores[0]}:{cores[1]}"
    return env


def apply_cpu_share() -> dict:
    """Pins every thread of this process to its slice of cores (threads started later inherit it) and sets
    torch's intra-op threads; returns what cpu_now() reads afterwards. Call first in the actor's
    __init__, before torch computes anything (its OpenMP pool starts on the first parallel region). A node with
    fewer allowed cores than Ray counts (a cpuset, taskset) keeps what it has: the slice is clipped, never empty."""
    import torch

    cores = sorted(os.sched_getaffinity(0))
    spec = os.environ.get(CORES_ENV)
    if spec:
        start, stop = (int(x) for x in spec.split(":"))
        mine = cores[start:stop] or cores[-1:]
        for tid in os.listdir("/proc/self/task"):  # sched_setaffinity(0) would pin the calling thread only
            try:
                os.sched_setaffinity(int(tid), mine)
            except (ProcessLookupError, PermissionError):  # a thread that ended meanwhile
                pass
        cores = mine
    threads = min(int(os.environ.get("OMP_NUM_THREADS") or 1), len(cores))
    torch.set_num_threads(threads)
    return cpu_now()


def cpu_now() -> dict:
    """What this process computes on now (for the engine's ping): torch's threads and the allowed cores."""
    import torch

    return {"threads": torch.get_num_threads(), "cores": sorted(os.sched_getaffinity(0))}
