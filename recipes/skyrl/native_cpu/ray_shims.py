"""Ray 2.60 stand-ins for native skyrl-train 0.3.1, which pins Ray 2.51.1 (requirements.txt says why this
environment has 2.60: a job's Ray is token-authenticated, which Ray 2.51 cannot be, and a driver joins only a Ray
of its own version). Two imports of SkyRL's name places that Ray 2.60 moved; nothing else of SkyRL's Ray use
changed. stubs/sitecustomize.py applies each right after the Ray module it patches is imported, in every process
(paths relative to site-packages/skyrl_train/).
"""

from __future__ import annotations

import pkgutil
import sys
import types


def patch_placement_group(module: types.ModuleType) -> None:
    """utils/utils.py:13-18 (and trainer.py, workers/worker.py, entrypoints/main_base.py, inference_engines/)
    import PlacementGroupSchedulingStrategy from ray.util.placement_group, which Ray 2.51 re-exported and 2.60
    does not; it is ray.util.scheduling_strategies' class in both."""
    if not hasattr(module, "PlacementGroupSchedulingStrategy"):
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        module.PlacementGroupSchedulingStrategy = PlacementGroupSchedulingStrategy


def patch_experimental_collective(package: types.ModuleType) -> None:
    """inference_engines/utils.py:225 imports get_address_and_port from ray.experimental.collective.util, a module
    Ray 2.60 no longer has; the same function (this node's IP and a free port) is in ray.util.collective.collective."""
    name = f"{package.__name__}.util"
    if name in sys.modules or any(info.name == "util" for info in pkgutil.iter_modules(package.__path__)):
        return  # Ray 2.51: the real module
    util = types.ModuleType(name, "Stand-in for Ray 2.51's ray.experimental.collective.util (ray_shims.py).")

    def get_address_and_port() -> tuple[str, int]:
        from ray.util.collective.collective import get_address_and_port as moved

        return moved()

    util.get_address_and_port = get_address_and_port
    sys.modules[name] = util
    package.util = util
