"""Submit a recipe as one Slurm batch job through submitit.

    python -m jobs.slurm submit --recipe text2sql --nodes 2 --time 30 backend.training_gpus=2 backend.sampling_gpus=2 train.steps=2

Inside the allocation submitit starts one task per node (srun); each runs jobs/bootstrap.py: the first
node is the Ray head and runs `arctic-rl run CONFIG key=value ... checkpoint.dir=<job>/checkpoints
resume=auto`, the others join it. On preemption or time-out Slurm sends USR2; submitit checkpoints
(this job object: same arguments) and requeues the job, and the recipe resumes from its last checkpoint.
`--cluster local` runs the same job on this machine without Slurm (one node, local Ray).
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import submitit

from arctic_rl.tracking import default_tracking_uri
from jobs import bootstrap, launch

FINAL_STATES = {
    "COMPLETED",
    "FAILED",
    "CANCELLED",
    "TIMEOUT",
    "OUT_OF_MEMORY",
    "NODE_FAIL",
    "BOOT_FAIL",
    "DEADLINE",
    "FINISHED",
    "INTERRUPTED",
}


# How long an attempt's task step may wait to start. Slurm defers a step ("step creation temporarily disabled") while
# a node of the allocation is not responding, and srun retries without end: an attempt whose node never answered
# again would hold its allocation, doing nothing, until the time limit. A healthy step starts within seconds.
STEP_START_TIMEOUT_S = 300


def step_marker(job_dir: Path, restart_count: str | int) -> Path:
    """Written by the attempt's tasks as they start: the batch script's teardown tells 'srun never started the
    step' from 'the step ran and failed' by it."""
    return job_dir / f"step-started.{restart_count}"


def step_teardown(job_dir: Path, nodes: int, timeout_s: int) -> list[str]:
    """Lines the batch script runs after srun (submitit's teardown): when srun failed and no task of this attempt
    started, one named error line, with the nodes' states, before the script exits with srun's code."""
    marker = shlex.quote(str(step_marker(job_dir, "")))
    why = (
        f"arctic-rl: job $SLURM_JOB_ID attempt ${{SLURM_RESTART_COUNT:-0}}: srun exited $rc before any task of its "
        f"step (srun --nodes={nodes} --ntasks-per-node=1) started. srun gives up on a step Slurm still defers "
        f"after {timeout_s} s (--step-start-timeout-s); its own message above says why (for instance "
        "'Requested nodes are busy': a node of the allocation not responding). The job ends rather than hold its nodes; resubmit "
        "it (resume=auto continues from its last checkpoint). Nodes:"
    )
    return [
        "rc=$?",
        f'if [ "$rc" -ne 0 ] && [ ! -e {marker}"${{SLURM_RESTART_COUNT:-0}}" ]; then',
        f'  echo "{why} $(sinfo -h -N -n "$SLURM_JOB_NODELIST" -o "%N=%T" | tr "\\n" " ")" >&2',
        "fi",
        'exit "$rc"',
    ]


class RecipeJob(submitit.helpers.Checkpointable):
    """The callable submitit pickles and runs on every node. `checkpoint()` (inherited) resubmits it with
    the same arguments on preemption/time-out; the command's resume=auto picks up the last checkpoint."""

    def __init__(self, template: bootstrap.BootstrapConfig) -> None:
        self.template = template

    def __call__(self) -> int:
        env = submitit.JobEnvironment()
        if "SLURM_JOB_ID" in os.environ:  # the step started: the batch script's teardown reads this
            step_marker(self.template.job_dir, os.environ.get("SLURM_RESTART_COUNT", "0")).touch()
        check_one_task_per_node(os.environ)
        try:
            hostnames = list(env.hostnames)
        except Exception:  # local/debug executors have no node list
            hostnames = []
        cfg = replace(
            self.template,
            rank=env.global_rank,
            num_nodes=env.num_nodes,
            head_host=hostnames[0] if hostnames else "127.0.0.1",
            hostnames=hostnames,
        )
        code = bootstrap.run(cfg)
        if code != 0:
            raise RuntimeError(f"recipe command exited with code {code}: {shlex.join(cfg.command)}")
        return code

    def checkpoint(self, *args: Any, **kwargs: Any) -> submitit.helpers.DelayedSubmission:
        # submitit calls this from its USR2 handler right before `scontrol requeue`. A SIGTERM to the job's
        # processes (the preemption's own, or the requeue stopping the job) can reach that scontrol before
        # it returns: it dies, and submitit records the job as failed although Slurm requeued it (CI, under load).
        # An ignored signal stays ignored across fork/exec, so scontrol survives; this process is about
        # to exit anyway (submitit's _exit), and Slurm still SIGKILLs stragglers after KillWait.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        return super().checkpoint(*args, **kwargs)


