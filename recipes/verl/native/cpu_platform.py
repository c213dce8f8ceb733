"""A "cpu" platform for verl's platform plugin API, loaded by verl itself in every process that imports it:

    VERL_USE_EXTERNAL_MODULES=recipes.verl.native.cpu_platform VERL_PLATFORM=cpu

verl 0.9.1 ships CUDA, ROCm and NPU platforms only (verl/plugin/platform/platform_manager.py:172-174). With no
accelerator its auto-detection falls back to "nvidia" (platform_manager.py:113-117), and then:
- verl/utils/distributed.py:89 creates the process group with `get_nccl_backend()`, i.e. this class's
  `communication_backend_name()`: "gloo" here, where CPU torch has no NCCL;
- verl/single_controller/ray/base.py:144-150 asks Ray for `ray_resource_name()` per rank, and
  base.py:226-241 counts only Ray's "GPU"/"NPU" resources. So this platform answers "GPU", and the launcher
  (recipes/verl/native/run.py) starts Ray with one fake GPU slot per rank: a slot is a placement token, the
  rank computes on the CPU;
- verl/utils/distributed.py:89 then builds the backend string "cpu:gloo,<device>:<backend>", which with
  device "cpu" names cpu twice and torch refuses it ("Duplicate device type cpu"): `_one_cpu_backend` below
  drops the repeat before torch.distributed.init_process_group sees it;
- verl/workers/engine/fsdp/transformer_impl.py:459-462 gives a forward-only FSDP2 engine (the reference)
  `CPUOffloadPolicy(pin_memory=True)`, and pinning memory needs an accelerator ("Cannot access accelerator
  device when none is available"): `_UnpinnedCPUOffloadPolicy` below is the same policy without pinning,
  which is what offloading to the CPU means when the parameters already live there;
- verl calls its device module as it would torch.cuda (`memory_reserved`, `mem_get_info`, `get_rng_state`,
  `ipc_collect`, ... through verl/utils/device.py:105-111), most of which torch.cpu lacks: `_CPUDevice`
  below answers them for a device that has no memory of its own (no allocator to report or empty);
- verl/workers/rollout/vllm_rollout/vllm_rollout.py:143 sends weights to vLLM through CUDA IPC unless
  `is_ipc_supported()` is False, when it uses its shared-memory path: False here.
"""

from __future__ import annotations

import contextlib
import types

import torch
import torch.distributed
import torch.distributed.fsdp
from verl.plugin.platform import PlatformBase
from verl.plugin.platform.platform_manager import PlatformRegistry


def _zero(*args, **kwargs) -> int:
    return 0


def _nothing(*args, **kwargs) -> None:
    return None


def _mem_get_info(*args, **kwargs) -> tuple[int, int]:
    import psutil

    vm = psutil.virtual_memory()
    return vm.available, vm.total


class _CPUDevice(types.ModuleType):
    """torch.cpu plus the torch.cuda calls verl makes on its device module, answered for host memory."""

    memory_allocated = memory_reserved = max_memory_allocated = max_memory_reserved = staticmethod(_zero)
    empty_cache = reset_peak_memory_stats = ipc_collect = staticmethod(_nothing)
    mem_get_info = staticmethod(_mem_get_info)
    get_rng_state = staticmethod(torch.get_rng_state)
    set_rng_state = staticmethod(torch.set_rng_state)

    @staticmethod
    def get_device_name(*args, **kwargs) -> str:
        return "cpu"

    def __getattr__(self, name: str):
        return getattr(torch.cpu, name)


@PlatformRegistry.register(platform="cpu")
class PlatformCPU(PlatformBase):
    device_name = "cpu"
    vendor_name = "cpu"
    device_module = _CPUDevice("verl_cpu_device")

    def is_available(self) -> bool:
        return True

    def current_device(self):  # verl moves batches with .to(current_device())
        return "cpu"

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index) -> None:
        pass

    def synchronize(self, device_index=None) -> None:
        pass

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    manual_seed_all = manual_seed

    def set_allocator_settings(self, settings: str) -> None:
        pass

    def empty_cache(self) -> None:
        pass

    def get_device_capability(self, device_index: int = 0):
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "CUDA_VISIBLE_DEVICES"

    @contextlib.contextmanager
    def nvtx_range(self, msg: str):
        yield

    def profiler_start(self) -> None:
        pass

    def profiler_stop(self) -> None:
        pass

    def ray_resource_name(self) -> str:
        return "GPU"  # a fake slot per rank (see the module docstring), so base.py:226-241 finds them

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self):
        return None


def _one_cpu_backend(init_process_group):
    """torch.distributed.init_process_group with a repeated "cpu:gloo" dropped (see verl/utils/distributed.py:89)."""

    def init(backend=None, *args, **kwargs):
        if isinstance(backend, str) and "," in backend:
            backend = ",".join(dict.fromkeys(backend.split(",")))
            if backend == "cpu:gloo":
                backend = "gloo"
        return init_process_group(backend, *args, **kwargs)

    init._arctic_rl_one_cpu_backend = True  # type: ignore[attr-defined]
    return init


# (torch's own init_process_group already has a __wrapped__, from its logging decorator: a marker of our own)
if not hasattr(torch.distributed.init_process_group, "_arctic_rl_one_cpu_backend"):
    torch.distributed.init_process_group = _one_cpu_backend(torch.distributed.init_process_group)


class _UnpinnedCPUOffloadPolicy(torch.distributed.fsdp.CPUOffloadPolicy):
    """FSDP2's CPUOffloadPolicy with pin_memory forced off (see transformer_impl.py:459-462 above)."""

    def __init__(self, pin_memory: bool = True):
        super().__init__(pin_memory=False)


# Bound before verl.utils.fsdp_utils imports the name (this module is loaded first, by `import verl`).
torch.distributed.fsdp.CPUOffloadPolicy = _UnpinnedCPUOffloadPolicy  # type: ignore[misc]
