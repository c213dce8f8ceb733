"""CPU kernel for cascade decode: R query rows per KV head over S keys, with the log-sum-exp.

The cascade prefix pass is compute-bound on CPU (its FLOPs equal the standard decode's; only the
KV reads shrink), and torch's CPU flash kernel runs its 16-row GEMMs at about a third of this
machine's sgemm rate. group_attention.cpp keeps the rows in vector lanes instead (see its header).

It is compiled on first use with the system C++ compiler (-O3 -march=native, so the binary is keyed
by this CPU's flags as well as the source) into ~/.cache/arctic-rl/kernels, written to a temporary
name and renamed, so concurrent first uses never load a half-written library. Without a compiler,
or with ARCTIC_RL_CPU_KERNEL=0, `group_attention` falls back to torch's flash kernel (same results
to fp32 rounding).
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
_flash_cpu = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
_build_lock = threading.Lock()
_LANES = 16  # W in group_attention.cpp


def _cpu_identity() -> str:
    """-march=native code is only valid on CPUs with the same features (a shared home directory may
    serve several node types)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        return "\n".join(sorted({ln for ln in lines if ln.startswith(("flags", "model name"))}))
    except OSError:
        return platform.processor() or platform.machine()


def _cache_dir() -> Path:
    return Path(os.environ.get("ARCTIC_RL_KERNEL_CACHE", Path.home() / ".cache" / "arctic-rl" / "kernels"))


@lru_cache(maxsize=1)
def load() -> ctypes.CDLL | None:
    """The compiled kernel, building it if needed; None (with one warning) if it cannot be built."""
    if os.environ.get("ARCTIC_RL_CPU_KERNEL", "1") == "0":
        return None
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        logger.warning("no C++ compiler: ZoRRo's CPU group-attention kernel falls back to torch's flash kernel")
        return None
    key = hashlib.sha256(_SRC.read_bytes() + " ".join([cxx, *_FLAGS]).encode() + _cpu_identity().encode())
    lib = _cache_dir() / f"zorro_group_attention-{key.hexdigest()[:16]}.so"
    with _build_lock:
        if not lib.exists():
            lib.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(suffix=".so", dir=lib.parent)
            os.close(fd)
            try:
                run = subprocess.run([cxx, *_FLAGS, str(_SRC), "-o", tmp], capture_output=True, text=True)
                if run.returncode != 0:
                    logger.warning("building ZoRRo's CPU kernel failed (falling back to torch's flash kernel):\n%s",
                                   run.stderr[-2000:])
                    return None
                os.replace(tmp, lib)
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
    dll = ctypes.CDLL(str(lib))
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    dll.zorro_group_attention.argtypes = [ptr] * 5 + [i64] * 16 + [ctypes.c_float, ctypes.c_int]
    dll.zorro_group_attention.restype = ctypes.c_int
    return dll


def _usable(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    needs_grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    return (not needs_grad and q.device.type == "cpu" and q.dtype == k.dtype == v.dtype == torch.float32
            and q.stride(-1) == k.stride(-1) == v.stride(-1) == 1)


def group_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax attention of q [B, H, R, D] over k, v [B, H, S, D] (no mask; head h of q reads head h
    of k and v) -> (out [B, H, R, D], lse [B, H, R] float32). Any strides with d contiguous; not
    differentiable (decode only)."""
    B, H, R, D = q.shape
    S = k.shape[2]
    if k.shape != (B, H, S, D) or v.shape != k.shape:
        raise ValueError(f"group_attention: q {list(q.shape)} needs k and v of shape [{B}, {H}, S, {D}]; "
                         f"got k {list(k.shape)}, v {list(v.shape)}")
    # Rows fill the 16 lanes of a register: below ~3/4 full the wasted lanes cost more than the kernel
    # gains (G 2 over prefix 2048 measured slower than the flash kernel), so small groups use torch's.
    lanes = -(-R // _LANES) * _LANES
    dll = load() if S > 0 and R >= 0.75 * lanes and _usable(q, k, v) else None
    if dll is None:
        o, l = _flash_cpu(q, k, v, 0.0, False, scale=scale)
        return o, l
    out = torch.empty(B, H, R, D)
    lse = torch.empty(B, H, R)
    rc = dll.zorro_group_attention(
        q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), lse.data_ptr(), B, H, R, S, D,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), out.stride(0), out.stride(1), float(scale), torch.get_num_threads())
    if rc != 0:
        raise RuntimeError(f"zorro_group_attention failed (code {rc}) for q {list(q.shape)}, k {list(k.shape)}")
    return out, lse


__all__ = ["group_attention", "load"]
