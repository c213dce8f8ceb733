"""Ray-on-Slurm bootstrap: one process per node brings up a Ray cluster over the job's nodes, rank 0 runs
the recipe command against it, and every exit path tears Ray down.

    rank 0 (head):   ray start --head --block ... ; write <job_dir>/ray-head.<attempt>.json
                     wait until all N nodes registered (timeout names the missing ones)
                     RAY_ADDRESS=<head>:<port> <command ...>   (e.g. arctic-rl run CONFIG ...)
                     write <job_dir>/ray-stop.<attempt>; stop Ray
    rank r > 0:      read the head address file; ray start --address=<head> --block ... ;
                     exit 0 once the stop file appears (or the head is gone for 30 s)

Every node runs this same entry, launched by Slurm's `srun` (submitit runs one task per node; the TorchX
Slurm scheduler runs one het-group replica per node) or directly on a laptop (one node, local Ray):

    python -m jobs.bootstrap --job-dir runs/jobs/demo -- arctic-rl run recipes/text2sql/configs/x.yaml

Rank, node count and head host come from the flags, else from Slurm's environment, else one local node.
The job folder must be on a file system every node sees (it is on Slurm clusters; submitit needs it too):
the head publishes its address there, which is how workers find a head port chosen at run time.
Known limit: `ray stop` is never called, because it kills every Ray process of the user on the machine,
including other jobs'; each node stops exactly the `ray start --block` process tree it started.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from packaging.version import InvalidVersion, Version

from arctic_rl.config import TOKEN_ENV
from arctic_rl.local_ray import RAY_SYSTEM_CONFIG, TEMP_ROOT, private_dir, ray_temp_root

RANK_LABEL = "arctic-rl/rank"
HOST_LABEL = "arctic-rl/host"
HEAD_START_TIMEOUT_S = 120.0
HEAD_GONE_GRACE_S = 30.0
PROBE_TIMED_OUT = 3
NODE_LOST = 4
# Ray's message when its node gave up waiting for the raylet (a fixed 30 s in ray/_private/node.py).
STARTUP_TIMED_OUT = "The current node timed out during startup"
STARTUP_RETRIES = 2
PROBE_PREFIX = "arctic-rl-probe: "  # marks the probe's and the watch's own lines among Ray's on their stdout


@dataclass(kw_only=True)
class BootstrapConfig:
    """What one node needs to join (or lead) the job's Ray cluster and, on rank 0, run the recipe."""

    command: list[str]  # run on rank 0 once the cluster is complete
    job_dir: Path  # shared between nodes; stable across requeues (checkpoints, address files)
    num_nodes: int = 1
    rank: int = 0
    head_host: str = "127.0.0.1"  # only used for messages; the address comes from the job folder
    hostnames: list[str] = field(default_factory=list)  # expected host per rank, when known
    num_cpus: int | None = None  # per node; None lets Ray detect
    num_gpus: int | None = None
    resources: dict[str, float] = field(default_factory=dict)  # custom Ray resources of this node
    ray_args: list[str] = field(default_factory=list)  # extra `ray start` flags, e.g. --object-store-memory
    register_timeout_s: float = 300.0
    recipe: str | None = None
    tracking_uri: str | None = None
    workdir: Path | None = None  # cwd of the command; the submitter's directory
    signal_grace_s: float = 0.0  # after the command dies by a signal, wait this long for a requeue
    ray_temp_root: Path = TEMP_ROOT  # holds this user's 0700 arctic-rl-ray-<uid> folder of Ray temp dirs
    # The interpreter whose Ray the nodes run (`ray` beside it) and the probes import; None: this one. For a
    # command that drives Ray from another environment: a driver joins only a cluster of its own Ray and Python
    # version (native SkyRL: Python 3.12, .venv-skyrl-native/bin/python). Checked: Ray >= 2.52 (token auth).
    ray_python: Path | None = None

    def __post_init__(self) -> None:
        if self.num_nodes < 1:
            raise ValueError(f"num_nodes={self.num_nodes}: need at least one node")
        if not 0 <= self.rank < self.num_nodes:
            raise ValueError(f"rank={self.rank} is outside 0..{self.num_nodes - 1} (num_nodes={self.num_nodes})")
        if self.rank == 0 and not self.command:
            raise ValueError("command is empty: rank 0 needs the recipe command to run (after `--`)")
        self.job_dir = Path(self.job_dir).resolve()
        if self.ray_python is not None:
            # absolute(), not resolve(): a venv's python is a symlink, and its `ray` is beside the link.
            self.ray_python = Path(self.ray_python).absolute()
            check_ray_python(self.ray_python)

    @property
    def python(self) -> str:
        """The interpreter of the job's Ray: its nodes' `ray`, the probes, the node watch."""
        return str(self.ray_python) if self.ray_python is not None else sys.executable


