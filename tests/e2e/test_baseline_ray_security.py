"""The Rays that the baseline scripts start on one host (native verl: recipes/verl/native/run_tiny.sh, native SkyRL:
recipes/skyrl/native_cpu/run.sh, verl on arctic-rl: recipes/verl/run_tiny.sh), the embedded cluster
(arctic_rl/local_ray.py) and the evals' (evals/sampler.py): each runs with Ray's token authentication and a fresh
token, in a fresh temp dir only this user can enter, removed after the run.

Each script runs for real, as a user runs it, up to the point where its Python starts the trainer: that Python is
a stand-in (the scripts' PYTHON / SKYRL_NATIVE_PYTHON) which starts Ray as the trainer would, with the script's
environment and arguments (verl's main_ppo: `ray.init(**ray_kwargs.ray_init)`; SkyRL's initialize_ray: `ray.init(
runtime_env=...)` through recipes/skyrl/native_cpu/main.py's wrapper), reports the cluster and waits. An outsider
with no Ray settings then calls the GCS and the raylet over gRPC (test_embedded_ray_security's probe): refused
without the token, answered with it. The training itself is not run here (minutes each; docs/frameworks.md)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from repo_paths import REPO
from test_embedded_ray_security import PROBE

from arctic_rl.local_ray import ray_temp_root

pytestmark = pytest.mark.slow

# The trainer's Python, as far as its Ray: argv is what the script passes to its Python.
TRAINER = r"""
import json, os, sys
args = sys.argv[1:]
import ray
if args[:2] in (["-m", "recipes.verl.native.run"], ["-m", "recipes.verl.main"]):
    # verl's main_ppo: ray.init(**config.ray_kwargs.ray_init), from the script's +ray_kwargs.ray_init.* overrides
    init = dict(a.split("=", 1) for a in args if a.startswith("+ray_kwargs.ray_init."))
    kwargs = {k.rpartition(".")[2]: v for k, v in init.items()}
    ray.init(address=kwargs["address"], num_cpus=int(kwargs["num_cpus"]), include_dashboard=False)
elif args[:2] == ["-m", "recipes.skyrl.native_cpu.main"]:
    import recipes.skyrl.native_cpu.main  # noqa: F401  (its ray.init wrapper, which SkyRL's initialize_ray meets)
    ray.init(runtime_env={"env_vars": {}})
elif args == ["--embedded"]:  # create_arctic_rl_client over Ray, arctic-rl serve / run
    from arctic_rl.local_ray import start_local_ray
    start_local_ray(include_dashboard=False, num_cpus=1)
elif args == ["--evals"]:  # the evals' --model mode with several vLLM replicas
    from evals.sampler import init_ray
    init_ray()
else:
    sys.exit(f"the stand-in trainer was run as {args[:3]}")
node = ray._private.worker._global_node
info = ray.nodes()[0]
print(json.dumps({
    "gcs": ray.get_runtime_context().gcs_address,
    "raylet": f"{info['NodeManagerAddress']}:{info['NodeManagerPort']}",
    "temp_dir": node.get_temp_dir_path(),
    "ray_token": os.environ.get("RAY_AUTH_TOKEN", ""),
    "bearer": os.environ.get("ARCTIC_RL_TOKEN"),
}), flush=True)
sys.stdin.read()  # up until the test closes stdin
ray.shutdown()
"""


def stand_in_python(folder: Path) -> Path:
    (folder / "trainer.py").write_text(TRAINER)
    python = folder / "python"
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{folder / "trainer.py"}" "$@"\n')
    python.chmod(0o755)
    return python


def script_setup(name: str, tmp: Path, python: Path) -> tuple[list[str], dict[str, str]]:
    """argv and the variables beyond the user's environment that run the script `name` to its trainer, on
    prepared data and model files (so the script's own data and model steps are skipped); for the embedded
    cluster and the evals, the stand-in itself, which starts Ray as they do."""
    if name in ("embedded", "evals"):
        return [str(python), f"--{name}"], {"PYTHONPATH": str(REPO)}
    if name in ("verl-native", "verl-arctic"):
        data = tmp / "verl-data"
        data.mkdir()
        (data / "train.parquet").touch()
        script = "recipes/verl/native/run_tiny.sh" if name == "verl-native" else "recipes/verl/run_tiny.sh"
        return [script, str(tmp / "model")], {"PYTHON": str(python), "VERL_DATA": str(data), "VERL_OUT": str(tmp)}
    out = tmp / "skyrl-out"
    (out / "tiny-llama").mkdir(parents=True)
    (out / "tiny-llama" / "config.json").write_text("{}")
    (out / "data").mkdir()
    (out / "data" / "train.jsonl").touch()
    return ["recipes/skyrl/native_cpu/run.sh"], {"SKYRL_NATIVE_PYTHON": str(python), "SKYRL_OUT": str(out)}


def probe(cluster: dict, token: str = "") -> dict:
    """GCS and raylet calls from a process with no Ray settings (and so no token unless given)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "ARCTIC_RL_"))}
    argv = [sys.executable, "-c", PROBE, cluster["gcs"], cluster["raylet"]] + ([token] if token else [])
    out = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def private_folder_above(path: Path) -> Path | None:
    """The nearest folder at or above `path` that only its owner can enter."""
    for folder in [path, *path.parents]:
        st = os.lstat(folder)
        if stat.S_ISDIR(st.st_mode) and not st.st_mode & 0o077:
            return folder
    return None


