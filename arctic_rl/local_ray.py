"""The embedded Ray cluster: what create_arctic_rl_client, `arctic-rl run` and `arctic-rl serve` start when no
Ray address is given. Ray's gRPC servers listen on every interface, and anyone who can reach them can run
code as this user, so the cluster runs with Ray's token authentication on (a fresh token for each cluster),
its temp dir inside a fresh folder only this user can enter (removed when the process that started it exits), and without arctic-rl's bearer token in the
environment its processes inherit. Ray-free at import (jobs.bootstrap uses private_dir too).

A framework's own Ray (the native verl and SkyRL baselines, verl on arctic-rl: their drivers call
`ray.init(address="local")` themselves) gets the same through this module's command line:

    python -m arctic_rl.local_ray run -- CMD [ARGS ...]

runs CMD with RAY_AUTH_MODE=token and a fresh RAY_AUTH_TOKEN in its environment (never in a file or argv), without
ARCTIC_RL_TOKEN, and with RAY_TMPDIR a new 0700 folder inside ray_temp_root() (Ray's temp dir is then
<that folder>/ray); when CMD ends, what is left of its process group is stopped and the folder removed. Its exit
status is CMD's."""

from __future__ import annotations

import atexit
import os
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

from arctic_rl.config import TOKEN_ENV

# Ray's own settings for a cluster arctic-rl starts (the embedded one, a job's head, the test suite's): `ray start
# --system-config` or ray.init's _system_config take them; a node that joins gets them from the head. Ray deletes
# objects nobody references in batches, once a second by default: a weight sync puts its buckets into the object
# store faster than that, so the store hands out fresh pages for about a second's worth of buckets before it reuses
# freed ones, and both the trainer and the sampler touch them (on a 323 MiB model that was 121 MiB of extra memory
# in each at the first sync, and the sampler's peak went over half the model; every 50 ms, 45 MiB).
RAY_SYSTEM_CONFIG: dict[str, int] = {"free_objects_period_milliseconds": 50}

# Short on purpose: Ray's unix sockets live under its temp dir, and a socket path must stay under ~107 chars.
TEMP_ROOT = Path("/tmp")


def private_dir(path: Path, what: str = "folder") -> Path:
    """`path` as a folder only this user can enter: created 0700 when missing, else checked to be a real folder
    (not a symlink), owned by this user and not writable by group or others (then closed to 0700). A folder
    someone else made or could write into (e.g. a predictable name under /tmp created first by another user)
    is refused, naming it."""
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:
        pass
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise PermissionError(
            f"{what} {path} is not a folder (it is a {'symlink' if stat.S_ISLNK(st.st_mode) else 'file'}): "
            "someone may be redirecting it; remove it and start again"
        )
    if st.st_uid != os.getuid():
        raise PermissionError(
            f"{what} {path} is owned by uid {st.st_uid}, not by this user (uid {os.getuid()}): whoever made it can "
            "read or replace what is kept there; remove it (as its owner or root) or use another location"
        )
    if st.st_mode & 0o022:
        raise PermissionError(
            f"{what} {path} has mode {oct(st.st_mode & 0o777)}: group or others can write into it (and may have "
            f"already); remove it and start again"
        )
    if st.st_mode & 0o077:
        # Ours and only readable by others (a umask default, e.g. from an older arctic-rl): nobody else can
        # have put anything inside, so closing it is safe.
        os.chmod(path, 0o700)
    return path


def ray_temp_root(root: Path = TEMP_ROOT) -> Path:
    """This user's private folder for Ray temp dirs: <root>/arctic-rl-ray-<uid>, 0700 and ours. Ray makes a
    temp dir it is given, and the session folders in it, world-writable (it expects a shared /tmp/ray), so
    each cluster's temp dir is a folder inside this one, which is what keeps other users out."""
    return private_dir(root / f"arctic-rl-ray-{os.getuid()}", "Ray temp folder")


@contextmanager
def without_env(name: str) -> Iterator[None]:
    """`name` absent from os.environ inside the block (processes started there do not inherit it)."""
    value = os.environ.pop(name, None)
    try:
        yield
    finally:
        if value is not None:
            os.environ[name] = value