TOKEN_AUTH_RAY = (2, 52)  # the first Ray release with token authentication (RAY_AUTH_MODE=token)
RAY_PROBE = """import ray
try:
    import grpc  # what ray[client] adds
    client = "client"
except ImportError:
    client = "no-client"
print(ray.__version__, client)"""


def check_ray_python(python: Path) -> str:
    """Ray's version in the environment of `python`, or ValueError naming what is wrong and the fix: not an
    executable, no `ray` beside it, no importable Ray, a Ray without token authentication (the job's Ray
    always runs with a token, docs/security.md; an older Ray would ignore RAY_AUTH_MODE and run open), or a Ray
    without Ray Client."""
    hint = "give the python of an environment with Ray >= 2.52, e.g. --ray-python .venv-skyrl-native/bin/python"
    if not (python.is_file() and os.access(python, os.X_OK)):
        raise ValueError(f"ray_python={python}: not an executable file; {hint}")
    if not os.access(python.with_name("ray"), os.X_OK):
        raise ValueError(f"ray_python={python}: no `ray` executable beside it ({python.with_name('ray')}); {hint}")
    probe = subprocess.run([str(python), "-c", RAY_PROBE], capture_output=True, text=True, timeout=300)
    if probe.returncode != 0:
        tail = (probe.stderr.strip().splitlines() or ["?"])[-1]
        raise ValueError(f"ray_python={python}: `import ray` failed ({tail}); {hint}")
    version, _, client = probe.stdout.strip().partition(" ")
    try:
        release = Version(version).release
    except InvalidVersion:
        raise ValueError(f"ray_python={python}: unreadable Ray version {version!r}; {hint}") from None
    if release[:2] < TOKEN_AUTH_RAY:
        raise ValueError(
            f"ray_python={python} has Ray {version}, which has no token authentication (added in Ray 2.52): the "
            f"job's Ray would run open to anyone who reaches its nodes; {hint}"
        )
    if client != "client":
        # The head serves Ray Client on a port of ours (RayNode.argv), which `ray start` refuses without grpcio.
        raise ValueError(
            f"ray_python={python}: its Ray has no Ray Client (grpcio); install ray[client]=={version} there"
        )
    return version


def log(rank: int, message: str) -> None:
    print(f"[bootstrap rank {rank} {time.strftime('%H:%M:%S')}] {message}", flush=True)


def attempt_id() -> str:
    """Distinguishes a requeued run of the same job, so a worker never reads the last attempt's head."""
    return os.environ.get("SLURM_RESTART_COUNT", "0")


def expand_nodelist(nodelist: str) -> list[str]:
    """`node[01-02],gpu7` -> ['node01', 'node02', 'gpu7'] via scontrol (Slurm's own parser)."""
    if not nodelist:
        return []
    if "[" not in nodelist and "," not in nodelist:
        return [nodelist]
    out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, check=True)
    return out.stdout.split()


# Ports handed to `ray start` come from below the kernel's ephemeral range. A port the kernel picks (bind to 0)
# is free only until someone else's bind to 0 gets it: Ray's own processes bind dozens of ephemeral ports while
# the head starts, and one took the Ray Client server's port between free_port() and its bind ("Address already
# in use" on 127.0.0.1, the head's Ray died, and its job waited for nodes until the time limit). A port below the
# range is never handed out by the kernel, so only another explicit choice can take it. Ray's own worker ports
# (min_worker_port..max_worker_port, 10002-19999 by default) are below it too: `ray start` refuses a port of
# ours in that range ("worker_ports is trying to use a port number ... used by other components").
LOWEST_PORT = 20000


def ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default range is 32768-60999


