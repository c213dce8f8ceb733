"""benchmarks/vs_verl.py's equal-gradients check, run both ways on a tiny model: verl 0.9.1's own engine
update and arctic-rl's engine with ZoRRo Train agree; with ZoRRo deliberately broken (--break-zorro:
response positions off by one) the check fails and nothing is timed."""

from __future__ import annotations

import os
import subprocess
import sys

from repo_paths import REPO


def _check(out, *extra: str) -> subprocess.Popen:
    cmd = [sys.executable, str(REPO / "benchmarks" / "vs_verl.py"), "--check-only", "--workloads", "tiny"]
    cmd += ["--variants", "verl,arctic+zorro", "--out", str(out), *extra]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _row(stdout: str, variant: str) -> list[str]:
    """The check table's row of `variant` (table rows are indented)."""
    return next(line.split() for line in stdout.splitlines() if line.startswith("  ") and line.split()[0] == variant)


def test_equal_gradients_check_passes_and_fails_when_zorro_is_broken(tmp_path):
    good, broken = _check(tmp_path / "good"), _check(tmp_path / "broken", "--break-zorro")  # both at once
    (good_out, good_err), (broken_out, broken_err) = good.communicate(), broken.communicate()
    assert good.returncode == 0, good_out + good_err[-3000:]
    assert "tolerance 0.0001): passed" in good_out
    assert _row(good_out, "arctic+zorro")[-1] == "yes"
    assert broken.returncode == 1, broken_out + broken_err[-3000:]
    assert "FAILED" in broken_out and "nothing timed" in broken_out
    assert _row(broken_out, "arctic+zorro")[-1] == "NO"
    assert _row(broken_out, "verl")[-1] == "yes"