def check_one_task_per_node(environ: Mapping[str, str]) -> None:
    """Refuses a step that packs the job's ranks onto fewer nodes than the job holds (every rank would start a
    Ray node on the same host, and the engines dealt "over the nodes" would all run there). Outside a Slurm step
    (the local executor) there is nothing to check."""
    step_nodes, job_nodes = environ.get("SLURM_STEP_NUM_NODES"), environ.get("SLURM_JOB_NUM_NODES")
    if step_nodes and job_nodes and int(step_nodes) != int(job_nodes):
        raise RuntimeError(
            f"Slurm started this step's {environ.get('SLURM_STEP_NUM_TASKS', '?')} tasks on {step_nodes} of the "
            f"job's {job_nodes} nodes (SLURM_STEP_NODELIST={environ.get('SLURM_STEP_NODELIST', '?')}, "
            f"SLURM_JOB_NODELIST={environ.get('SLURM_JOB_NODELIST', '?')}); the job needs one task per node: "
            "srun --nodes=<job nodes> --ntasks-per-node=1 (jobs.slurm's srun_args)"
        )


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m jobs.slurm",
        description=__doc__.split("\n")[0],
        epilog="Arguments of the form key=value, anywhere after `submit`, are passed to the recipe command.",
    )
    sub = p.add_subparsers(dest="action", required=True)
    s = sub.add_parser("submit", help="submit one recipe run as a batch job")
    s.add_argument("--recipe", required=True, help="recipe name; also the MLflow experiment (e.g. text2sql)")
    s.add_argument("--config", help="recipe config YAML (default recipes/<recipe>/configs/default.yaml)")
    s.add_argument("--nodes", type=int, default=1)
    s.add_argument("--gpus-per-node", type=int, default=0)
    s.add_argument(
        "--cpus-per-node",
        type=int,
        help="CPUs per node (also Ray's --num-cpus); default: whole nodes (--exclusive), Ray counts their CPUs",
    )
    s.add_argument(
        "--gpu-memory-gib",
        type=float,
        default=None,
        help="memory of one GPU in GiB, for the plan run before queueing (default 80)",
    )
    s.add_argument("--mem-gb", type=int, help="memory per node (default: the partition's default)")
    s.add_argument("--partition", help="Slurm partition (default: the cluster's default)")
    s.add_argument("--time", default="60", help="time limit, minutes or [D-]HH:MM:SS (default 60)")
    s.add_argument("--account")
    s.add_argument(
        "--command",
        help=f"run this command as given instead of `{launch.DEFAULT_COMMAND} CONFIG "
        "key=value ...` (a native verl or SkyRL baseline); takes no --config or overrides",
    )
    s.add_argument("--job-root", default=launch.DEFAULT_JOB_ROOT, help="where job folders are created")
    s.add_argument("--cluster", choices=["slurm", "local", "debug"], default="slurm")
    s.add_argument("--max-requeues", type=int, default=3, help="requeues after time-out (preemptions are unlimited)")
    s.add_argument("--signal-delay-s", type=int, default=90, help="USR2 this many seconds before the time limit")
    s.add_argument("--register-timeout-s", type=float, default=300.0, help="wait for all nodes to join Ray")
    s.add_argument(
        "--step-start-timeout-s",
        type=int,
        default=STEP_START_TIMEOUT_S,
        help="give up (the job fails, naming why) when Slurm has not started the job's task step after this many "
        "seconds, instead of holding the allocation while srun retries",
    )
    s.add_argument("--ray-args", default="", help="extra `ray start` flags for every node, one quoted string")
    s.add_argument(
        "--ray-python",
        help="the python of the environment whose Ray the job's nodes run (Ray >= 2.52; default this one), for a "
        "--command that drives Ray from another environment: native SkyRL, .venv-skyrl-native/bin/python",
    )
    s.add_argument("--wait", action="store_true", help="wait for the job to end and report how it ended")
    s.add_argument(
        "--skip-plan",
        action="store_true",
        help="submit even when `arctic-rl plan` (run first on GPU nodes) says the run cannot fit",
    )
    return p