def free_port(attempts: int = 200) -> int:
    """A port outside the ephemeral range that binds now on all addresses and on loopback."""
    high = max(ephemeral_low(), LOWEST_PORT + 1000)  # a site whose ephemeral range starts lower: still a range
    for _ in range(attempts):
        port = random.randrange(LOWEST_PORT, high)
        try:
            for host in ("", "127.0.0.1"):
                with socket.socket() as sock:
                    sock.bind((host, port))
        except OSError:
            continue
        return port
    raise RuntimeError(f"no free port in {LOWEST_PORT}..{high - 1} after {attempts} tries")


def node_ip() -> str | None:
    """This node's address for Ray: ARCTIC_RL_NODE_IP, else what its host name resolves to when that is not a
    loopback address (the cluster's own name service: /etc/hosts or DNS), else None (Ray's own detection).
    Ray detects the address through the default route; a node without one (the namespaced test cluster of
    scripts/slurm_cluster.sh, some air-gapped clusters) would otherwise advertise 127.0.0.1."""
    if os.environ.get("ARCTIC_RL_NODE_IP"):
        return os.environ["ARCTIC_RL_NODE_IP"]
    try:
        address = socket.gethostbyname(socket.gethostname())
    except OSError:
        return None
    return None if address.startswith("127.") else address


def port_open(address: str, timeout_s: float = 1.0) -> bool:
    host, port = address.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            return True
    except OSError:
        return False


class RayNode:
    """One `ray start --block` process tree, in its own session so it can be stopped as a whole."""

    def __init__(self, cfg: BootstrapConfig, head_address: str | None) -> None:
        self.cfg = cfg
        self.is_head = head_address is None
        # Ray's unix sockets live under the temp dir and must stay under ~107 chars: keep it short.
        # The name is predictable; what keeps others out is the private folder it is in (checked at start).
        job_key = os.environ.get("SLURM_JOB_ID", str(os.getpid()))
        self.temp_dir = cfg.ray_temp_root / f"arctic-rl-ray-{os.getuid()}" / f"{job_key}-{attempt_id()}-{cfg.rank}"
        self.log_path = cfg.job_dir / "logs" / f"ray-node{cfg.rank}.{attempt_id()}.log"
        self.port = free_port() if self.is_head else None
        self.head_address = head_address
        self.node_ip = node_ip()
        self.proc: subprocess.Popen | None = None
        self.log_start = 0  # where this attempt's output begins in log_path (start() appends)

    def argv(self) -> list[str]:
        cfg = self.cfg
        labels = f"{RANK_LABEL}={cfg.rank},{HOST_LABEL}={socket.gethostname()}"
        argv = [str(Path(cfg.python).with_name("ray")), "start", "--block", f"--labels={labels}"]
        argv += [f"--temp-dir={self.temp_dir}", f"--dashboard-agent-listen-port={free_port()}"]
        if self.is_head:
            # Fixed default ports (6379, 10001) collide with other clusters on the same machine.
            argv += ["--head", f"--port={self.port}", f"--ray-client-server-port={free_port()}"]
            argv += ["--include-dashboard=false", f"--system-config={json.dumps(RAY_SYSTEM_CONFIG)}"]
        else:
            argv += [f"--address={self.head_address}"]
        if self.node_ip:
            argv.append(f"--node-ip-address={self.node_ip}")
        if cfg.num_cpus is not None:
            argv.append(f"--num-cpus={cfg.num_cpus}")
        if cfg.num_gpus is not None:
            argv.append(f"--num-gpus={cfg.num_gpus}")
        if cfg.resources:
            argv.append(f"--resources={json.dumps(cfg.resources)}")
        return argv + list(cfg.ray_args)

    def prepare_dirs(self) -> None:
        """The log folder (in the 0700 job folder) and this user's Ray temp root: 0700 and ours, or refused,
        since the head reads its own address back from the temp dir."""
        private_dir(self.log_path.parent, "job log folder")
        ray_temp_root(self.cfg.ray_temp_root)

    def env(self) -> dict[str, str]:
        """`ray start`'s environment, which its raylet and so every Ray worker of the node inherits."""
        env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", **ray_auth_env(self.cfg)}
        env.pop("RAY_ADDRESS", None)  # an inherited address would make `ray start --head` join it instead
        env.pop(TOKEN_ENV, None)  # the bearer token is for the HTTP server only
        return env

    def start(self) -> None:
        self.prepare_dirs()
        self.log_start = self.log_path.stat().st_size if self.log_path.exists() else 0
        with open(self.log_path, "ab") as out:
            self.proc = subprocess.Popen(
                self.argv(),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.env(),
                start_new_session=True,
                preexec_fn=ignore_usr2,
            )

    def restart_after_startup_timeout(self, restarts: int) -> bool:
        """Starts `ray start` again when it gave up by Ray's own fixed 30 s wait for its raylet to register
        (a loaded machine: "The current node timed out during startup"), at most STARTUP_RETRIES times;
        False for any other exit."""
        if restarts >= STARTUP_RETRIES or not self.log_path.exists():
            return False
        with open(self.log_path, "rb") as f:
            f.seek(self.log_start)
            if STARTUP_TIMED_OUT not in f.read().decode(errors="replace"):
                return False
        log(
            self.cfg.rank, f"`ray start` timed out during startup (loaded machine?); starting it again ({restarts + 1})"
        )
        self.stop()
        self.start()
        return True

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_head_ready(self) -> str:
        """Returns the GCS address Ray itself reports, once its port answers."""
        address_file = self.temp_dir / "ray_current_cluster"
        deadline = time.monotonic() + HEAD_START_TIMEOUT_S
        while time.monotonic() < deadline:
            if not self.alive():
                raise RuntimeError(f"`ray start --head` exited with code {self.proc.returncode}; {self.log_hint()}")
            if address_file.exists():
                address = address_file.read_text().strip()
                if address and port_open(address):
                    return address
            time.sleep(0.5)
        raise TimeoutError(f"Ray head not up after {HEAD_START_TIMEOUT_S:.0f} s; {self.log_hint()}")

    def log_hint(self) -> str:
        tail = ""
        if self.log_path.exists():
            tail = "\n".join(self.log_path.read_text(errors="replace").splitlines()[-15:])
        return f"log {self.log_path} ends with:\n{tail}"

    def stop(self, grace_s: float = 5.0) -> None:
        """SIGTERM to the process group (ray start's handler stops raylet, GCS, workers), then SIGKILL
        whatever of the group is left."""
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=grace_s)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass
        time.sleep(0.5)  # children (raylet, workers) may outlive the leader by a moment
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()
        shutil.rmtree(self.temp_dir, ignore_errors=True)