def new_ray_token_env() -> dict[str, str]:
    """Ray's token mode with a fresh random token, as environment variables (RAY_AUTH_TOKEN has the highest
    precedence of Ray's token sources; a RAY_AUTH_TOKEN_PATH beside it must be removed)."""
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}


def use_new_ray_token() -> None:
    """Token mode with a fresh token, for this process and the processes it starts from now on (the deploy
    process attaches with it). Ray read RAY_AUTH_MODE when it was imported, so its cached config and token
    are reloaded too."""
    from ray._raylet import AuthenticationTokenLoader, Config  # type: ignore[attr-defined]  # (not in its stub)

    os.environ.update(new_ray_token_env())
    os.environ.pop("RAY_AUTH_TOKEN_PATH", None)
    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()


def start_local_ray(**init_kwargs) -> str:
    """Starts the embedded cluster (ray.init(address="local", ...) with token auth, see the module docstring);
    returns its GCS address. A RAY_AUTH_MODE=disabled in the environment does not apply to it. Its temp dir is
    <a fresh 0700 folder inside ray_temp_root()>/ray, removed when this process exits (after Ray's shutdown)."""
    import ray

    use_new_ray_token()
    run_dir = Path(tempfile.mkdtemp(dir=ray_temp_root()))
    atexit.register(_shutdown_and_remove, run_dir)  # runs before Ray's own atexit shutdown (registered earlier)
    # GCS, raylet and (through the raylet) every worker inherit this process's environment as it is now.
    with without_env(TOKEN_ENV):
        ray.init(
            address="local",
            _temp_dir=str(run_dir / "ray"),
            _system_config=RAY_SYSTEM_CONFIG,
            **init_kwargs,
        )
    return ray.get_runtime_context().gcs_address


def _shutdown_and_remove(run_dir: Path) -> None:
    import ray

    ray.shutdown()
    shutil.rmtree(run_dir, ignore_errors=True)


@contextmanager
def fresh_run_dir() -> Iterator[Path]:
    """A new folder for one run's Ray inside ray_temp_root(), 0700 (mkdtemp), removed afterwards. Kept short:
    Ray's socket paths under it must stay under ~107 characters."""
    path = Path(tempfile.mkdtemp(dir=ray_temp_root()))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def private_ray_env(run_dir: Path, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """`environ` (default: this process's) for a driver that starts its own Ray (`ray.init(address="local")`):
    token auth with a fresh token, Ray's temp dir inside `run_dir` (RAY_TMPDIR), no bearer token."""
    env = dict(os.environ if environ is None else environ)
    for name in (TOKEN_ENV, "RAY_AUTH_TOKEN_PATH"):
        env.pop(name, None)
    env.update(new_ray_token_env())
    env["RAY_TMPDIR"] = str(run_dir)
    return env


def stop_group(pgid: int, grace_s: float = 10.0) -> None:
    """SIGTERM to what is left of process group `pgid`, SIGKILL after `grace_s`."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)


def run_with_private_ray(cmd: Sequence[str]) -> int:
    """Runs `cmd` (in a process group of its own) with private_ray_env in a fresh_run_dir; forwards SIGINT and
    SIGTERM to it; then stops what is left of its group (a Ray its driver did not shut down) and removes the
    folder. Returns cmd's exit status."""
    with fresh_run_dir() as run_dir:
        print(
            f"arctic-rl: a private Ray for this run: token auth with a fresh token, temp dir {run_dir} (0700, "
            "removed afterwards)",
            file=sys.stderr,
            flush=True,
        )
        proc = subprocess.Popen(list(cmd), env=private_ray_env(run_dir), start_new_session=True)

        def forward(signum: int, frame: object) -> None:
            try:
                os.killpg(proc.pid, signum)
            except ProcessLookupError:
                pass

        previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            code = proc.wait()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            stop_group(proc.pid)
    return code if code >= 0 else 128 - code


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] != ["run"] or len(args) < 2:
        print("usage: python -m arctic_rl.local_ray run [--] CMD [ARGS ...]", file=sys.stderr)
        return 2
    cmd = args[2:] if args[1] == "--" else args[1:]
    if not cmd:
        print("usage: python -m arctic_rl.local_ray run [--] CMD [ARGS ...]: no CMD given", file=sys.stderr)
        return 2
    return run_with_private_ray(cmd)


if __name__ == "__main__":
    sys.exit(main())