def make_executor(args: argparse.Namespace, job_dir: Path) -> submitit.AutoExecutor:
    executor = submitit.AutoExecutor(
        folder=job_dir / "submitit", cluster=args.cluster, slurm_max_num_timeout=args.max_requeues
    )
    params: dict[str, Any] = {
        "name": f"arctic-rl-{args.recipe}",
        "nodes": args.nodes,
        "tasks_per_node": 1,
        "timeout_min": launch.parse_slurm_time(args.time),
    }
    if args.cpus_per_node:
        params["cpus_per_task"] = args.cpus_per_node
    if args.gpus_per_node:
        params["gpus_per_node"] = args.gpus_per_node
    if args.mem_gb:
        params["mem_gb"] = args.mem_gb
    if args.cluster == "slurm":
        if args.step_start_timeout_s < 2:  # srun's --immediate=1 means "now or never", 0 "wait for ever"
            raise ValueError(
                f"--step-start-timeout-s={args.step_start_timeout_s}: use at least 2 seconds (default "
                f"{STEP_START_TIMEOUT_S}); a healthy step starts within seconds, a node that stopped answering "
                "is declared down after the cluster's SlurmdTimeout"
            )
        params["slurm_signal_delay_s"] = args.signal_delay_s
        if not args.cpus_per_node:  # GPU bundles need the node's CPUs too; one CPU per node cannot place them
            params["slurm_exclusive"] = True
        # One task on each of the job's nodes, said to srun itself: the sbatch options (--nodes, --ntasks-per-node)
        # do not bind the step. A requeued attempt started the moment a lost node came back once got a step of
        # 2 tasks on 1 node (CI: sacct's step 6.0 had NNodes=1, NTasks=2; slurmctld builds a step from the
        # allocated nodes that are up at that instant), so both ranks ran on one host. With the node count given,
        # slurmctld defers the step until every node is up (ESLURM_NODES_BUSY, "step creation temporarily
        # disabled") instead.
        # --immediate bounds that wait: srun gives up after it, and the teardown names why (step_teardown).
        params["slurm_srun_args"] = [
            f"--nodes={args.nodes}",
            "--ntasks-per-node=1",
            f"--immediate={args.step_start_timeout_s}",
        ]
        params["slurm_teardown"] = step_teardown(job_dir, args.nodes, args.step_start_timeout_s)
        # The job imports `jobs` and `arctic_rl` from this checkout, whatever directory Slurm starts it in.
        params["slurm_setup"] = [f"export PYTHONPATH={launch.REPO_ROOT}${{PYTHONPATH:+:$PYTHONPATH}}"]
        if args.partition:
            params["slurm_partition"] = args.partition
        if args.account:
            params["slurm_account"] = args.account
    elif args.nodes != 1:
        raise ValueError(f"--nodes={args.nodes} needs --cluster slurm; the {args.cluster} executor runs one node")
    executor.update_parameters(**params)
    return executor


def make_template(args: argparse.Namespace, job_dir: Path) -> bootstrap.BootstrapConfig:
    command = launch.prepare(
        args.recipe,
        args.config,
        args.overrides,
        job_dir,
        args.command,
        nodes=args.nodes,
        gpus_per_node=args.gpus_per_node,
        cpus_per_node=args.cpus_per_node,
        plan=not args.skip_plan,
        gpu_memory_gib=args.gpu_memory_gib,
    )
    return bootstrap.BootstrapConfig(
        command=command,
        job_dir=job_dir,
        num_cpus=args.cpus_per_node,
        num_gpus=args.gpus_per_node if args.gpus_per_node else None,
        ray_args=shlex.split(args.ray_args),
        ray_python=Path(args.ray_python) if args.ray_python else None,
        register_timeout_s=args.register_timeout_s,
        recipe=args.recipe,
        tracking_uri=default_tracking_uri(),
        workdir=Path.cwd(),
        signal_grace_s=60.0 if args.cluster == "slurm" else 0.0,
    )


