"""CPU kernel for cascade decode: R query rows per (row, KV head) over keys read in place from a
paged (vLLM-CPU) or contiguous KV cache, with the log-sum-exp. See group_attention.cpp for why.

It is compiled on first use with the system C++ compiler (-O3 -march=native, so the library is
keyed by this CPU's flags as well as the source) into ~/.cache/arctic-rl/kernels, written under a
temporary name and renamed, so concurrent first uses never load a half-written file. Without a
compiler, or with ARCTIC_RL_CPU_KERNEL=0, `load()` is None and callers take their torch path.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from functools import lru_cache
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

_SRC = Path(__file__).with_name("group_attention.cpp")
_FLAGS = ["-O3", "-march=native", "-std=c++17", "-shared", "-fPIC", "-ffp-contract=fast", "-fopenmp"]
_build_lock = threading.Lock()
LANES = 16  # W in group_attention.cpp: rows per register, keys per tile


class _Job(ctypes.Structure):
    _fields_ = (
        [
            (n, ctypes.c_void_p)
            for n in ("q", "k", "v", "out", "lse", "init_out", "init_lse", "blocks", "starts", "ends")
        ]
        + [
            (n, ctypes.c_int64)
            for n in (
                "B",
                "H",
                "R",
                "D",
                "bs",
                "bt_sb",
                "q_sb",
                "q_sh",
                "q_sr",
                "k_sblk",
                "k_sh",
                "k_st",
                "k_sd",
                "v_sblk",
                "v_sh",
                "v_st",
                "v_sd",
            )
        ]
        + [("scale", ctypes.c_float)]
    )


def _cpu_identity() -> str:
    """-march=native code is only valid on CPUs with the same features (a shared home directory may
    serve several node types)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        return "\n".join(sorted({ln for ln in lines if ln.startswith(("flags", "model name"))}))
    except OSError:
        return platform.processor() or platform.machine()


@lru_cache(maxsize=1)
def load() -> ctypes.CDLL | None:
    """The compiled kernel, building it if needed; None (with one warning) if it cannot be built."""
    if os.environ.get("ARCTIC_RL_CPU_KERNEL", "1") == "0":
        return None
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        logger.warning("no C++ compiler: ZoRRo's CPU cascade kernel is off (torch path instead)")
        return None
    key = hashlib.sha256(_SRC.read_bytes() + " ".join([cxx, *_FLAGS]).encode() + _cpu_identity().encode())
    folder = Path(os.environ.get("ARCTIC_RL_KERNEL_CACHE", Path.home() / ".cache" / "arctic-rl" / "kernels"))
    lib = folder / f"zorro_group_attention-{key.hexdigest()[:16]}.so"
    with _build_lock:
        if not lib.exists():
            folder.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(suffix=".so", dir=folder)
            os.close(fd)
            try:
                run = subprocess.run([cxx, *_FLAGS, str(_SRC), "-o", tmp], capture_output=True, text=True)
                if run.returncode != 0:
                    logger.warning("building ZoRRo's CPU kernel failed (torch path instead):\n%s", run.stderr[-2000:])
                    return None
                os.replace(tmp, lib)
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
    dll = ctypes.CDLL(str(lib))
    dll.zorro_group_attention.argtypes = [ctypes.POINTER(_Job), ctypes.c_int]
    dll.zorro_group_attention.restype = ctypes.c_int
    return dll


