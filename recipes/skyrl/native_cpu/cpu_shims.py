"""CPU stand-ins for native skyrl-train 0.3.1 (FSDP2 workers + vLLM engines), which assumes CUDA + NCCL.

Nothing in site-packages is edited: the patches are applied to torch / SkyRL objects in the running process, by
stubs/sitecustomize.py (on PYTHONPATH, with SKYRL_NATIVE_CPU_SHIMS=1) right after `torch` and
`skyrl_train.distributed.fsdp_utils` are imported, in every Python process of the run: the driver, Ray's workers
(SkyRL's policy/ref actors, its vLLM engine actor, the entrypoint task) and the vLLM EngineCore process that the
engine actor spawns (vllm/v1/engine/utils.py launch_core_engines; a Ray worker_process_setup_hook does not reach
it). Each patch names the SkyRL line it stands in for (paths relative to site-packages/skyrl_train/). Only for this
experiment: the numbers a CPU run gives say nothing about SkyRL on GPUs.
"""

from __future__ import annotations

import os
import sys

_APPLIED = False


def _cpu_device(device):
    if device is None:
        return device
    if isinstance(device, int):
        return "cpu"  # a bare index means a CUDA ordinal in the calls below
    text = str(device)
    return "cpu" if text.startswith("cuda") else device


def apply() -> None:
    """All patches, for a process that has (or will) import torch and skyrl_train."""
    patch_torch()
    try:
        import skyrl_train.distributed.fsdp_utils as fsdp_utils
    except ImportError:
        return
    patch_fsdp_utils(fsdp_utils)


def patch_torch(_torch=None) -> None:  # _torch: the module, when called as an import hook
    global _APPLIED
    if _APPLIED:
        return
    _APPLIED = True
    import psutil
    import torch
    import torch.distributed as dist
    import torch.distributed.device_mesh as dm

    cuda = torch.cuda
    # workers/worker.py:630,855,907,956,1079, distributed/fsdp_utils.py:46,191,394, fsdp_worker.py:86:
    # `.to(torch.cuda.current_device())` -> CPU.
    cuda.current_device = lambda: "cpu"
    # distributed/fsdp_strategy.py:106 `torch.cuda.set_device(local_rank)`: nothing to select on CPU.
    cuda.set_device = lambda *a, **k: None
    # distributed/fsdp_strategy.py:133,150,496, fsdp_utils.py:319: `torch.cuda.synchronize()`.
    cuda.synchronize = lambda *a, **k: None
    cuda.empty_cache = lambda *a, **k: None
    cuda.ipc_collect = lambda *a, **k: None
    # workers/fsdp/fsdp_worker.py:92,258,337: `rank % torch.cuda.device_count()` (0 on CPU: ZeroDivisionError).
    # 1 for callers in skyrl_train only: vllm/env_override.py:18 sets PYTORCH_NVML_BASED_CUDA_CHECK=1, which makes
    # torch.cuda.is_available() return `device_count() > 0`, and a global 1 sent torch.compile (vLLM's CPU sampler,
    # vllm/v1/sample/ops/topk_topp_sampler.py:147) into CUDA's device properties.
    _device_count = cuda.device_count

    def device_count():
        if sys._getframe(1).f_globals.get("__name__", "").startswith("skyrl_train"):
            return 1
        return _device_count()

    cuda.device_count = device_count
    # workers/worker.py:228-232 (get_cuda_memory) and memory logging: report host memory.
    cuda.mem_get_info = lambda *a, **k: (psutil.virtual_memory().available, psutil.virtual_memory().total)
    cuda.memory.mem_get_info = cuda.mem_get_info
    # distributed/strategy.py:148 (checkpoint rng state).
    cuda.get_rng_state = lambda *a, **k: torch.get_rng_state()
    cuda.set_rng_state = lambda *a, **k: None

    # distributed/fsdp_utils.py:283 `full_param.detach().cuda()`.
    torch.Tensor.cuda = lambda self, *a, **k: self

    # distributed/fsdp_utils.py:297 and weight_sync/broadcast_strategy.py:187 `torch.empty(..., device="cuda")`.
    _empty = torch.empty

    def empty(*args, **kwargs):
        if "device" in kwargs:
            kwargs["device"] = _cpu_device(kwargs["device"])
        return _empty(*args, **kwargs)

    torch.empty = empty

    # workers/worker.py:82-84 `init_process_group(backend="nccl")`: gloo is torch's CPU backend.
    _init_pg = dist.init_process_group

    def init_process_group(*args, **kwargs):
        if kwargs.get("backend") and "nccl" in str(kwargs["backend"]):
            kwargs["backend"] = "gloo"
        elif args and "nccl" in str(args[0]):
            args = ("gloo",) + tuple(args[1:])
        return _init_pg(*args, **kwargs)

    dist.init_process_group = init_process_group
    torch.distributed.init_process_group = init_process_group

    # workers/worker.py:91-92 and distributed/fsdp_utils.py:401,404 `init_device_mesh("cuda", ...)`.
    _init_mesh = dm.init_device_mesh

    def init_device_mesh(device_type, *args, **kwargs):
        return _init_mesh("cpu" if str(device_type).startswith("cuda") else device_type, *args, **kwargs)

    dm.init_device_mesh = init_device_mesh
    os.environ.setdefault("SKYRL_NATIVE_CPU_SHIMS", "1")


def patch_fsdp_utils(fsdp_utils) -> None:
    import torch.distributed.device_mesh as dm

    # Not a CPU issue: skyrl-train 0.3.1's distributed/fsdp_strategy.py:23-25 imports `MixedPrecisionPolicy` from
    # skyrl_train.distributed.fsdp_utils, which never defines it (fsdp_utils.py:36-41 imports only CPUOffloadPolicy,
    # FSDPModule, fully_shard), so fsdp_strategy (and every FSDP worker) fails to import on any torch.
    from torch.distributed.fsdp import MixedPrecisionPolicy

    fsdp_utils.init_device_mesh = dm.init_device_mesh  # imported by name at fsdp_utils.py:30
    if not hasattr(fsdp_utils, "MixedPrecisionPolicy"):
        fsdp_utils.MixedPrecisionPolicy = MixedPrecisionPolicy
