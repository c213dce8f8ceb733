"""`python -m recipes.skyrl.native` (native SkyRL: its FSDP2 workers, vLLM engines, SkyRLGymGenerator) on CPU.

Same entrypoint and overrides. The CPU patches (cpu_shims.py) reach every process through stubs/sitecustomize.py
(run.sh puts stubs/ on PYTHONPATH and sets SKYRL_NATIVE_CPU_SHIMS=1); this module only adds logical GPUs to the
private Ray that skyrl_train/utils/utils.py:674 (`initialize_ray`: `ray.init(runtime_env=...)`) starts, or, on a
job's Ray (run.sh joins it when the job's nodes run this environment's Ray: `jobs.slurm submit --ray-python`), passes
the stand-ins' environment to SkyRL's workers through that same runtime_env.
"""

from __future__ import annotations

import os

import ray

from recipes.skyrl.native_cpu import cpu_shims

cpu_shims.apply()
_ray_init = ray.init
# What every SkyRL process needs from run.sh: stubs/ on PYTHONPATH with the switch for its sitecustomize (the
# stand-ins), vLLM-CPU's and the tokenizer's settings, and the job's facts that the run's tags record
# (arctic_rl.tracking.ENV_DEFAULT_TAGS: SkyRL opens its MLflow run in a Ray task, native_entrypoint).
WORKER_ENV = (
    "PYTHONPATH",
    "SKYRL_NATIVE_CPU_SHIMS",
    "VLLM_CPU_KVCACHE_SPACE",
    "VLLM_CPU_OMP_THREADS_BIND",
    "OMP_NUM_THREADS",
    "HF_HUB_OFFLINE",
    "HF_DATASETS_OFFLINE",
    "TOKENIZERS_PARALLELISM",
    "ARCTIC_RL_RECIPE",
    "ARCTIC_RL_NODES",
    "ARCTIC_RL_GPUS",
)


def _init(*args, **kwargs):
    if os.environ.get("RAY_ADDRESS") == "local":
        # A private Ray (it ends with this driver) with logical GPUs: SkyRL asks Ray for "GPU" resources in every
        # placement group and actor (entrypoints/main_base.py:181, inference_engines/ray_wrapped_inference_engine.py:130,
        # workers/worker.py:396-471, utils/utils.py:697); on a machine without GPUs they would never be scheduled.
        # Logical CPUs above the 2 real cores for the same reason (one CPU per bundle / actor).
        kwargs.setdefault("num_gpus", int(os.environ.get("SKYRL_CPU_FAKE_GPUS", "3")))
        kwargs.setdefault("num_cpus", int(os.environ.get("SKYRL_CPU_LOGICAL_CPUS", "8")))
        kwargs.setdefault("include_dashboard", False)
        kwargs.setdefault("object_store_memory", 512 * 1024**2)
        # Token auth and the temp dir come from run.sh's arctic_rl.local_ray (RAY_AUTH_*, RAY_TMPDIR).
    else:
        # A job's Ray: its workers start from their raylet's environment, not this driver's (a private Ray's
        # raylet is this driver's child and inherits it). The GPU slots are the job's (`--ray-args --num-gpus`).
        env_vars = kwargs.setdefault("runtime_env", {}).setdefault("env_vars", {})
        for key in WORKER_ENV:
            if key in os.environ:
                env_vars.setdefault(key, os.environ[key])
    return _ray_init(*args, **kwargs)


ray.init = _init

if __name__ == "__main__":
    from recipes.skyrl.native import main

    main()
