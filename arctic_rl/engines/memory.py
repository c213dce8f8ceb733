"""An engine process's own memory, as the kernel counts it (for health() and for checking `arctic-rl plan`).

CPU torch keeps no allocator counters (torch.cuda.max_memory_allocated has no CPU counterpart), so an engine
counts resident memory: VmRSS and its high-water mark VmHWM from /proc/self/status. An engine marks its
baseline once its libraries are imported and its process group is up, before it loads any weights; the mark
resets the kernel's high-water mark to the RSS of that moment (clear_refs 5), so `peak_extra` (VmHWM - the
baseline) is the most the engine's own state (weights, gradients, optimizer state, KV cache, activations)
ever added to the process. On CUDA the same report also gives torch's own device counter.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import torch


def _status_bytes(field: str) -> int | None:
    try:
        lines = Path("/proc/self/status").read_text().splitlines()
    except OSError:  # not Linux: no such counters
        return None
    for line in lines:
        if line.startswith(field + ":"):
            return int(line.split()[1]) << 10
    return None


class MemoryMark:
    """The RSS baseline of an engine process, taken before its weights load."""

    def __init__(self) -> None:
        try:
            Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS now
        except OSError:  # not Linux, or a kernel without it: the peak then counts from the process's start
            pass
        self.baseline = _status_bytes("VmRSS")
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()

    def report(self) -> dict[str, int | None]:
        """Bytes: baseline_rss, rss, peak_rss, peak_extra (peak_rss - baseline_rss); on CUDA also
        cuda_max_allocated (torch.cuda.max_memory_allocated since the mark)."""
        rss, peak = _status_bytes("VmRSS"), _status_bytes("VmHWM")
        out: dict[str, int | None] = {"baseline_rss": self.baseline, "rss": rss, "peak_rss": peak, "peak_extra": None}
        if peak is not None and self.baseline is not None:
            out["peak_extra"] = peak - self.baseline
        if torch.cuda.is_available():
            out["cuda_max_allocated"] = int(torch.cuda.max_memory_allocated())
        return out


# glibc's mallopt parameters (malloc.h): M_MMAP_THRESHOLD, and the largest value its dynamic threshold reaches on
# 64-bit (DEFAULT_MMAP_THRESHOLD_MAX).
_M_MMAP_THRESHOLD = -3
_MMAP_THRESHOLD_DURING_SYNC = 1 << 20
_MMAP_THRESHOLD_AFTER = 32 << 20


def _libc():
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None
    return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None  # glibc only


@contextlib.contextmanager
def freed_memory_returned() -> Iterator[None]:
    """Around a weight sync in an engine process: host allocations of 1 MiB or more get pages of their own from
    the kernel and give them back when freed, and free heap pages are trimmed after it. glibc's default serves such
    an allocation from the heap once a chunk of that size has been freed (its mmap threshold follows the largest
    chunk freed, up to 32 MiB), and a freed heap chunk stays resident: a sync's bucket-sized transients stayed in
    the sampler after the sync, a little more at every sync, and its first sync peaked over half the model
    (tests/e2e/test_weight_sync_memory.py). Outside a sync the threshold is left at that 32 MiB, where the default
    settles in a torch process anyway, so a step's allocations keep reusing the heap. A no-op without glibc."""
    libc = _libc()
    if libc is None:
        yield
        return
    libc.mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_DURING_SYNC)
    try:
        yield
    finally:
        libc.mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_AFTER)
        libc.malloc_trim(0)