def paged_group_attention(
    q: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_table: torch.Tensor | None,
    starts: torch.Tensor,
    ends: torch.Tensor,
    scale: float,
    *,
    key_t_in_block: bool,
    init: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Row b of q [B, H, R, D] (head h reads KV head h) attends, without a mask, to its keys
    starts[b] <= t < ends[b] -> (out [B, H, R, D], lse [B, H, R]); a row with no keys gets out 0,
    lse -inf. Call only where load() is not None.

    block_table [B, nb] (int32): key t of row b is slot t % bs of block block_table[b, t // bs] of
    key_cache / value_cache [num_blocks, H, bs, D] (views with any strides, d contiguous);
    key_t_in_block: each block stores its keys as K^T [D, bs], as vLLM-CPU's "vec" layout does (the
    view's shape is then nominal). block_table None: the caches are [B, H, S, D], row b's own keys.
    starts must be multiples of bs, and bs of 16.

    init (out [B, H, R, D], lse [B, H, R]): attention of the same rows over other keys (a cascade's
    prefix pass); the result is then attention over both key sets, the merge done in the kernel."""
    dll = load()
    if dll is None:  # callers check available() first; this names the cause if one did not
        raise RuntimeError("ZoRRo's CPU kernel could not be built (see the warning logged above)")
    B, H, R, D = q.shape
    nb, Hk, bs, Dk = key_cache.shape
    if (
        Hk != H
        or Dk != D
        or value_cache.shape[1:] != key_cache.shape[1:]
        or q.dtype != torch.float32
        or key_cache.dtype != torch.float32
        or value_cache.dtype != torch.float32
    ):
        raise ValueError(
            f"paged_group_attention: q {list(q.shape)} needs fp32 caches [blocks, {H}, bs, {D}]; got "
            f"key_cache {list(key_cache.shape)} {key_cache.dtype}, value_cache {list(value_cache.shape)}"
        )
    if q.stride(-1) != 1 or value_cache.stride(-1) != 1 or key_cache.stride(-1) != 1:
        raise ValueError("paged_group_attention: the last dimension of q and the caches must be contiguous")
    if init is not None:
        o0, l0 = init
        if o0.shape != q.shape or l0.shape != q.shape[:3] or o0.dtype != torch.float32 or l0.dtype != torch.float32:
            raise ValueError(
                f"paged_group_attention: init needs fp32 out {list(q.shape)} and lse {list(q.shape[:3])}; "
                f"got {list(o0.shape)} {o0.dtype} and {list(l0.shape)} {l0.dtype}"
            )
        init = (o0.contiguous(), l0.contiguous())
    out = torch.empty(B, H, R, D)
    lse = torch.empty(B, H, R)
    starts = starts.to(torch.int64).contiguous()
    ends = ends.to(torch.int64).contiguous()
    if block_table is not None:
        block_table = block_table.to(torch.int32).contiguous()
    k_st, k_sd = (1, bs) if key_t_in_block else (key_cache.stride(2), 1)
    job = _Job(
        q.data_ptr(),
        key_cache.data_ptr(),
        value_cache.data_ptr(),
        out.data_ptr(),
        lse.data_ptr(),
        init[0].data_ptr() if init is not None else None,
        init[1].data_ptr() if init is not None else None,
        block_table.data_ptr() if block_table is not None else None,
        starts.data_ptr(),
        ends.data_ptr(),
        B,
        H,
        R,
        D,
        bs if block_table is not None else 0,
        block_table.stride(0) if block_table is not None else 0,
        q.stride(0),
        q.stride(1),
        q.stride(2),
        key_cache.stride(0),
        key_cache.stride(1),
        k_st,
        k_sd,
        value_cache.stride(0),
        value_cache.stride(1),
        value_cache.stride(2),
        1,
        float(scale),
    )
    rc = dll.zorro_group_attention(ctypes.byref(job), torch.get_num_threads())
    if rc != 0:
        why = {
            1: "empty shapes or missing ranges",
            2: f"block size {bs} is not a multiple of {LANES}",
            3: "a key range is negative, reversed or not block-aligned",
        }.get(rc, f"code {rc}")
        raise ValueError(
            f"paged_group_attention: {why} (q {list(q.shape)}, starts {starts.tolist()[:8]}, ends {ends.tolist()[:8]})"
        )
    return out, lse


__all__ = ["LANES", "load", "paged_group_attention"]
