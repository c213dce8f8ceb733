"""The embedded Ray cluster (arctic_rl/local_ray.py: what create_arctic_rl_client over Ray and `arctic-rl serve`
/ `arctic-rl run` start when no Ray address is given) seen from another host. Ray's gRPC servers listen on
every interface, so the test puts the cluster on a host of its own and an outsider on a second one: two
network namespaces joined by a veth pair on a private /30, both made and removed by the test, so its traffic
only ever goes to addresses it made (and no other Ray on this machine shares the cluster's ports).

The outsider calls the GCS and the raylet directly over gRPC, without the cluster's token (refused) and with
it (answered: the refusal is the token check, not the network). Meanwhile the driver on the cluster's host
runs a task, and that task sees no ARCTIC_RL_TOKEN although the driver holds one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from contextlib import contextmanager

import pytest
from repo_paths import REPO

# The cluster's driver: starts the embedded cluster through the entry named in argv[1], as a user would.
CLUSTER = r"""
import json, os, sys
import ray
from arctic_rl.config import ArcticRLClientConfig

if sys.argv[1] == "client":  # create_arctic_rl_client(comm_protocol="ray"): its transport starts the cluster,
    from arctic_rl.client.ray_transport import RayTransport  # then finds no deployment of this job_id
    from arctic_rl.errors import EngineDeadError
    try:
        RayTransport(ArcticRLClientConfig(model_name="unused", comm_protocol="ray", job_id="no-such-job"))
    except EngineDeadError:
        pass
else:  # `arctic-rl serve` and the deploy process
    from arctic_rl.server.deploy import init_ray
    init_ray(ArcticRLClientConfig(model_name="unused"))

@ray.remote(num_cpus=0)
def worker_env():
    return os.environ.get("ARCTIC_RL_TOKEN")

node = next(n for n in ray.nodes() if n["Alive"])
print(json.dumps({
    "gcs": ray.get_runtime_context().gcs_address,
    "raylet": f"{node['NodeManagerAddress']}:{node['NodeManagerPort']}",
    "ray_token": os.environ.get("RAY_AUTH_TOKEN", ""),
    "worker_token": ray.get(worker_env.remote(), timeout=120),
    "system_config": ray._private.state.state.get_system_config(),
}), flush=True)
sys.stdin.read()  # keep the cluster up until the test closes stdin
ray.shutdown()
"""

# The outsider: one cheap read-only RPC to the GCS and one to the raylet; prints each one's gRPC status.
PROBE = r"""
import json, sys
import grpc
from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc, node_manager_pb2, node_manager_pb2_grpc

gcs, raylet, token = sys.argv[1], sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else ""
metadata = [("authorization", f"Bearer {token}")] if token else []

def status(call):
    try:
        call()
        return "OK"
    except grpc.RpcError as e:
        return e.code().name

with grpc.insecure_channel(gcs) as ch:
    stub = gcs_service_pb2_grpc.NodeInfoGcsServiceStub(ch)
    g = status(lambda: stub.GetAllNodeInfo(gcs_service_pb2.GetAllNodeInfoRequest(), timeout=30, metadata=metadata))
with grpc.insecure_channel(raylet) as ch:
    stub = node_manager_pb2_grpc.NodeManagerServiceStub(ch)
    r = status(lambda: stub.GetSystemConfig(node_manager_pb2.GetSystemConfigRequest(), timeout=30, metadata=metadata))
