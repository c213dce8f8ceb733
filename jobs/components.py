"""TorchX component for a recipe run: the same job as `python -m jobs.slurm submit`, for TorchX users.

    torchx run -s slurm -cfg time=30 jobs/components.py:recipe --recipe text2sql --nodes 2 --cpus_per_node 2 \
        -- backend.training_gpus=2 backend.sampling_gpus=2 train.steps=2

One role with one replica per node; TorchX's Slurm scheduler runs each replica as a het-job group through
`srun`. Every replica runs jobs/bootstrap.py with its replica id as rank: replica 0 is the Ray head and
runs the recipe command, the others join. Use the file path form (`jobs/components.py:recipe`); TorchX
0.7 did not resolve the `module:component` form here. No `from __future__ import annotations`: TorchX
builds the CLI from the real annotation types.
"""

import shlex
import sys
from pathlib import Path

import torchx.specs as specs

from arctic_rl.tracking import default_tracking_uri
from jobs import bootstrap, launch


def recipe(
    *overrides: str,
    recipe: str,
    config: str = "",
    nodes: int = 1,
    gpus_per_node: int = 0,
    cpus_per_node: int = 0,
    mem_mb: int = 0,
    command: str = "",
    job_root: str = launch.DEFAULT_JOB_ROOT,
    max_retries: int = 0,
    register_timeout_s: int = 300,
    ray_args: str = "",
    ray_python: str = "",
    skip_plan: bool = False,
    gpu_memory_gib: float = 0.0,
) -> specs.AppDef:
    """Runs an arctic-rl recipe on a Ray cluster brought up over the job's nodes.

    Args:
        overrides: key=value overrides for the recipe config (after `--`)
        recipe: recipe name, also the MLflow experiment (e.g. text2sql)
        config: recipe config YAML (default recipes/<recipe>/configs/default.yaml)
        nodes: number of nodes (one replica per node)
        gpus_per_node: GPUs per node
        cpus_per_node: CPUs per node (also Ray's --num-cpus); 0: none asked of Slurm, Ray counts the node's CPUs
        mem_mb: memory per node in MB (0: the partition's default)
        command: run this command as given on the first node instead of `arctic-rl run CONFIG key=value ...`
            (a native verl or SkyRL baseline); takes no config or overrides
        job_root: where the job folder (checkpoints, logs) is created
        max_retries: times the job is requeued after a failure; it resumes from its last checkpoint
        register_timeout_s: how long the head waits for all nodes to join Ray
        ray_args: extra `ray start` flags for every node
        ray_python: the python whose Ray the nodes run (Ray >= 2.52; default this one), for a command that
            drives Ray from another environment (native SkyRL: .venv-skyrl-native/bin/python)
        skip_plan: submit even when `arctic-rl plan` (run first on GPU nodes) says the run cannot fit
        gpu_memory_gib: memory of one GPU in GiB for that plan (0: the plan's default, 80)
    """
    launch.check_recipe(recipe)
    # The component runs at `torchx run` time, on the submitting machine: the job folder and the MLflow
    # URI are fixed here, so every retry of this job shares them.
    job_dir = launch.new_job_dir(recipe, job_root)
    cmd = launch.prepare(
        recipe,
        config or None,
        overrides,
        job_dir,
        command or None,
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        cpus_per_node=cpus_per_node or None,
        plan=not skip_plan,
        gpu_memory_gib=gpu_memory_gib or None,
    )
    args = [
        "-m",
        "jobs.bootstrap",
        f"--job-dir={job_dir}",
        f"--nnodes={nodes}",
        f"--rank={specs.macros.replica_id}",
        f"--head-env={specs.macros.rank0_env}",
        f"--recipe={recipe}",
        f"--tracking-uri={default_tracking_uri()}",
        f"--register-timeout-s={register_timeout_s}",
    ]
    if cpus_per_node:
        args.append(f"--num-cpus={cpus_per_node}")
    if gpus_per_node:
        args.append(f"--num-gpus={gpus_per_node}")
    if ray_args:
        args.append(f"--ray-args={ray_args}")
    if ray_python:
        # Checked here, at `torchx run` time, as well as on every node: a bad path fails before it queues.
        python = Path(ray_python).absolute()
        bootstrap.check_ray_python(python)
        args.append(f"--ray-python={python}")
    role = specs.Role(
        name="node",
        image=str(launch.REPO_ROOT),
        # This environment's interpreter, by absolute path: Slurm nodes see the same (shared) install.
        entrypoint=sys.executable,
        args=[*args, "--", *cmd],
        num_replicas=nodes,
        resource=specs.Resource(cpu=cpus_per_node, gpu=gpus_per_node, memMB=mem_mb),
        env={"PYTHONPATH": str(launch.REPO_ROOT), "ARCTIC_RL_JOB_DIR": str(job_dir)},
        max_retries=max_retries,
    )
    metadata = {"job_dir": str(job_dir), "command": shlex.join(cmd)}
    return specs.AppDef(name=f"arctic-rl-{recipe}", roles=[role], metadata=metadata)
