"""Execute untrusted SQL against SQLite files, out of process.

Predicted SQL comes from a model under training, so it is treated as hostile: every query runs
in a worker process (`_sql_worker.py`, standard library only, started with `python -I`) that
opens the database read-only and immutable behind an allow-list authorizer, a statement gate,
a timeout and a row cap (the guards are listed in that file), with an environment scrubbed of
secrets (arctic_rl.child_env: no tokens, keys or MLflow URI for a query to read). The parent here only moves JSON
lines: a query that loops past `timeout_s + grace_s`, or a worker that dies (even by a segfault
inside SQLite), costs one result of kind "timeout"/"crash"; the worker is killed and replaced,
and the trainer never notices.

    with SQLSandbox(num_workers=2) as box:
        res = box.execute("/data/dev_databases/x/x.sqlite", "SELECT COUNT(*) FROM t", timeout_s=5)
        res.ok, res.rows            # True, ((42,),)

Known limits: the per-query memory cap is an address-space limit (RLIMIT_AS), so it is skipped
where that is not available; SQLite's own CPU use between progress callbacks is bounded only by
the parent's hard timeout.
"""

from __future__ import annotations

import atexit
import json
import os
import queue
import select
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from arctic_rl.child_env import scrubbed_env

WORKER_SCRIPT = Path(__file__).with_name("_sql_worker.py")
Row = tuple


@dataclass(frozen=True)
class ExecResult:
    """The outcome of one query. `kind` is "" when ok, else one of: "syntax", "error", "denied",
    "timeout", "too_many_rows", "crash"."""

    ok: bool
    rows: tuple[Row, ...] = ()
    kind: str = ""
    error: str = ""


class _Worker:
    """One worker process; not thread-safe (the pool hands it to one thread at a time)."""

    def __init__(self, memory_limit_mb: int, workdir: str) -> None:
        self.memory_limit_mb = memory_limit_mb
        self.workdir = workdir
        self.proc: subprocess.Popen | None = None

    def _start(self) -> subprocess.Popen:
        # cwd is a private empty folder, so even a relative path that slipped through names nothing; the
        # environment is this process's without its secrets (Ray's and arctic-rl's tokens, MLflow's URI, keys).
        return subprocess.Popen(
            [sys.executable, "-I", str(WORKER_SCRIPT), str(self.memory_limit_mb)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            cwd=self.workdir,
            env=scrubbed_env(),
            close_fds=True,
        )

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def run(self, request: dict, hard_timeout_s: float) -> ExecResult:
        if self.proc is None or self.proc.poll() is not None:
            self.proc = self._start()
        try:
            assert self.proc.stdin is not None and self.proc.stdout is not None
            self.proc.stdin.write((json.dumps(request) + "\n").encode())
            self.proc.stdin.flush()
            ready, _, _ = select.select([self.proc.stdout], [], [], hard_timeout_s)
            if not ready:
                self.kill()
                return ExecResult(
                    False, kind="timeout", error=f"no answer within {hard_timeout_s:.1f}s; worker killed and replaced"
                )
            line = self.proc.stdout.readline()
        except (BrokenPipeError, OSError) as e:
            self.kill()
            return ExecResult(False, kind="crash", error=f"worker pipe failed: {e}")
        if not line.endswith(b"\n"):
            code = self.proc.wait()
            self.proc = None
            return ExecResult(False, kind="crash", error=f"worker died (exit code {code})")
        return _decode(json.loads(line))

    def kill(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait()
            for stream in (self.proc.stdin, self.proc.stdout):
                if stream is not None:
                    stream.close()
            self.proc = None


def _decode(resp: dict) -> ExecResult:
    if not resp.get("ok"):
        return ExecResult(False, kind=str(resp.get("kind", "error")), error=str(resp.get("error", "")))
    rows = tuple(tuple(bytes.fromhex(v["$b"]) if isinstance(v, dict) else v for v in r) for r in resp["rows"])
    return ExecResult(True, rows=rows)


class SQLSandbox:
    """A pool of `num_workers` SQL worker processes; safe to call from many threads at once."""

    def __init__(
        self, num_workers: int | None = None, max_rows: int = 100_000, memory_limit_mb: int = 2048, grace_s: float = 5.0
    ) -> None:
        num_workers = num_workers or min(4, os.cpu_count() or 1)
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers}")
        if max_rows < 1:
            raise ValueError(f"max_rows must be >= 1, got {max_rows}")
        self.max_rows = max_rows
        self.grace_s = grace_s
        self._tmp = tempfile.TemporaryDirectory(prefix="arctic-rl-sql-")
        self._workers = [_Worker(memory_limit_mb, self._tmp.name) for _ in range(num_workers)]
        self._idle: queue.Queue[_Worker] = queue.Queue()
        for w in self._workers:
            self._idle.put(w)
        self._closed = False

    @property
    def num_workers(self) -> int:
        return len(self._workers)

    def worker_pids(self) -> list[int]:
        """The pids of the workers started so far (for tests and debugging)."""
        return [w.pid for w in self._workers if w.pid is not None]

    def execute(self, db_path: str | os.PathLike, sql: str, timeout_s: float = 30.0) -> ExecResult:
        if self._closed:
            raise RuntimeError("SQLSandbox is closed")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        db = os.path.abspath(os.fspath(db_path))
        if not os.path.isfile(db):
            return ExecResult(False, kind="error", error=f"database file not found: {db}")
        request = {"db": db, "sql": sql, "timeout_s": timeout_s, "max_rows": self.max_rows}
        worker = self._idle.get()
        try:
            return worker.run(request, timeout_s + self.grace_s)
        finally:
            self._idle.put(worker)

    def execute_many(
        self,
        queries: Sequence[tuple[str | os.PathLike, str]],
        timeout_s: float = 30.0,
        on_done: Callable[[], None] | None = None,
    ) -> list[ExecResult]:
        """Runs (db_path, sql) pairs across the workers; results in input order. `on_done` is
        called once per finished query (a progress bar's update)."""

        def one(q: tuple[str | os.PathLike, str]) -> ExecResult:
            res = self.execute(q[0], q[1], timeout_s)
            if on_done is not None:
                on_done()
            return res

        if len(queries) <= 1:
            return [one(q) for q in queries]
        with ThreadPoolExecutor(max_workers=self.num_workers) as pool:
            return list(pool.map(one, queries))

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for w in self._workers:
            w.kill()
        self._tmp.cleanup()

    def __enter__(self) -> SQLSandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_default: SQLSandbox | None = None
_default_lock = threading.Lock()


def default_sandbox() -> SQLSandbox:
    """The process-wide sandbox that the reward and the BIRD eval share (closed at exit)."""
    global _default
    with _default_lock:
        if _default is None or _default._closed:
            _default = SQLSandbox()
            atexit.register(_default.close)
        return _default