print(json.dumps({"gcs": g, "raylet": r}))
"""


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


@contextmanager
def two_hosts():
    """(cluster namespace, its address, outsider namespace): two namespaces and a veth pair on 10.254.x.y/30,
    named after this process (interface names stay within 15 characters); all removed afterwards."""
    tag = os.getpid() % 100000
    cluster_ns, outside_ns = f"arlray-c{tag}", f"arlray-o{tag}"
    cluster_if, outside_if = f"arlc{tag}", f"arlo{tag}"
    base = 4 * (tag % 16384)  # a /30 of 10.254.0.0/16; the namespaces are private, so no route elsewhere sees it
    net = f"10.254.{base // 256}"
    cluster_ip, outside_ip = f"{net}.{base % 256 + 1}", f"{net}.{base % 256 + 2}"
    made: list[str] = []
    try:
        for ns in (cluster_ns, outside_ns):
            try:
                ip("netns", "add", ns)
            except subprocess.CalledProcessError as e:
                pytest.skip(f"cannot create a network namespace here (needs root): {e.stderr.strip()}")
            made.append(ns)
        ip("link", "add", cluster_if, "type", "veth", "peer", "name", outside_if)
        ip("link", "set", cluster_if, "netns", cluster_ns)
        ip("link", "set", outside_if, "netns", outside_ns)
        for ns, dev, addr in ((cluster_ns, cluster_if, cluster_ip), (outside_ns, outside_if, outside_ip)):
            ip("-n", ns, "addr", "add", f"{addr}/30", "dev", dev)
            ip("-n", ns, "link", "set", dev, "up")
            ip("-n", ns, "link", "set", "lo", "up")
        # Ray finds its node address through the default route: this one makes it the veth address.
        ip("-n", cluster_ns, "route", "add", "default", "via", outside_ip)
        yield cluster_ns, cluster_ip, outside_ns
    finally:
        for ns in made:  # deleting a namespace deletes the veth end inside it, and so the pair
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


@pytest.fixture(scope="module", params=["client", "server"])
def embedded(request, tmp_path_factory):
    """The embedded cluster started through one entry, on its own host, by a driver that holds a bearer token
    and inherited RAY_AUTH_MODE=disabled (what the Makefile used to export)."""
    home = tmp_path_factory.mktemp("home")  # Ray must never write a token into the real ~/.ray
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "ARCTIC_RL_"))}
    env.update(PYTHONPATH=str(REPO), HOME=str(home), RAY_AUTH_MODE="disabled", ARCTIC_RL_TOKEN="bearer-s3cret-for-http")
    env["ARCTIC_RL_STATE_DIR"] = str(home / "state")
    with two_hosts() as (cluster_ns, cluster_ip, outside_ns):
        proc = subprocess.Popen(
            ["ip", "netns", "exec", cluster_ns, sys.executable, "-c", CLUSTER, request.param],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        try:
            line = proc.stdout.readline()
            if not line:
                proc.wait(timeout=60)
                pytest.fail(
                    f"the embedded cluster did not start (exit {proc.returncode}):\n{proc.stderr.read()[-4000:]}"
                )
            info = json.loads(line)
            assert info["gcs"].startswith(f"{cluster_ip}:"), info  # reachable from the other host, not only loopback
            yield {**info, "outside_ns": outside_ns, "entry": request.param}
        finally:
            proc.stdin.close()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def probe(cluster: dict, token: str = "") -> dict:
    """The outsider's two calls, from the other namespace, in an environment with no Ray settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "ARCTIC_RL_"))}
    argv = [
        "ip",
        "netns",
        "exec",
        cluster["outside_ns"],
        sys.executable,
        "-c",
        PROBE,
        cluster["gcs"],
        cluster["raylet"],
    ]
    out = subprocess.run(argv + ([token] if token else []), capture_output=True, text=True, env=env, timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_a_caller_without_the_token_is_refused_from_another_host(embedded):
    assert probe(embedded) == {"gcs": "UNAUTHENTICATED", "raylet": "UNAUTHENTICATED"}, embedded["entry"]
    # The same calls with the cluster's token are answered: the refusal above is the token check.
    assert embedded["ray_token"], "the cluster's driver holds no Ray token"
    assert probe(embedded, embedded["ray_token"]) == {"gcs": "OK", "raylet": "OK"}


@pytest.mark.slow
def test_the_cluster_frees_unreferenced_objects_often(embedded):
    """arctic_rl.local_ray.RAY_SYSTEM_CONFIG reaches the cluster (a weight sync's first pass over the object store
    touches about one free period's worth of buckets: tests/e2e/test_weight_sync_memory.py)."""
    from arctic_rl.local_ray import RAY_SYSTEM_CONFIG

    got = {k: embedded["system_config"].get(k) for k in RAY_SYSTEM_CONFIG}
    assert got == RAY_SYSTEM_CONFIG, embedded["entry"]


def test_ray_workers_never_see_the_bearer_token(embedded):
    # The driver holds ARCTIC_RL_TOKEN; its task ran (the local driver works) and saw none.
    assert embedded["worker_token"] is None, embedded["entry"]