def token_file(cfg: BootstrapConfig) -> Path:
    return cfg.job_dir / f"ray-auth-token.{attempt_id()}"


def write_token(cfg: BootstrapConfig) -> None:
    """A fresh Ray auth token per job attempt, readable by the owner only, in the shared job folder."""
    path = token_file(cfg)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(secrets.token_hex(32))


def ray_auth_env(cfg: BootstrapConfig) -> dict[str, str]:
    """Ray 2.60 turns token auth on by itself when ~/.ray/auth_token exists, for `ray start` but not for
    clients given an address, so one stray token file breaks connections. We set the mode explicitly
    and give every node, probe and driver of this job the job's own token; an inherited RAY_AUTH_TOKEN
    (which Ray would prefer to the file) is emptied, and Ray then reads the file."""
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "", "RAY_AUTH_TOKEN_PATH": str(token_file(cfg))}


def head_file(cfg: BootstrapConfig) -> Path:
    return cfg.job_dir / f"ray-head.{attempt_id()}.json"


def stop_file(cfg: BootstrapConfig) -> Path:
    return cfg.job_dir / f"ray-stop.{attempt_id()}"


def probe_messages(lines: Iterable[str], rank: int) -> Iterator[dict]:
    """The JSON messages of a probe or watch child, from its stdout. Ray may print lines of its own there too
    (seen under load); they are logged, not parsed (one ended a job: JSONDecodeError in the head)."""
    for line in lines:
        if line.startswith(PROBE_PREFIX):
            yield json.loads(line[len(PROBE_PREFIX) :])
        elif line.strip():
            log(rank, f"node probe said: {line.rstrip()}")


