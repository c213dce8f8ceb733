"""The embedded Ray cluster: what create_arctic_rl_client, `arctic-rl run` and `arctic-rl serve` start when no
Ray address is given. Ray's gRPC servers listen on every interface, and anyone who can reach them can run
code as this user, so the cluster runs with Ray's token authentication on (a fresh token for each cluster),
its temp dir inside a folder only this user can enter, and without arctic-rl's bearer token in the
environment its processes inherit. Ray-free at import (jobs.bootstrap uses private_dir too)."""

from __future__ import annotations

import os
import secrets
import stat
from collections.abc import Iterator
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


def use_new_ray_token() -> None:
    """Token mode with a fresh token, for this process and the processes it starts from now on (the deploy
    process attaches with it). Ray read RAY_AUTH_MODE when it was imported, so its cached config and token
    are reloaded too."""
    from ray._raylet import AuthenticationTokenLoader, Config  # type: ignore[attr-defined]  # (not in its stub)

    os.environ["RAY_AUTH_MODE"] = "token"
    os.environ["RAY_AUTH_TOKEN"] = secrets.token_hex(32)  # highest precedence of Ray's token sources
    os.environ.pop("RAY_AUTH_TOKEN_PATH", None)
    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()


def start_local_ray(**init_kwargs) -> str:
    """Starts the embedded cluster (ray.init(address="local", ...) with token auth, see the module docstring);
    returns its GCS address. A RAY_AUTH_MODE=disabled in the environment does not apply to it."""
    import ray

    use_new_ray_token()
    # GCS, raylet and (through the raylet) every worker inherit this process's environment as it is now.
    with without_env(TOKEN_ENV):
        ray.init(
            address="local",
            _temp_dir=str(ray_temp_root() / "local"),
            _system_config=RAY_SYSTEM_CONFIG,
            **init_kwargs,
        )
    return ray.get_runtime_context().gcs_address