STARTUP_TIMEOUT = "timed out during startup"  # Ray's fixed 30 s wait for its raylet (a loaded machine)


def start(argv: list[str], env: dict[str, str], log: Path) -> tuple[subprocess.Popen, dict]:
    """The script, up to its trainer's report of the cluster; started again (up to 3 tries) when Ray gave up on
    its own raylet's start-up, as jobs/bootstrap.py does."""
    for _ in range(3):
        with log.open("wb") as stderr:
            proc = subprocess.Popen(
                argv if argv[0].startswith("/") else ["bash", *argv],
                cwd=REPO,
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
            )
        line = proc.stdout.readline()
        if line:
            return proc, json.loads(line)
        proc.wait(timeout=120)
        if STARTUP_TIMEOUT not in log.read_text():
            break
    pytest.fail(f"{argv[0]} started no Ray (exit {proc.returncode}):\n{log.read_text()[-4000:]}")


@pytest.mark.parametrize("name", ["verl-native", "skyrl-native", "verl-arctic", "embedded", "evals"])
def test_a_baseline_s_ray_refuses_callers_without_its_token_and_keeps_a_fresh_private_temp_dir(name, tmp_path):
    """The user's environment says RAY_AUTH_MODE=disabled (what the Makefile used to export; Ray 2.60 would
    otherwise turn token auth on by itself, with the long-lived token it keeps in ~/.ray/auth_token), and
    ~/.ray holds a token of an earlier run: the baseline's Ray still requires a token, a fresh one."""
    python = stand_in_python(tmp_path)
    argv, extra = script_setup(name, tmp_path, python)
    home = tmp_path / "home"  # Ray must never read or write a token in the real ~/.ray
    (home / ".ray").mkdir(parents=True)
    (home / ".ray" / "auth_token").write_text("stale-token-of-an-earlier-run")
    # The user's environment: no Ray settings of the test session's, a bearer token the run has no use for.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "ARCTIC_RL_"))}
    env.update(extra, HOME=str(home), RAY_AUTH_MODE="disabled", ARCTIC_RL_TOKEN="bearer-s3cret")
    temp_root = ray_temp_root()
    before = set(os.listdir(temp_root))
    log = tmp_path / "stderr.log"
    proc, cluster = start(argv, env, log)
    try:
        # An outsider is refused, with no token or the stale one; with the run's token the same calls are answered
        # (the refusal is the token check).
        assert probe(cluster) == {"gcs": "UNAUTHENTICATED", "raylet": "UNAUTHENTICATED"}, (name, cluster)
        stale = probe(cluster, "stale-token-of-an-earlier-run")
        assert stale == {"gcs": "UNAUTHENTICATED", "raylet": "UNAUTHENTICATED"}, (name, cluster)
        assert cluster["ray_token"], f"{name}: the run's Ray token is not in its environment"
        assert probe(cluster, cluster["ray_token"]) == {"gcs": "OK", "raylet": "OK"}
        if name not in ("embedded", "evals"):  # (their driver is arctic-rl's client: test_embedded_ray_security)
            assert cluster["bearer"] is None  # a baseline's Ray has no use for arctic-rl's bearer token
        # Ray's temp dir sits in a folder only this user can enter, made for this run.
        private = private_folder_above(Path(cluster["temp_dir"]))
        assert private is not None, f"{name}: no folder above {cluster['temp_dir']} is closed to other users"
        assert private.parent == temp_root and private.name not in before, private
        assert os.lstat(private).st_uid == os.getuid()
    finally:
        proc.stdin.close()
        try:
            code = proc.wait(timeout=300)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    assert code == 0, log.read_text()[-4000:]
    assert not private.exists(), f"{private} was left behind"
    assert (home / ".ray" / "auth_token").read_text() == "stale-token-of-an-earlier-run"  # no token file written
