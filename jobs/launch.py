"""What both launchers (submitit in jobs/slurm.py, TorchX in jobs/components.py) agree on: the recipe
command line, the job folder, the Slurm time format and the environment a job starts with."""

from __future__ import annotations

import re
import secrets
import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path

DEFAULT_COMMAND = "arctic-rl run"
DEFAULT_JOB_ROOT = "runs/jobs"
REPO_ROOT = Path(__file__).resolve().parent.parent
_RECIPE_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


def check_recipe(recipe: str) -> str:
    if not _RECIPE_NAME.match(recipe or ""):
        raise ValueError(f"recipe={recipe!r}: use a plain name such as 'text2sql' (letters, digits, _ . -)")
    return recipe


def resolve_config(recipe: str, config: str | None) -> str:
    """The config path as given (checked to exist), or recipes/<recipe>/configs/default.yaml."""
    if config is None:
        default = REPO_ROOT / "recipes" / recipe / "configs" / "default.yaml"
        if not default.exists():
            folder = default.parent
            found = sorted(p.name for p in folder.glob("*.yaml")) if folder.is_dir() else []
            raise ValueError(f"--config not given and {default} does not exist; configs in {folder}: {found or 'none'}")
        return str(default)
    path = Path(config)
    if not path.exists():
        raise ValueError(f"config={config!r} does not exist (relative paths are taken from {Path.cwd()})")
    return str(path.resolve())


def check_overrides(overrides: Sequence[str]) -> list[str]:
    for item in overrides:
        key, sep, _ = item.partition("=")
        if not sep or not key:
            raise ValueError(f"override {item!r} is not key=value (e.g. train.steps=10)")
    return list(overrides)


def is_native(command: str | None) -> bool:
    """A `--command` other than `arctic-rl run` (a native verl or SkyRL command, or any stand-in): run as given."""
    return command is not None and shlex.split(command) != shlex.split(DEFAULT_COMMAND)


def recipe_command(
    config: str | None, overrides: Sequence[str], job_dir: Path, command: str | None = None
) -> list[str]:
    """The command rank 0 runs.

    `arctic-rl run` (the default): `arctic-rl run CONFIG key=value ... checkpoint.dir=<job>/checkpoints
    resume=auto`; the last two keys make a requeued job continue from its latest checkpoint, and a user's own
    value for either is kept as given. `arctic-rl` is this environment's own script, by absolute path: compute
    nodes see the same (shared) install, not necessarily the same PATH.
    Any other command runs exactly as given (native verl/SkyRL baselines): it takes no config and no overrides
    from the launcher, which would have to guess their syntax; the job folder reaches it as ARCTIC_RL_JOB_DIR."""
    if is_native(command):
        if overrides or config is not None:
            given = " ".join([*(["--config " + config] if config is not None else []), *overrides])
            raise ValueError(f"--command runs as given: put '{given}' into the command itself")
        return shlex.split(command)
    keys = {item.partition("=")[0] for item in check_overrides(overrides)}
    extra = [] if "checkpoint.dir" in keys else [f"checkpoint.dir={job_dir / 'checkpoints'}"]
    extra += [] if "resume" in keys else ["resume=auto"]
    arctic = str(Path(sys.executable).with_name("arctic-rl"))
    return [arctic, "run", config, *overrides, *extra]


def validate_run(
    config: str,
    overrides: Sequence[str],
    nodes: int = 1,
    gpus_per_node: int = 0,
    cpus_per_node: int | None = None,
    plan: bool = True,
    gpu_memory_gib: float | None = None,
) -> str | None:
    """The run config with its overrides, validated here, on the submitting machine, before anything is
    queued: a wrong key fails in a second (naming the key and the allowed keys), not on a compute node after
    the job waited in the queue. On GPU nodes also `arctic-rl plan`'s check (engines per GPU, memory per GPU,
    CPUs per node, against GPUs of `gpu_memory_gib`, None: the plan's default of 80): a run that cannot fit
    fails here with every reason. Returns the rendered plan, if any."""
    from arctic_rl.errors import ConfigError
    from arctic_rl.runconfig import load_run_config

    try:
        run = load_run_config(config, list(overrides))
        if not (plan and gpus_per_node):
            return None
        from arctic_rl.plan import DEFAULT_GPU_MEMORY_GIB, plan_run

        memory = DEFAULT_GPU_MEMORY_GIB if gpu_memory_gib is None else gpu_memory_gib
        return plan_run(run, nodes, gpus_per_node, cpus_per_node, memory, name=config).render()
    except ConfigError as err:
        hint = " (--skip-plan submits anyway)" if plan and gpus_per_node else ""
        raise ValueError(f"{err}{hint}") from None


def prepare(
    recipe: str,
    config: str | None,
    overrides: Sequence[str],
    job_dir: Path,
    command: str | None = None,
    nodes: int = 1,
    gpus_per_node: int = 0,
    cpus_per_node: int | None = None,
    plan: bool = True,
    gpu_memory_gib: float | None = None,
) -> list[str]:
    """What both launchers do before submitting: resolve the config, validate it (and on GPU nodes plan it,
    printing the plan), build the command."""
    if is_native(command):
        return recipe_command(config, overrides, job_dir, command)
    resolved = resolve_config(recipe, config)
    rendered = validate_run(resolved, overrides, nodes, gpus_per_node, cpus_per_node, plan, gpu_memory_gib)
    if rendered:
        print(rendered, flush=True)
    return recipe_command(resolved, overrides, job_dir)


def new_job_dir(recipe: str, job_root: str | Path = DEFAULT_JOB_ROOT) -> Path:
    """A fresh folder per submission (unique across Slurm reinstalls that restart job ids), stable across
    requeues of that submission: checkpoints and the MLflow resume key live here."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return (Path(job_root) / f"{recipe}-{stamp}-{secrets.token_hex(2)}").resolve()


def parse_slurm_time(value: str) -> int:
    """Slurm's --time formats (`MM`, `MM:SS`, `HH:MM:SS`, `D-HH`, `D-HH:MM`, `D-HH:MM:SS`) -> whole minutes."""
    match = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", value.strip())
    if not match:
        raise ValueError(f"--time={value!r}: use minutes or [D-]HH:MM:SS, e.g. 30 or 02:00:00")
    days, a, b, c = match.groups()
    if days is not None:  # D-HH[:MM[:SS]]
        seconds = int(days) * 86400 + int(a) * 3600 + int(b or 0) * 60 + int(c or 0)
    elif c is not None:  # HH:MM:SS
        seconds = int(a) * 3600 + int(b) * 60 + int(c)
    elif b is not None:  # MM:SS
        seconds = int(a) * 60 + int(b)
    else:  # MM
        seconds = int(a) * 60
    if seconds <= 0:
        raise ValueError(f"--time={value!r} is zero")
    return max(1, -(-seconds // 60))
