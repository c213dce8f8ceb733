"""The folders jobs/bootstrap.py creates or reuses, and the environment it gives Ray: its functions called
directly, without Slurm or Ray. A job's Ray temp dir has a predictable name, so the folder it lives in must be
this user's own and closed; job folders (token file, logs, checkpoints) are 0700; the bearer token stays out
of `ray start`'s environment (which every Ray worker of the node inherits) and out of the node probes'."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from arctic_rl.config import TOKEN_ENV
from jobs import bootstrap

OTHER_UID = 65534  # nobody


def config(tmp_path: Path) -> bootstrap.BootstrapConfig:
    cfg = bootstrap.BootstrapConfig(command=["true"], job_dir=tmp_path / "job", ray_temp_root=tmp_path / "tmp")
    cfg.ray_temp_root.mkdir()
    bootstrap.make_job_dir(cfg.job_dir)
    return cfg


def temp_root(cfg: bootstrap.BootstrapConfig) -> Path:
    return cfg.ray_temp_root / f"arctic-rl-ray-{os.getuid()}"


def mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


def test_a_temp_root_owned_by_another_user_is_refused_naming_it(tmp_path):
    if os.getuid() != 0:
        pytest.skip("making a folder owned by another uid needs root")
    cfg = config(tmp_path)
    planted = temp_root(cfg)
    planted.mkdir(mode=0o700)
    os.chown(planted, OTHER_UID, OTHER_UID)
    node = bootstrap.RayNode(cfg, head_address=None)
    try:
        with pytest.raises(PermissionError, match=f"{planted} is owned by uid {OTHER_UID}"):
            node.start()
        assert node.proc is None  # nothing of Ray started
    finally:
        node.stop()  # (stops what a start that was not refused began)


@pytest.mark.parametrize("bad_mode", [0o777, 0o770, 0o703])
def test_a_temp_root_others_can_write_into_is_refused_naming_it(tmp_path, bad_mode):
    cfg = config(tmp_path)
    planted = temp_root(cfg)
    planted.mkdir()
    os.chmod(planted, bad_mode)
    node = bootstrap.RayNode(cfg, head_address=None)
    try:
        with pytest.raises(PermissionError, match=f"{planted} has mode {oct(bad_mode)}"):
            node.start()
        assert node.proc is None
    finally:
        node.stop()


def test_a_symlinked_temp_root_is_refused(tmp_path):
    cfg = config(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    temp_root(cfg).symlink_to(elsewhere)
    with pytest.raises(PermissionError, match=f"{temp_root(cfg)} is not a folder \\(it is a symlink\\)"):
        bootstrap.RayNode(cfg, head_address=None).prepare_dirs()


def test_created_folders_are_private(tmp_path):
    cfg = config(tmp_path)
    node = bootstrap.RayNode(cfg, head_address=None)
    node.prepare_dirs()
    assert mode(cfg.job_dir) == 0o700
    assert mode(node.log_path.parent) == 0o700
    assert mode(temp_root(cfg)) == 0o700
    assert node.temp_dir.parent == temp_root(cfg)


def test_an_existing_job_folder_is_closed_or_refused(tmp_path):
    readable = tmp_path / "readable"
    readable.mkdir()
    os.chmod(readable, 0o755)  # the umask default of a folder the user made: nobody else can have written in it
    bootstrap.make_job_dir(readable)
    assert mode(readable) == 0o700
    writable = tmp_path / "writable"
    writable.mkdir()
    os.chmod(writable, 0o777)
    with pytest.raises(PermissionError, match=f"job folder {writable} has mode 0o777"):
        bootstrap.make_job_dir(writable)


def test_the_bearer_token_stays_out_of_ray_nodes_and_probes(tmp_path, monkeypatch):
    monkeypatch.setenv(TOKEN_ENV, "bearer-s3cret")
    monkeypatch.setenv("RAY_AUTH_TOKEN", "some-other-clusters-token")
    cfg = config(tmp_path)
    env = bootstrap.RayNode(cfg, head_address=None).env()
    assert TOKEN_ENV not in env
    # The job's own token file, not an inherited token (Ray prefers RAY_AUTH_TOKEN to the file when non-empty).
    assert env["RAY_AUTH_TOKEN"] == "" and env["RAY_AUTH_TOKEN_PATH"] == str(bootstrap.token_file(cfg))
    assert TOKEN_ENV not in bootstrap.pythonpath_env()
    # The recipe command serves HTTP (or starts the server that does): it keeps the token.
    assert bootstrap.command_env(cfg, "127.0.0.1:1")[TOKEN_ENV] == "bearer-s3cret"


def test_ports_for_ray_are_never_ones_the_kernel_hands_out():
    """A port from bind(0) can be taken by any of Ray's own ephemeral binds before `ray start` binds it (the Ray
    Client server's port was, in a two-node job: its head died). Ports given to Ray come from below the range."""
    low = bootstrap.ephemeral_low()
    ports = {bootstrap.free_port() for _ in range(50)}
    assert all(bootstrap.LOWEST_PORT <= p < low for p in ports), (low, sorted(ports))
    assert min(ports) > 19999, sorted(ports)  # Ray's default worker ports (10002-19999): ray start refuses those
    assert len(ports) > 1


def test_the_head_stops_waiting_for_nodes_when_its_ray_dies(tmp_path):
    """The head's `ray start` died after its address was published (its Ray Client server failed to bind): no
    node can register any more, and the head had waited out register_timeout_s. It fails at once, naming its log."""
    cfg = bootstrap.BootstrapConfig(
        command=["true"], job_dir=tmp_path / "job", ray_temp_root=tmp_path / "tmp", num_nodes=2, register_timeout_s=60
    )
    (tmp_path / "job").mkdir()
    with pytest.raises(RuntimeError, match="head's Ray exited while waiting for nodes.*ray-node0.log"):
        bootstrap.wait_for_nodes(cfg, "127.0.0.1:1", head_alive=lambda: False, head_log="ray-node0.log")


