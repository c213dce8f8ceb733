"""The launchers' shared pieces and the TorchX AppDef, without Slurm or Ray."""

import subprocess
import sys
from pathlib import Path

import pytest
from repo_paths import REPO

from jobs import bootstrap, launch
from jobs.components import recipe

REPO = REPO


@pytest.mark.parametrize(
    ("value", "minutes"),
    [("30", 30), ("90:30", 91), ("02:00:00", 120), ("1-00", 1440), ("1-02:30", 1590), ("0-00:00:30", 1)],
)
def test_parse_slurm_time(value: str, minutes: int) -> None:
    assert launch.parse_slurm_time(value) == minutes


@pytest.mark.parametrize("value", ["", "abc", "0", "1:2:3:4"])
def test_parse_slurm_time_rejects(value: str) -> None:
    with pytest.raises(ValueError, match="--time"):
        launch.parse_slurm_time(value)


ARCTIC = str(Path(sys.executable).with_name("arctic-rl"))


def test_recipe_command_adds_checkpoint_and_resume(tmp_path: Path) -> None:
    cmd = launch.recipe_command("c.yaml", ["train.steps=3"], tmp_path)
    assert cmd == [ARCTIC, "run", "c.yaml", "train.steps=3", f"checkpoint.dir={tmp_path}/checkpoints", "resume=auto"]
    # the user's own keys are kept, not duplicated
    cmd = launch.recipe_command("c.yaml", ["checkpoint.dir=/x", "resume=never"], tmp_path, "arctic-rl run")
    assert cmd == [ARCTIC, "run", "c.yaml", "checkpoint.dir=/x", "resume=never"]


def test_native_command_runs_as_given(tmp_path: Path) -> None:
    native = "python -m recipes.verl.main trainer.total_training_steps=2 'data.train_files=a b.parquet'"
    assert launch.recipe_command(None, [], tmp_path, native) == [
        "python",
        "-m",
        "recipes.verl.main",
        "trainer.total_training_steps=2",
        "data.train_files=a b.parquet",
    ]
    with pytest.raises(ValueError, match="--command runs as given: put 'train.steps=2' into the command"):
        launch.recipe_command(None, ["train.steps=2"], tmp_path, native)


def test_every_recipe_ships_a_default_config_that_validates() -> None:
    for name in ("text2sql", "longqa", "toy"):
        config = launch.resolve_config(name, None)
        assert config.endswith(f"recipes/{name}/configs/default.yaml")
        launch.validate_run(config, ["train.steps=2"])


def test_wrong_key_fails_before_anything_is_queued(tmp_path: Path) -> None:
    """A typo'd override is refused on the submitting machine within seconds, naming the key and the allowed
    keys, and leaves no job folder behind (it used to fail on the compute node after the job queued)."""
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "jobs.slurm",
            "submit",
            "--recipe",
            "text2sql",
            "trainer.steps=2",
            "--nodes",
            "2",
            "--job-root",
            str(tmp_path / "jobs"),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2, out.stdout + out.stderr
    assert "trainer: Extra inputs are not permitted (allowed: model, backend, recipe" in out.stderr, out.stderr
    assert not (tmp_path / "jobs").exists()
    with pytest.raises(ValueError, match=r"train\.stpes: Extra inputs.*allowed: steps, prompts_per_step"):
        recipe("train.stpes=3", recipe="text2sql", job_root=str(tmp_path / "jobs"))


def test_bad_inputs_name_the_value(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="'steps' is not key=value"):
        launch.recipe_command("c.yaml", ["steps"], tmp_path)
    with pytest.raises(ValueError, match="recipe='a b'"):
        launch.check_recipe("a b")
    with pytest.raises(ValueError, match="config='nope.yaml' does not exist"):
        launch.resolve_config("text2sql", "nope.yaml")
    with pytest.raises(ValueError, match="rank=2 is outside 0..1"):
        bootstrap.BootstrapConfig(command=["x"], job_dir=tmp_path, num_nodes=2, rank=2)


def test_component_has_one_replica_per_node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    app = recipe("train.steps=3", recipe="text2sql", nodes=2, gpus_per_node=8, cpus_per_node=4)
    (role,) = app.roles
    assert role.num_replicas == 2 and role.resource.gpu == 8 and role.resource.cpu == 4
    assert role.entrypoint == sys.executable
    sep = role.args.index("--")
    assert role.args[sep + 1 : sep + 5] == [ARCTIC, "run", launch.resolve_config("text2sql", None), "train.steps=3"]
    assert role.args[sep + 6] == "resume=auto"
    assert "--nnodes=2" in role.args and "--num-gpus=8" in role.args


