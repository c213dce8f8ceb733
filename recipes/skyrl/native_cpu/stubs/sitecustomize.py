"""With SKYRL_NATIVE_CPU_SHIMS=1 (recipes/skyrl/native_cpu/run.sh): apply recipes/skyrl/native_cpu/cpu_shims.py in
every Python process of a native-SkyRL CPU run, right after `torch` (cpu_shims.patch_torch) and
`skyrl_train.distributed.fsdp_utils` (cpu_shims.patch_fsdp_utils) finish importing, and ray_shims.py (Ray 2.60 in
place of SkyRL's pinned 2.51) right after the two Ray modules it patches. Python imports sitecustomize
from sys.path at start-up, so this reaches processes nothing else can patch: vLLM's spawned EngineCore, where
skyrl_train/weight_sync/broadcast_strategy.py:187 allocates the received weights with device="cuda"."""

import os
import sys

if os.environ.get("SKYRL_NATIVE_CPU_SHIMS") == "1":
    import importlib.abc

    # module imported -> (shim module in recipes.skyrl.native_cpu, its function), called with the module.
    _SHIMS = {
        "torch": ("cpu_shims", "patch_torch"),
        "skyrl_train.distributed.fsdp_utils": ("cpu_shims", "patch_fsdp_utils"),
        "ray.util.placement_group": ("ray_shims", "patch_placement_group"),
        "ray.experimental.collective": ("ray_shims", "patch_experimental_collective"),
    }

    def _shim_hook(shim, function):
        def hook(module):
            getattr(importlib.import_module(f"recipes.skyrl.native_cpu.{shim}"), function)(module)

        return hook

    _HOOKS = {name: _shim_hook(*target) for name, target in _SHIMS.items()}

    class _PostImportFinder(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            hook = _HOOKS.pop(name, None)
            if hook is None:
                return None
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(name, path, target)
                if spec is not None:
                    break
            else:
                return None
            exec_module = spec.loader.exec_module

            def exec_then_patch(module, _exec=exec_module, _hook=hook):
                _exec(module)
                _hook(module)

            spec.loader.exec_module = exec_then_patch
            return spec

    sys.meta_path.insert(0, _PostImportFinder())