def probe_nodes(address: str, num_nodes: int, timeout_s: float) -> int:
    """Child-process side of wait_for_nodes: prints one JSON line {rank: host} per change; exit 0 once all
    num_nodes ranks are alive, PROBE_TIMED_OUT on timeout (a crash exits 1). It runs in its own process
    because ray.init installs a C++ SIGTERM handler that would replace submitit's (and kill the launcher on
    a preemption signal)."""
    import ray

    ray.init(address=address, logging_level="ERROR", log_to_driver=False)
    deadline, last = time.monotonic() + timeout_s, None
    while True:
        ranks = alive_ranks()
        if ranks != last:
            print(PROBE_PREFIX + json.dumps(ranks), flush=True)
            last = ranks
        if len(ranks) >= num_nodes:
            return 0
        if time.monotonic() > deadline:
            return PROBE_TIMED_OUT
        time.sleep(1.0)


def alive_ranks() -> dict[str, str]:
    """{rank label: host} of the job's nodes that Ray sees alive."""
    import ray

    ranks = {}
    for node in ray.nodes():
        labels = node.get("Labels") or {}
        if node.get("Alive") and RANK_LABEL in labels:
            ranks[labels[RANK_LABEL]] = labels.get(HOST_LABEL, node.get("NodeManagerHostname", "?"))
    return ranks


def watch_nodes(address: str, expected: dict[str, str]) -> int:
    """Child-process side of the head's node watch: exits NODE_LOST, printing {"rank", "host"} as JSON, as
    soon as Ray reports one of the `expected` ranks dead (Ray's health checks notice a node whose raylet is
    gone or unreachable within tens of seconds). Runs until killed otherwise."""
    import ray

    ray.init(address=address, logging_level="ERROR", log_to_driver=False)
    while True:
        alive = alive_ranks()
        for rank, host in sorted(expected.items()):
            if rank not in alive:
                print(PROBE_PREFIX + json.dumps({"rank": int(rank), "host": host}), flush=True)
                return NODE_LOST
        time.sleep(2.0)


class NodeLostError(RuntimeError):
    """A node of the job left the Ray cluster while the recipe ran."""


def stop_probe_if_head_dies(proc: subprocess.Popen, head_alive: Callable[[], bool]) -> None:
    """Kills the probe when the head's `ray start` exits (its GCS is gone: no node can register any more)."""

    def watch() -> None:
        while proc.poll() is None:
            if not head_alive():
                proc.kill()
                return
            time.sleep(1.0)

    threading.Thread(target=watch, daemon=True).start()


def wait_for_nodes(
    cfg: BootstrapConfig, address: str, head_alive: Callable[[], bool] = lambda: True, head_log: str = ""
) -> dict[int, str]:
    """Blocks until all cfg.num_nodes ranks are alive in Ray; the timeout error names the missing ones.
    A probe that crashes (ray.init can fail to register with a raylet that is still starting on a loaded
    machine) is restarted while time is left. If the head's Ray dies meanwhile, fails at once with its log
    (head_log) rather than waiting out register_timeout_s for nodes that can no longer join."""
    deadline = time.monotonic() + cfg.register_timeout_s
    ranks: dict[int, str] = {}
    while True:
        remaining = max(1.0, deadline - time.monotonic())
        argv = [cfg.python, "-m", "jobs.bootstrap", "--probe-nodes", address, str(cfg.num_nodes), str(remaining)]
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env={**pythonpath_env(), **ray_auth_env(cfg)})
        stop_probe_if_head_dies(proc, head_alive)
        for msg in probe_messages(proc.stdout, 0):
            ranks = {int(r): host for r, host in msg.items()}
            log(0, f"nodes registered: {len(ranks)}/{cfg.num_nodes} ({', '.join(sorted(ranks.values()))})")
        code = proc.wait()
        if not head_alive():
            raise RuntimeError(
                f"the head's Ray exited while waiting for nodes ({len(ranks)} of {cfg.num_nodes} registered); "
                f"its log: {head_log or '?'}"
            )
        if code == 0 and len(ranks) >= cfg.num_nodes:
            return ranks
        if code == PROBE_TIMED_OUT or time.monotonic() >= deadline:
            break
        log(0, f"node probe exited with code {code}; retrying")
        time.sleep(2.0)
    missing = [r for r in range(cfg.num_nodes) if r not in ranks]
    names = [f"rank {r}" + (f" (host {cfg.hostnames[r]})" if r < len(cfg.hostnames) else "") for r in missing]
    raise TimeoutError(
        f"Ray cluster incomplete after {cfg.register_timeout_s:.0f} s (register_timeout_s): "
        f"{len(ranks)} of {cfg.num_nodes} nodes registered; missing {', '.join(names)}. "
        f"Their logs: {cfg.job_dir / 'logs'}/ray-node<rank>.{attempt_id()}.log"
    )


