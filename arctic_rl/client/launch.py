"""Starting the backend from the client side: always as a separate process (`python -m arctic_rl.server`),
so the client never imports engine code."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import cast

from arctic_rl.config import TOKEN_ENV
from arctic_rl.errors import ERRORS, ArcticRLError


def run_deploy(config_json: str, timeout_s: float) -> str:
    """Runs the deploy command, echoing its progress; returns the deployed config's JSON."""
    t0 = time.time()
    print("[arctic-rl] starting engines (training, reference, sampling) ...", file=sys.stderr, flush=True)
    # The deploy process is a Ray driver, not an HTTP server: it has no use for the bearer token.
    env = {k: v for k, v in os.environ.items() if k != TOKEN_ENV}
    proc = subprocess.Popen(
        [sys.executable, "-m", "arctic_rl.server", "deploy", config_json],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    result, tail = None, cast(list[str], [])
    assert proc.stdout is not None
    for line in proc.stdout:
        line = line.rstrip("\n")
        if line.startswith("ARCTIC_RL_CONFIG "):
            result = line[len("ARCTIC_RL_CONFIG ") :]
        elif line.startswith("ARCTIC_RL_ERROR "):
            name, _, msg = line[len("ARCTIC_RL_ERROR ") :].partition(": ")
            proc.wait()
            raise ERRORS.get(name, ArcticRLError)(msg)
        else:
            tail = (tail + [line])[-20:]
        if time.time() - t0 > timeout_s:
            proc.kill()
            raise ArcticRLError(f"deployment did not come up within {timeout_s}s; last output:\n" + "\n".join(tail))
    proc.wait()
    if proc.returncode != 0 or result is None:
        raise ArcticRLError(f"deployment failed (exit {proc.returncode}); last output:\n" + "\n".join(tail))
    print(f"[arctic-rl] engines up in {time.time() - t0:.0f}s", file=sys.stderr, flush=True)
    return result