def submit(args: argparse.Namespace) -> submitit.Job:
    launch.check_recipe(args.recipe)
    job_dir = launch.new_job_dir(args.recipe, args.job_root)
    template = make_template(args, job_dir)
    bootstrap.make_job_dir(job_dir)  # 0700 before submitit writes its files (and the logs) into it
    job = make_executor(args, job_dir).submit(RecipeJob(template))
    print(
        f"submitted job {job.job_id} ({args.cluster}): recipe {args.recipe}, {args.nodes} node(s) x "
        f"{args.gpus_per_node} GPU(s), time {launch.parse_slurm_time(args.time)} min"
    )
    print(f"  job folder : {job_dir}")
    print(f"  command    : {shlex.join(template.command)}")
    print(f"  stdout     : {job.paths.stdout}")
    print(f"  stderr     : {job.paths.stderr}")
    if args.cluster == "slurm":
        jid = job.job_id
        print(f"  follow     : tail -f {job.paths.stdout}  |  squeue -j {jid}  |  sacct -j {jid}  |  scancel {jid}")
    print(f"  MLflow     : experiment '{args.recipe}' at {template.tracking_uri}")
    return job


def failed_nodes(job_id: str) -> dict[str, str]:
    """{node: why} for the nodes of the job's latest attempt that ran somewhere, which Slurm has down, failed or
    drained (after NODE_FAIL). A requeued job's newest record is its next attempt, pending on no nodes: the
    attempt that lost a node is the record before it (sacct -D lists every attempt, oldest first)."""
    out = subprocess.run(
        ["sacct", "-n", "-X", "-P", "-D", "-j", str(job_id), "-o", "NodeList"], capture_output=True, text=True
    )
    ran = [line.strip() for line in out.stdout.splitlines() if line.strip() and not line.startswith("None")]
    nodelist = ran[-1] if out.returncode == 0 and ran else ""
    if not nodelist:
        return {}
    info = subprocess.run(["sinfo", "-h", "-N", "-n", nodelist, "-o", "%N|%T|%E"], capture_output=True, text=True)
    down = {}
    for line in info.stdout.splitlines():
        node, state, reason = (line.split("|") + ["", ""])[:3]
        if state.rstrip("*~#!%$@^-").lower() in ("down", "drained", "draining", "fail", "failing") or "*" in state:
            down[node] = f"{state}: {reason}" if reason and reason != "none" else state
    return down


def wait(job: submitit.Job, poll_s: float = 3.0) -> bool:
    """Prints each state change until the job ends; returns True when it succeeded (rank 0's result)."""
    t0, last = time.monotonic(), None
    while True:
        state = job.state
        if state != last:
            print(f"  [{time.monotonic() - t0:6.0f} s] job {job.job_id}: {state}", flush=True)
            last = state
        # done() sees the result file; the Slurm state (via sacct/squeue) may lag it by a few seconds.
        if job.done() or state.split()[0] in FINAL_STATES:
            break
        time.sleep(poll_s)
    error = job.exception() if job.done() else RuntimeError(f"job ended in state {state} without a result")
    if error is not None:
        stderr = Path(job.paths.stderr)
        tail = stderr.read_text(errors="replace").splitlines()[-20:] if stderr.exists() else []
        reason = str(error).splitlines()[-1] if str(error) else repr(error)
        print("\n".join([f"  error: {reason}", "  last lines of stderr:", *tail]))
        for node, why in failed_nodes(job.job_id).items():
            print(f"  node {node} failed ({why}): Slurm ended the job with it")
    outcome = "succeeded" if error is None else "failed"
    print(f"job {job.job_id} {outcome} after {time.monotonic() - t0:.0f} s; log {job.paths.stdout}")
    return error is None


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    # key=value overrides may sit anywhere among the flags (argparse's intermixed mode rejects subparsers).
    args, extra = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    bad = [item for item in extra if "=" not in item or item.startswith("-")]
    if bad:
        parser.error(f"unrecognized arguments: {' '.join(bad)} (recipe overrides are key=value)")
    args.overrides = extra
    try:
        job = submit(args)
    except ValueError as err:
        parser.error(str(err))
    return 0 if not args.wait or wait(job) else 1


if __name__ == "__main__":
    sys.exit(main())