def pythonpath_env() -> dict[str, str]:
    """This checkout first on PYTHONPATH, so child processes (the node probes) import the same `jobs` package;
    without the bearer token, which they have no use for."""
    root = str(Path(__file__).resolve().parent.parent)
    old = os.environ.get("PYTHONPATH")
    env = {k: v for k, v in os.environ.items() if k != TOKEN_ENV}
    return {**env, "PYTHONPATH": f"{root}:{old}" if old else root}


def ignore_usr2() -> None:
    """preexec_fn of our children: Slurm sends USR2 to every process of the step before a time-out
    (submitit's --signal=USR2@90); only the launcher should act on it (checkpoint + requeue), not kill the
    recipe or Ray mid-step. The requeue itself stops them."""
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)


def command_env(cfg: BootstrapConfig, address: str) -> dict[str, str]:
    """What the recipe command needs: the Ray address, plus facts for its MLflow tags and resume. It keeps
    ARCTIC_RL_TOKEN: it hands it to the HTTP server it starts (a Ray driver's environment does not reach
    the workers)."""
    ray_env = {**ray_auth_env(cfg), "RAY_ADDRESS": address}
    env = {**os.environ, **ray_env, "ARCTIC_RL_NODES": str(cfg.num_nodes)}
    # The job's Ray, kept for arctic-rl's server where a framework points RAY_ADDRESS at a Ray of its own
    # (SkyRL runs its own Ray version: the server it starts over HTTP still joins the job's cluster).
    env["ARCTIC_RL_RAY_ENV"] = json.dumps(ray_env)
    env["ARCTIC_RL_JOB_DIR"] = str(cfg.job_dir)
    env["ARCTIC_RL_RESUME_KEY"] = str(cfg.job_dir)
    env["ARCTIC_RL_RAY_PYTHON"] = cfg.python  # whose Ray this is: a command can tell whether it may join it
    if cfg.num_gpus is not None:
        env["ARCTIC_RL_GPUS"] = str(cfg.num_gpus * cfg.num_nodes)
    if cfg.recipe:
        env["ARCTIC_RL_RECIPE"] = cfg.recipe
    if cfg.tracking_uri:
        env["MLFLOW_TRACKING_URI"] = cfg.tracking_uri
    return env


def start_watch(cfg: BootstrapConfig, address: str, ranks: dict[int, str]) -> subprocess.Popen | None:
    """The node watch (watch_nodes) in its own process, for the same reason as the probe; None on one node."""
    if cfg.num_nodes < 2:
        return None
    expected = json.dumps({str(r): host for r, host in ranks.items() if r != 0})
    argv = [cfg.python, "-m", "jobs.bootstrap", "--watch-nodes", address, expected]
    return subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        text=True,
        env={**pythonpath_env(), **ray_auth_env(cfg)},
        start_new_session=True,
        preexec_fn=ignore_usr2,
    )