def test_the_head_starts_ray_with_arctic_rls_system_config(tmp_path):
    """Nodes that join take the head's system config, so only the head's `ray start` carries it."""
    import json

    from arctic_rl.local_ray import RAY_SYSTEM_CONFIG

    cfg = config(tmp_path)
    head = bootstrap.RayNode(cfg, head_address=None).argv()
    flags = [a.split("=", 1)[1] for a in head if a.startswith("--system-config=")]
    assert [json.loads(f) for f in flags] == [RAY_SYSTEM_CONFIG], head
    assert not any(a.startswith("--system-config") for a in bootstrap.RayNode(cfg, head_address="10.0.0.1:6379").argv())


def fake_env(tmp_path: Path, ray_version: str = "2.60.0", ray: bool = True, client: str = "client") -> Path:
    """An environment's bin/ with a `python` that answers bootstrap.RAY_PROBE as a Ray of ray_version (with or
    without Ray Client) would, and (with ray) a `ray` beside it."""
    bin_dir = tmp_path / "env" / "bin"
    bin_dir.mkdir(parents=True)
    for name in ("python", "ray") if ray else ("python",):
        (bin_dir / name).write_text(f"#!/bin/sh\necho {ray_version} {client}\n")
        (bin_dir / name).chmod(0o755)
    return bin_dir / "python"


def test_the_jobs_ray_is_that_of_ray_python(tmp_path: Path) -> None:
    """A command that drives Ray from another environment (native SkyRL: Python 3.12) can join only a Ray of
    its own version: the nodes start that environment's `ray`, the probes and the node watch run its python, and
    the command is told whose Ray it is."""
    python = fake_env(tmp_path)
    cfg = bootstrap.BootstrapConfig(
        command=["true"], job_dir=tmp_path / "job", ray_temp_root=tmp_path / "tmp", ray_python=python
    )
    assert bootstrap.RayNode(cfg, head_address=None).argv()[0] == str(python.with_name("ray"))
    assert cfg.python == str(python)
    assert bootstrap.command_env(cfg, "127.0.0.1:1")["ARCTIC_RL_RAY_PYTHON"] == str(python)
    (tmp_path / "default").mkdir()
    default = config(tmp_path / "default")
    assert bootstrap.RayNode(default, head_address=None).argv()[0] == str(Path(sys.executable).with_name("ray"))
    assert bootstrap.command_env(default, "127.0.0.1:1")["ARCTIC_RL_RAY_PYTHON"] == sys.executable


def test_a_ray_python_without_token_auth_or_ray_is_refused_naming_it(tmp_path: Path) -> None:
    """Every job's Ray runs with a token; a Ray before 2.52 (SkyRL's pinned 2.51.1) ignores RAY_AUTH_MODE and
    would run open, so it is refused at submit time, as are a path that is no interpreter, one with no Ray and
    a Ray without Ray Client."""
    job = tmp_path / "job"
    old = fake_env(tmp_path / "old", "2.51.1")
    with pytest.raises(ValueError, match=rf"ray_python={old} has Ray 2\.51\.1, which has no token authentication"):
        bootstrap.BootstrapConfig(command=["true"], job_dir=job, ray_python=old)
    with pytest.raises(ValueError, match=r"ray_python=.*README\.md: not an executable file"):
        bootstrap.BootstrapConfig(command=["true"], job_dir=job, ray_python=Path("README.md"))
    no_ray = fake_env(tmp_path / "noray", ray=False)
    with pytest.raises(ValueError, match=rf"ray_python={no_ray}: no `ray` executable beside it"):
        bootstrap.BootstrapConfig(command=["true"], job_dir=job, ray_python=no_ray)
    broken = fake_env(tmp_path / "broken")
    broken.write_text("#!/bin/sh\necho 'ModuleNotFoundError: No module named ray' >&2\nexit 1\n")
    with pytest.raises(ValueError, match=r"`import ray` failed \(ModuleNotFoundError: No module named ray\)"):
        bootstrap.BootstrapConfig(command=["true"], job_dir=job, ray_python=broken)
    # The head serves Ray Client (its port is one of ours); `ray start` refuses that without grpcio.
    minimal = fake_env(tmp_path / "minimal", client="no-client")
    with pytest.raises(ValueError, match=r"no Ray Client \(grpcio\); install ray\[client\]==2\.60\.0 there"):
        bootstrap.BootstrapConfig(command=["true"], job_dir=job, ray_python=minimal)


def test_both_launchers_pass_ray_python_to_every_node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from jobs import slurm
    from jobs.components import recipe

    python = fake_env(tmp_path)
    monkeypatch.chdir(tmp_path)
    args = slurm.build_parser().parse_args(
        ["submit", "--recipe", "toy", "--command", "true", "--ray-python", str(python)]
    )
    args.overrides = []
    assert slurm.make_template(args, tmp_path / "job").ray_python == python
    app = recipe(recipe="toy", command="true", ray_python=str(python), job_root=str(tmp_path / "jobs"))
    (role,) = app.roles
    sep = role.args.index("--")
    assert f"--ray-python={python}" in role.args[:sep]
    # What each node parses (TorchX fills in its rank macros at run time; a node's rank comes from Slurm then).
    node_args = [a for a in role.args[2:] if "${" not in a]
    assert bootstrap.parse_args(node_args).ray_python == python
    with pytest.raises(ValueError, match="has Ray 2.51.1"):
        recipe(recipe="toy", command="true", ray_python=str(fake_env(tmp_path / "old", "2.51.1")))
