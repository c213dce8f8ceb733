"""scripts/slurm_lib.sh's guard for a site's own Slurm, run in bash on temporary config files: a config whose first
line is not the scripts' mark is never replaced (the scripts refuse, naming the file); theirs, or none, goes ahead."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from repo_paths import REPO

LIB = REPO / "scripts" / "slurm_lib.sh"


def refuse(slurm_conf: Path, dbd_conf: Path) -> subprocess.CompletedProcess:
    script = f"SCRIPT=test; source {LIB}; SLURM_CONF_FILE={slurm_conf}; DBD_CONF_FILE={dbd_conf}; refuse_foreign_slurm"
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True)


def test_a_site_config_is_refused_naming_it(tmp_path: Path) -> None:
    site = tmp_path / "slurm.conf"
    site.write_text("# our site's cluster\nClusterName=prod\n")
    out = refuse(site, tmp_path / "absent.conf")
    assert out.returncode == 1
    assert f"{site} exists and was not written by these scripts" in out.stderr
    assert site.read_text().startswith("# our site's cluster")  # untouched


def test_a_site_slurmdbd_config_is_refused_too(tmp_path: Path) -> None:
    ours = tmp_path / "slurm.conf"
    ours.write_text("# Written by scripts/slurm_cluster.sh (2 nodes, one network namespace each).\n")
    dbd = tmp_path / "slurmdbd.conf"
    dbd.write_text("AuthType=auth/munge\n")
    out = refuse(ours, dbd)
    assert out.returncode == 1 and str(dbd) in out.stderr


def test_the_scripts_own_configs_or_none_go_ahead(tmp_path: Path) -> None:
    ours = tmp_path / "slurm.conf"
    ours.write_text("# Written by scripts/slurm_setup.sh (one-node cluster for CI and laptops).\n")
    assert refuse(ours, tmp_path / "absent.conf").returncode == 0
    assert refuse(tmp_path / "none.conf", tmp_path / "absent.conf").returncode == 0


def test_nodes_offer_the_machines_cpus_whatever_openmp_says() -> None:
    """make test exports OMP_NUM_THREADS=1 and then the multi-node fixtures run `slurm_cluster.sh up`: a node
    written with GNU nproc's answer (1) refused the tests' two-CPU jobs."""
    script = f"SCRIPT=test; source {LIB}; machine_cpus"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OMP_THREAD_LIMIT": "1"}
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env, check=True)
    assert int(out.stdout) == len(os.sched_getaffinity(0))


def pid_alive(pidfile: Path) -> bool:
    return subprocess.run(["bash", "-c", f"SCRIPT=test; source {LIB}; pid_alive {pidfile}"]).returncode == 0


def test_a_pid_file_naming_another_process_is_not_the_daemon(tmp_path: Path) -> None:
    """A killed node's slurmd leaves its pid file; once the machine's pids wrap (pid_max 32768 here) the pid can
    name any other process, and `up` must still start the daemon again (and `down` must not kill that process)."""
    pidfile = tmp_path / "slurmd-arctic-n2.pid"
    other = subprocess.Popen(["sleep", "60"])
    try:
        pidfile.write_text(f"{other.pid}\n")
        assert not pid_alive(pidfile)  # alive, but not a daemon of ours
    finally:
        other.kill()
        other.wait()
    assert not pid_alive(pidfile)  # gone
    assert not pid_alive(tmp_path / "absent.pid")
    pidfile.write_text("not a pid\n")
    assert not pid_alive(pidfile)
    # A live daemon of ours is alive: munged, which the Slurm scripts start, when this machine runs it.
    munged = subprocess.run(["pgrep", "-x", "munged"], capture_output=True, text=True).stdout.split()
    if munged:
        pidfile.write_text(munged[0] + "\n")
        assert pid_alive(pidfile)