def stop_group(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    """SIGTERM to the process group, SIGKILL after grace_s."""
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def run_command(cfg: BootstrapConfig, address: str, ranks: dict[int, str] | None = None) -> int:
    """Runs the recipe command to its end; raises NodeLostError (naming the node) when a node of the job
    leaves the Ray cluster meanwhile, after stopping the command, rather than letting it hang on a dead engine
    until the time limit."""
    log(0, f"RAY_ADDRESS={address}; running: {shlex.join(cfg.command)}")
    proc = subprocess.Popen(
        cfg.command, env=command_env(cfg, address), cwd=cfg.workdir, start_new_session=True, preexec_fn=ignore_usr2
    )
    watch = start_watch(cfg, address, ranks or {})
    try:
        while (code := proc.poll()) is None:
            if watch is not None and watch.poll() == NODE_LOST:
                lost = next(probe_messages(watch.stdout, 0))
                log(0, f"node {lost['host']} (rank {lost['rank']}) left the Ray cluster; stopping the recipe")
                stop_group(proc)
                raise NodeLostError(
                    f"node {lost['host']} (rank {lost['rank']}) left the job's Ray cluster while the recipe ran "
                    f"(its Ray node died or became unreachable); the recipe was stopped. Node logs: "
                    f"{cfg.job_dir / 'logs'}/ray-node{lost['rank']}.{attempt_id()}.log"
                )
            time.sleep(1.0)
        # SIGABRT: what Ray's own SIGTERM handler in the recipe's driver turns a SIGTERM into.
        if -code in (signal.SIGTERM, signal.SIGKILL, signal.SIGABRT) and cfg.signal_grace_s > 0:
            # Killed by a signal: most likely this node is being preempted (SIGTERM to the whole step) and
            # the launcher's USR2 handler is about to checkpoint and requeue; give it the chance before
            # reporting a failure that would end the job.
            name = signal.Signals(-code).name
            log(0, f"recipe command killed by {name}; waiting {cfg.signal_grace_s:.0f} s for a requeue")
            time.sleep(cfg.signal_grace_s)
        return code
    finally:
        if watch is not None:
            stop_group(watch, grace_s=2.0)
        if proc.poll() is None:  # we are unwinding (signal, preemption): stop the recipe before Ray
            log(0, "stopping the recipe command (SIGTERM, then SIGKILL after 10 s)")
            stop_group(proc)


def run_head(cfg: BootstrapConfig) -> int:
    t0 = time.monotonic()
    node = RayNode(cfg, head_address=None)
    rc = 1
    try:
        write_token(cfg)
        node.start()
        restarts = 0
        while True:
            try:
                address = node.wait_head_ready()
                break
            except RuntimeError:
                if not node.restart_after_startup_timeout(restarts):
                    raise
                restarts += 1
        head_file(cfg).write_text(json.dumps({"address": address, "host": socket.gethostname()}))
        log(0, f"Ray head up at {address} ({time.monotonic() - t0:.1f} s); waiting for {cfg.num_nodes} node(s)")
        ranks = wait_for_nodes(cfg, address, node.alive, node.log_path.as_posix())
        log(0, f"all {cfg.num_nodes} node(s) registered ({time.monotonic() - t0:.1f} s)")
        rc = run_command(cfg, address, ranks)
        return rc
    finally:
        stop_file(cfg).touch()
        node.stop()
        log(0, f"done: command exit code {rc}, {cfg.num_nodes} node(s), {time.monotonic() - t0:.0f} s; Ray stopped")


def read_head_address(cfg: BootstrapConfig) -> str:
    path, deadline = head_file(cfg), time.monotonic() + cfg.register_timeout_s
    while time.monotonic() < deadline:
        if path.exists():
            return json.loads(path.read_text())["address"]
        if stop_file(cfg).exists():
            raise RuntimeError(f"the head stopped before publishing its address ({stop_file(cfg)} exists)")
        time.sleep(0.5)
    raise TimeoutError(
        f"rank {cfg.rank}: no Ray head address in {path} after {cfg.register_timeout_s:.0f} s; "
        f"is the job folder shared between nodes, and did rank 0 (host {cfg.head_host}) start?"
    )


def run_worker(cfg: BootstrapConfig) -> int:
    address = read_head_address(cfg)
    node = RayNode(cfg, head_address=address)
    head_gone_since: float | None = None
    restarts = 0
    try:
        node.start()
        log(cfg.rank, f"joining Ray head {address} (log {node.log_path})")
        while not stop_file(cfg).exists():
            if not node.alive():
                if stop_file(cfg).exists():
                    break
                if node.restart_after_startup_timeout(restarts):
                    restarts += 1
                    continue
                code = node.proc.returncode
                raise RuntimeError(f"rank {cfg.rank}: `ray start` exited with code {code}; {node.log_hint()}")
            # Without a shared stop signal (head killed hard), leave once the head is unreachable for a while.
            if port_open(address):
                head_gone_since = None
            elif head_gone_since is None:
                head_gone_since = time.monotonic()
            elif time.monotonic() - head_gone_since > HEAD_GONE_GRACE_S:
                log(cfg.rank, f"head {address} unreachable for {HEAD_GONE_GRACE_S:.0f} s; leaving")
                break
            time.sleep(1.0)
        return 0
    finally:
        node.stop()
        log(cfg.rank, "Ray node stopped")


def make_job_dir(job_dir: Path) -> None:
    """The job folder, 0700 and ours (jobs.launch.new_job_dir makes it so at submission; a folder given with
    --job-dir is checked): it holds the Ray auth token file, logs and checkpoints, which are then out of
    other users' reach whatever their own modes."""
    job_dir.parent.mkdir(parents=True, exist_ok=True)
    private_dir(job_dir, "job folder")


def run(cfg: BootstrapConfig) -> int:
    """Runs this node's part; returns the recipe command's exit code on rank 0, 0 on clean worker exit."""
    make_job_dir(cfg.job_dir)
    return run_head(cfg) if cfg.rank == 0 else run_worker(cfg)


def raise_on_sigterm() -> None:
    """Turn SIGTERM (scancel, TorchX cancel, Slurm time limit) into SystemExit so `finally` tears Ray down.
    Not used under submitit, which installs its own handlers (USR2 checkpoints and requeues)."""

    def handler(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, handler)


def env_topology(head_env: str | None) -> tuple[int, int, str, list[str]]:
    """(num_nodes, rank, head_host, hostnames) from Slurm's environment, or one local node."""
    nodelist = os.environ.get(head_env, "") if head_env else ""
    hostnames = expand_nodelist(os.environ.get("SLURM_JOB_NODELIST", ""))
    head = expand_nodelist(nodelist)[0] if nodelist else (hostnames[0] if hostnames else "127.0.0.1")
    num_nodes = int(os.environ.get("SLURM_JOB_NUM_NODES", os.environ.get("SLURM_NNODES", "1")))
    rank = int(os.environ.get("SLURM_NODEID", "0"))
    return num_nodes, rank, head, hostnames


def parse_args(argv: Sequence[str]) -> BootstrapConfig:
    argv = list(argv)
    command = argv[argv.index("--") + 1 :] if "--" in argv else []
    own = argv[: argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(prog="python -m jobs.bootstrap", description=__doc__.split("\n")[0])
    p.add_argument("--job-dir", required=True, help="shared folder of this job (address files, logs, checkpoints)")
    p.add_argument("--nnodes", type=int, help="number of nodes (default: SLURM_JOB_NUM_NODES, else 1)")
    p.add_argument("--rank", type=int, help="this node's rank (default: SLURM_NODEID, else 0)")
    p.add_argument("--head-env", help="env var holding the head host or nodelist (TorchX: its rank0_env macro)")
    p.add_argument("--num-cpus", type=int)
    p.add_argument("--num-gpus", type=int)
    p.add_argument("--resources", default="{}", help="JSON custom Ray resources of this node")
    p.add_argument("--ray-args", default="", help="extra `ray start` flags, one shell-quoted string")
    p.add_argument("--register-timeout-s", type=float, default=300.0)
    p.add_argument("--ray-python", help="the python whose Ray the nodes run (Ray >= 2.52); default this one")
    p.add_argument("--recipe")
    p.add_argument("--tracking-uri")
    p.add_argument("--workdir")
    a = p.parse_args(own)
    num_nodes, rank, head, hostnames = env_topology(a.head_env)
    try:
        resources = json.loads(a.resources)
    except json.JSONDecodeError as err:
        p.error(f"--resources={a.resources!r} is not JSON: {err}")
    return BootstrapConfig(
        command=command,
        job_dir=Path(a.job_dir),
        num_nodes=a.nnodes if a.nnodes is not None else num_nodes,
        rank=a.rank if a.rank is not None else rank,
        head_host=head,
        hostnames=hostnames,
        num_cpus=a.num_cpus,
        num_gpus=a.num_gpus,
        resources=resources,
        ray_args=shlex.split(a.ray_args),
        register_timeout_s=a.register_timeout_s,
        recipe=a.recipe,
        tracking_uri=a.tracking_uri,
        workdir=Path(a.workdir) if a.workdir else None,
        ray_python=Path(a.ray_python) if a.ray_python else None,
    )


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["--probe-nodes"]:
        return probe_nodes(argv[1], int(argv[2]), float(argv[3]))
    if argv[:1] == ["--watch-nodes"]:
        return watch_nodes(argv[1], json.loads(argv[2]))
    cfg = parse_args(argv)
    raise_on_sigterm()
    return run(cfg)


if __name__ == "__main__":
    sys.exit(main())
