"""HTTP transport: `POST /v1/<op>` with wire messages. With no server at host:port (and no job_id),
starts `arctic-rl serve` on this machine and waits for it."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

from arctic_rl import wire
from arctic_rl.config import ArcticRLClientConfig
from arctic_rl.errors import ERRORS, ArcticRLError, EngineDeadError


class HttpTransport:
    def __init__(self, config: ArcticRLClientConfig):
        self.base = f"http://{config.host}:{config.port}"
        headers = {"authorization": f"Bearer {config.auth_token}"} if config.auth_token else {}
        self.http = httpx.Client(base_url=self.base, headers=headers, timeout=config.request_timeout_s)
        self.proc: subprocess.Popen | None = None
        if not self._alive():
            if config.job_id is not None:
                raise EngineDeadError(f"no arctic-rl server answers at {self.base} (job {config.job_id})")
            self._start_server(config)
        self.config = ArcticRLClientConfig.from_json(self.call("reconnect_config"))

    def _alive(self) -> bool:
        try:
            return self.http.get("/healthz", timeout=2.0).status_code == 200
        except httpx.TransportError:
            return False

    def _start_server(self, config: ArcticRLClientConfig) -> None:
        t0 = time.time()
        print(f"[arctic-rl] starting server on {self.base} ...", file=sys.stderr, flush=True)
        python, env = sys.executable, None
        if config.server_python:
            # Another environment: never the Ray this process may be a worker of (another Ray version), but the
            # job's own Ray where a launcher gave one (ARCTIC_RL_RAY_ENV, set by jobs.bootstrap), else its own.
            python = str(Path(config.server_python).expanduser())
            env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_ADDRESS")}
            if os.environ.get("ARCTIC_RL_RAY_ENV"):
                env.update(json.loads(os.environ["ARCTIC_RL_RAY_ENV"]))
        self.proc = subprocess.Popen([python, "-m", "arctic_rl.server", "serve", "--config", config.to_json()],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        assert self.proc.stdout is not None
        tail: list[str] = []
        for line in self.proc.stdout:
            tail = (tail + [line.rstrip()])[-20:]
            if line.startswith("ARCTIC_RL_ERROR "):
                name, _, msg = line[len("ARCTIC_RL_ERROR "):].strip().partition(": ")
                raise ERRORS.get(name, ArcticRLError)(msg)
            if line.startswith("[arctic-rl] serving"):
                break
            if time.time() - t0 > config.request_timeout_s:
                break
        while not self._alive():
            if self.proc.poll() is not None or time.time() - t0 > config.request_timeout_s:
                if self.proc.poll() is not None:   # it exited: what it said after "serving" is the reason
                    tail = (tail + self.proc.stdout.read().splitlines())[-20:]
                raise ArcticRLError("arctic-rl server did not come up; last output:\n" + "\n".join(tail))
            time.sleep(0.2)
        # Keep draining its output so the server never blocks on a full pipe.
        import threading
        threading.Thread(target=lambda: [None for _ in self.proc.stdout], daemon=True).start()
        print(f"[arctic-rl] server up in {time.time() - t0:.0f}s", file=sys.stderr, flush=True)

    def call(self, op: str, **kwargs):
        try:
            r = self.http.post(f"/v1/{op}", content=wire.encode(kwargs),
                               headers={"content-type": wire.CONTENT_TYPE})
        except httpx.TransportError as e:
            if op == "shutdown":
                return "ok"
            raise EngineDeadError(f"arctic-rl server at {self.base} unreachable: {e}") from None
        if r.status_code != 200:
            try:
                err = r.json()
            except ValueError:
                raise ArcticRLError(f"HTTP {r.status_code}: {r.text[:500]}") from None
            raise ERRORS.get(err.get("type"), ArcticRLError)(err.get("message", r.text))
        return wire.decode(r.content)

    def close(self) -> None:
        self.http.close()
        if self.proc is not None:
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
