"""Each engine's share of a CPU node (arctic_rl.server.placement.cpu_shares), how a deployment resolves its thread
count, that async runs split the cores, and that an actor pins every one of its threads to its share.
tests/e2e/test_backend.py::test_engines_compute_on_their_share_of_the_cores checks the same on real engines."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest
from repo_paths import REPO

from arctic_rl.config import CpuConfig
from arctic_rl.errors import ConfigError
from arctic_rl.runconfig import load_run_config
from arctic_rl.server.placement import CpuShare, cpu_shares

TINY = REPO / "tests/configs/tiny_loop.yaml"


def test_not_split_every_engine_may_use_every_core():
    assert set(cpu_shares(8, CpuConfig()).values()) == {CpuShare(8)}
    assert set(cpu_shares(8, CpuConfig(threads=3)).values()) == {CpuShare(3)}
    assert set(cpu_shares(2, CpuConfig(threads=3)).values()) == {CpuShare(2)}  # never more threads than cores


def test_split_gives_the_sampler_and_the_trainer_disjoint_cores():
    s = cpu_shares(8, CpuConfig(split=True))
    assert s["sampling"] == CpuShare(4, (0, 4)) and s["training"] == s["reference"] == CpuShare(4, (4, 8))
    s = cpu_shares(8, CpuConfig(split=True, sampler_cores=2, threads=5))
    assert s["sampling"] == CpuShare(2, (0, 2)) and s["training"] == CpuShare(5, (2, 8))
    assert cpu_shares(3, CpuConfig(split=True))["sampling"] == CpuShare(1, (0, 1))
    assert set(cpu_shares(1, CpuConfig(split=True)).values()) == {CpuShare(1)}  # one core: nothing to split
    with pytest.raises(ConfigError, match=r"cpu.sampler_cores=8 leaves no core for the trainer .* 8 CPUs"):
        cpu_shares(8, CpuConfig(split=True, sampler_cores=8))


def test_the_thread_count_comes_from_omp_num_threads_where_the_deployment_starts(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert CpuConfig().resolved().threads is None
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert CpuConfig().resolved().threads == 3
    assert CpuConfig(threads=5).resolved().threads == 5  # the config's own wins
    monkeypatch.setenv("OMP_NUM_THREADS", "lots")
    assert CpuConfig().resolved().threads is None


def test_a_job_s_node_count_comes_from_arctic_rl_nodes_where_the_deployment_starts(monkeypatch):
    monkeypatch.delenv("ARCTIC_RL_NODES", raising=False)
    assert CpuConfig().resolved().nodes is None
    monkeypatch.setenv("ARCTIC_RL_NODES", "2")  # jobs.bootstrap sets it for the job's command
    assert CpuConfig().resolved().nodes == 2
    assert CpuConfig(nodes=1).resolved().nodes == 1  # the config's own wins


def test_placement_waits_for_the_job_s_nodes_and_refuses_fewer(ray_cluster):
    """On the suite's real one-node Ray cluster: without a count, the nodes alive; with cpu.nodes=1, one; with
    cpu.nodes=2 it waits, then refuses naming the field and the node it saw (a two-node job whose second node
    was not up would otherwise put every engine on the first: CI saw it after a requeue)."""
    import ray

    from arctic_rl.server.placers import cpu_nodes, wait_for_cpu_nodes

    ray.init(address=ray_cluster, ignore_reinit_error=True, logging_level="ERROR")
    assert wait_for_cpu_nodes(None) == wait_for_cpu_nodes(1) == len(cpu_nodes()) == 1
    t0 = time.monotonic()
    with pytest.raises(ConfigError, match=r"cpu.nodes=2: only 1 Ray node\(s\) with CPUs alive after 2 s \(.+\)"):
        wait_for_cpu_nodes(2, timeout_s=2)
    assert time.monotonic() - t0 >= 2  # it waited for the node before refusing


def test_an_async_run_splits_the_cores_unless_told_otherwise(tiny_llama):
    model = f"model.name_or_path={tiny_llama}"
    assert not load_run_config(TINY, [model]).client_config().cpu.split
    assert load_run_config(TINY, [model, "async.enable=true"]).client_config().cpu.split
    told = load_run_config(TINY, [model, "async.enable=true", "backend.cpu.split=false"])
    assert not told.client_config().cpu.split


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores to pin to one")
def test_an_actor_pins_all_its_threads_to_its_share():
    """In a fresh process, as an engine actor starts: a thread started before the call is pinned too."""
    second = sorted(os.sched_getaffinity(0))[1]
    code = textwrap.dedent(
        """
        import os, threading
        started = threading.Event(); stop = threading.Event(); ids = []
        def early():
            ids.append(threading.get_native_id()); started.set(); stop.wait()
        t = threading.Thread(target=early); t.start(); started.wait()
        from arctic_rl.engines.cpu_share import apply_cpu_share
        print(apply_cpu_share(), sorted(os.sched_getaffinity(ids[0])))
        stop.set(); t.join()
        """
    )
    env = {**os.environ, "OMP_NUM_THREADS": "2", "ARCTIC_RL_CPU_CORES": "1:2"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    # Two threads asked for, one core given: one thread (more would only contend).
    assert out.stdout.strip() == f"{{'threads': 1, 'cores': [{second}]}} [{second}]"
