"""benchmarks/vs_verl.py's equal-gradients check, run both ways on a tiny model: verl 0.9.1's own engine
update and arctic-rl's engine with ZoRRo Train agree (loss, gradients and one optimizer step's weight change,
on three ragged prompt groups whose old log-probs are near the model's); with ZoRRo deliberately broken in one
row only (--break-zorro one-row: the response positions of the row with the most negative advantage off by
one, a row the earlier check's random old log-probs clipped out of the gradient) the check fails and nothing
is timed."""

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
    good, broken = _check(tmp_path / "good"), _check(tmp_path / "broken", "--break-zorro", "one-row")  # at once
    (good_out, good_err), (broken_out, broken_err) = good.communicate(), broken.communicate()
    assert good.returncode == 0, good_out + good_err[-3000:]
    assert "equal loss, gradients and optimizer update (vs verl, tolerance 0.0001, update 0.001; " in good_out
    assert "model's): passed" in good_out
    assert _row(good_out, "arctic+zorro")[-1] == "yes"
    assert broken.returncode == 1, broken_out + broken_err[-3000:]
    assert "FAILED" in broken_out and "nothing timed" in broken_out
    assert _row(broken_out, "arctic+zorro")[-1] == "NO"
    assert _row(broken_out, "verl")[-1] == "yes"