def test_torchx_slurm_dryrun_writes_a_het_job(tmp_path: Path) -> None:
    """`torchx run --dryrun -s slurm` prints the sbatch script without needing Slurm."""
    out = subprocess.run(
        [
            str(Path(sys.executable).with_name("torchx")),
            "run",
            "--dryrun",
            "-s",
            "slurm",
            "-cfg",
            "time=10",
            str(REPO / "jobs" / "components.py") + ":recipe",
            "--recipe",
            "text2sql",
            "--nodes",
            "2",
            "--",
            "train.steps=3",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    script = out.stdout + out.stderr
    assert "#SBATCH hetjob" in script and "--rank=0" in script and "--rank=1" in script
    assert "--head-env=SLURM_JOB_NODELIST_HET_GROUP_0" in script and "resume=auto" in script


def test_checkpoint_lets_the_requeue_survive_sigterm() -> None:
    """submitit runs `scontrol requeue` right after RecipeJob.checkpoint(); a SIGTERM to the job's
    processes (the preemption's, or the requeue's own) must not kill that child mid-call (CI saw it).
    Here the child is a shell that SIGTERMs itself; the pytest process's own signals are left alone."""
    code = (
        "import subprocess\n"
        "from jobs import slurm\n"
        "job = slurm.RecipeJob(template=None)\n"
        "{call}"
        "r = subprocess.run(['sh', '-c', 'kill -TERM $$; echo alive'], capture_output=True, text=True)\n"
        "print(r.returncode, r.stdout.strip())\n"
    )

    def child(call: str) -> list[str]:
        out = subprocess.run(
            [sys.executable, "-c", code.format(call=call)], cwd=REPO, capture_output=True, text=True, timeout=120
        )
        assert out.returncode == 0, out.stderr
        return out.stdout.split()

    assert child("") == ["-15"]  # without the checkpoint, the child dies of the signal
    assert child("job.checkpoint()\n") == ["0", "alive"]


def test_launchers_plan_gpu_runs_before_queueing(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """On GPU nodes both launchers run `arctic-rl plan` first: a run that fits prints its plan, one that
    cannot fit is refused with the plan's reasons before anything is queued (--skip-plan overrides)."""
    cmd = launch.prepare(
        "text2sql", None, ["backend.training_gpus=2", "backend.sampling_gpus=2"], tmp_path, nodes=2, gpus_per_node=1
    )
    assert cmd[1] == "run" and "engines" in capsys.readouterr().out.lower()
    big = str(REPO / "recipes" / "text2sql" / "configs" / "bird_qwen3_32b.yaml")
    with pytest.raises(ValueError, match=r"cannot (run|fit).*--skip-plan submits anyway"):
        launch.prepare("text2sql", big, [], tmp_path, nodes=1, gpus_per_node=8)
    with pytest.raises(ValueError, match="--skip-plan"):
        recipe(recipe="text2sql", config=big, nodes=1, gpus_per_node=8, job_root=str(tmp_path / "jobs"))
    assert launch.prepare("text2sql", big, [], tmp_path, nodes=1, gpus_per_node=8, plan=False)[2] == big
    assert not (tmp_path / "jobs").exists()


def test_node_probe_reads_its_own_lines_among_rays(capsys: pytest.CaptureFixture) -> None:
    """Ray may print lines of its own on the probe's stdout (a loaded CI machine did: the head died parsing one);
    the head reads only the probe's marked lines and logs the rest."""
    mark = bootstrap.PROBE_PREFIX
    lines = ["(raylet) a line of Ray's\n", f'{mark}{{"0": "arctic-n1"}}\n', "\n", f'{mark}{{"0": "a", "1": "b"}}\n']
    assert list(bootstrap.probe_messages(lines, 0)) == [{"0": "arctic-n1"}, {"0": "a", "1": "b"}]
    assert "node probe said: (raylet) a line of Ray's" in capsys.readouterr().out


def test_ray_start_is_started_again_only_after_its_own_startup_timeout(tmp_path: Path) -> None:
    """Ray gives its raylet a fixed 30 s to register (ray/_private/node.py); on a loaded machine it gives up and
    `ray start` exits ("The current node timed out during startup"). The node starts it again for that reason
    only, from this attempt's log, and at most STARTUP_RETRIES times."""
    node = bootstrap.RayNode(bootstrap.BootstrapConfig(command=["true"], job_dir=tmp_path), head_address="x:1")
    node.log_path.parent.mkdir(parents=True)
    node.log_path.write_text(f"Exception: {bootstrap.STARTUP_TIMED_OUT}. This could happen ...\n")
    node.log_start = node.log_path.stat().st_size  # an earlier attempt's message
    with open(node.log_path, "a") as out:
        out.write("Exception: some other failure\n")
    assert not node.restart_after_startup_timeout(0)
    node.log_start = 0
    assert not node.restart_after_startup_timeout(bootstrap.STARTUP_RETRIES)


def test_launchers_plan_against_the_gpu_memory_given(tmp_path: Path) -> None:
    """The GPU's memory is a launcher option (default 80 GiB, as `arctic-rl plan --gpu-memory-gib`): a run that
    fits on 80 GiB GPUs is refused before queueing on 1 GiB ones, by submitit's launcher and TorchX's."""
    from jobs import slurm

    small = ["backend.training_gpus=2", "backend.sampling_gpus=2"]
    assert launch.prepare("text2sql", None, small, tmp_path, nodes=2, gpus_per_node=1)[1] == "run"
    with pytest.raises(ValueError, match=r"need more than 1\.0 GiB"):
        launch.prepare("text2sql", None, small, tmp_path, nodes=2, gpus_per_node=1, gpu_memory_gib=1)
    args = slurm.build_parser().parse_args(
        ["submit", "--recipe", "text2sql", "--nodes", "2", "--gpus-per-node", "1", "--gpu-memory-gib", "1"]
    )
    args.overrides = small  # main() passes the key=value arguments so
    with pytest.raises(ValueError, match=r"need more than 1\.0 GiB"):
        slurm.make_template(args, tmp_path / "job")
    with pytest.raises(ValueError, match=r"need more than 1\.0 GiB"):
        recipe(*small, recipe="text2sql", nodes=2, gpus_per_node=1, gpu_memory_gib=1, job_root=str(tmp_path / "j"))


def test_submitit_gives_srun_one_task_per_node(tmp_path: Path) -> None:
    """The srun line of the batch script submitit writes (its own generator) names the node count and one task
    per node: the sbatch options alone let a requeued attempt run both tasks on one node (CI: sacct's step 6.0
    NNodes=1 NTasks=2)."""
    from jobs import slurm

    args = slurm.build_parser().parse_args(["submit", "--recipe", "text2sql", "--nodes", "2"])
    script = slurm.make_executor(args, tmp_path)._executor._make_submission_file_text("python -m x", "uid")
    (srun,) = [line for line in script.splitlines() if line.startswith("srun ")]
    assert "--nodes=2" in srun.split() and "--ntasks-per-node=1" in srun.split(), script
    # ... and bounds how long Slurm may defer that step (--immediate), the teardown naming why it gave up.
    assert f"--immediate={slurm.STEP_START_TIMEOUT_S}" in srun.split(), script
    assert "rc=$?" in script.split("srun ", 1)[1] and "--step-start-timeout-s" in script.split("srun ", 1)[1], script
    args.step_start_timeout_s = 1  # srun's "now or never"
    with pytest.raises(ValueError, match=r"--step-start-timeout-s=1: use at least 2 seconds"):
        slurm.make_executor(args, tmp_path)


def test_a_step_on_fewer_nodes_than_the_job_is_refused(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Every task checks Slurm's step layout before starting Ray: a step packed onto fewer nodes than the job
    holds fails naming both counts and the fix, instead of running a two-node deployment on one host."""
    from jobs import slurm

    slurm.check_one_task_per_node({})  # the local executor: no step
    slurm.check_one_task_per_node({"SLURM_STEP_NUM_NODES": "2", "SLURM_JOB_NUM_NODES": "2"})
    packed = {
        "SUBMITIT_EXECUTOR": "slurm",
        "SLURM_JOB_ID": "6",
        "SLURM_PROCID": "1",
        "SLURM_NTASKS": "2",
        "SLURM_JOB_NUM_NODES": "2",
        "SLURM_STEP_NUM_NODES": "1",
        "SLURM_STEP_NUM_TASKS": "2",
        "SLURM_STEP_NODELIST": "arctic-n1",
        "SLURM_JOB_NODELIST": "arctic-n[1-2]",
    }
    for key, value in packed.items():
        monkeypatch.setenv(key, value)
    template = bootstrap.BootstrapConfig(command=["true"], job_dir=tmp_path)
    with pytest.raises(RuntimeError, match=r"2 tasks on 1 of the job's 2 nodes .*--ntasks-per-node=1"):
        slurm.RecipeJob(template)()
    # The step started (and failed): the batch script's teardown must not say it never started.
    assert slurm.step_marker(tmp_path, 0).exists()
