"""One sandboxed SQL worker process (started by `sandbox.SQLSandbox`, never imported by it).

Runs as `python -I _sql_worker.py MEMORY_LIMIT_MB` and speaks JSON lines on stdin/stdout:
    request:  {"db": path, "sql": text, "timeout_s": float, "max_rows": int}
    response: {"ok": true, "rows": [[...], ...]} or {"ok": false, "kind": ..., "error": text}
It imports only the standard library so that it starts in tens of milliseconds, and it runs
only one query at a time. The guards, each enough on its own against writes:
  1. a statement gate: the text must start with SELECT, WITH or VALUES (after comments);
  2. the database is opened read-only and immutable (`file:...?mode=ro&immutable=1`);
  3. an authorizer that allows reads, SELECT, recursive CTEs and functions (minus a deny list),
     and denies every other action: writes, DDL (temp objects too: the temp schema stays
     writable on a read-only connection), ATTACH (also how VACUUM INTO writes), PRAGMA,
     transactions, extension loading;
  4. ATTACH is limited to 0 databases, extension loading stays disabled.
Resources: a progress handler enforces the timeout, fetching stops at max_rows + 1, the
address space is capped (RLIMIT_AS), SQLite values at 10 MB and an answer at 64 MB of JSON; whatever still hangs or crashes
the process is the parent's to kill and replace.
"""

from __future__ import annotations

import json
import sqlite3
import sys
import time
import urllib.parse

ALLOWED_ACTIONS = {
    sqlite3.SQLITE_SELECT,
    sqlite3.SQLITE_READ,
    sqlite3.SQLITE_FUNCTION,
    getattr(sqlite3, "SQLITE_RECURSIVE", 33),
}
# Functions that touch files or process memory in some builds (the CLI's readfile/writefile/edit,
# fts3_tokenizer's pointer form); load_extension is also disabled at the C level.
DENIED_FUNCTIONS = {"load_extension", "readfile", "writefile", "edit", "fts3_tokenizer"}
STARTERS = ("select", "with", "values")
# Statements SQLite knows that are not queries: reported as "denied"; any other first word is a
# typo that SQLite would reject as a syntax error anyway.
NON_QUERY_STATEMENTS = {
    "insert",
    "replace",
    "update",
    "delete",
    "create",
    "drop",
    "alter",
    "attach",
    "detach",
    "pragma",
    "vacuum",
    "reindex",
    "analyze",
    "begin",
    "commit",
    "end",
    "rollback",
    "savepoint",
    "release",
    "explain",
    "upsert",
}
MAX_CACHED_CONNECTIONS = 8
PROGRESS_EVERY_N_OPS = 20_000
# The parent holds each answer in memory: a result larger than this is refused, not sent.
MAX_RESPONSE_CHARS = 64 * 1024 * 1024


def authorize(action: int, arg1: str | None, arg2: str | None, db: str | None, source: str | None) -> int:
    if action not in ALLOWED_ACTIONS:
        return sqlite3.SQLITE_DENY
    if action == sqlite3.SQLITE_FUNCTION and (arg2 or "").lower() in DENIED_FUNCTIONS:
        return sqlite3.SQLITE_DENY
    return sqlite3.SQLITE_OK


def first_keyword(sql: str) -> str:
    """The first word of `sql` after whitespace, comments and opening parentheses, lowercased."""
    i, n = 0, len(sql)
    while i < n:
        if sql[i].isspace() or sql[i] == "(":
            i += 1
        elif sql.startswith("--", i):
            j = sql.find("\n", i)
            i = n if j < 0 else j + 1
        elif sql.startswith("/*", i):
            j = sql.find("*/", i + 2)
            i = n if j < 0 else j + 2
        else:
            break
    j = i
    while j < n and (sql[j].isalnum() or sql[j] == "_"):
        j += 1
    return sql[i:j].lower()


class Worker:
    def __init__(self) -> None:
        self.conns: dict[str, sqlite3.Connection] = {}
        self.deadline = 0.0

    def connect(self, db: str) -> sqlite3.Connection:
        conn = self.conns.get(db)
        if conn is not None:
            return conn
        if len(self.conns) >= MAX_CACHED_CONNECTIONS:
            self.conns.pop(next(iter(self.conns))).close()
        uri = f"file:{urllib.parse.quote(db)}?mode=ro&immutable=1"
        conn = sqlite3.connect(uri, uri=True, check_same_thread=False)
        conn.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
        conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, 10_000_000)
        conn.set_authorizer(authorize)
        # A non-zero return aborts the statement with "interrupted".
        conn.set_progress_handler(lambda: int(time.monotonic() > self.deadline), PROGRESS_EVERY_N_OPS)
        self.conns[db] = conn
        return conn

    def run(self, req: dict) -> dict:
        sql = req["sql"]
        word = first_keyword(sql)
        if word not in STARTERS:
            kind = "denied" if word in NON_QUERY_STATEMENTS else "syntax"
            return {"ok": False, "kind": kind, "error": f"only SELECT/WITH/VALUES queries run here, got {word!r} first"}
        try:
            conn = self.connect(req["db"])
        except sqlite3.Error as e:
            return {"ok": False, "kind": "error", "error": f"cannot open {req['db']!r}: {e}"}
        self.deadline = time.monotonic() + float(req["timeout_s"])
        max_rows = int(req["max_rows"])
        try:
            cur = conn.execute(sql)
            rows: list[list] = []
            while len(rows) <= max_rows:
                chunk = cur.fetchmany(1000)
                if not chunk:
                    break
                rows.extend([_jsonable(v) for v in r] for r in chunk)
            cur.close()
        except sqlite3.Error as e:
            return {"ok": False, "kind": _kind(e), "error": f"{type(e).__name__}: {e}"}
        except sqlite3.Warning as e:  # "You can only execute one statement at a time."
            return {"ok": False, "kind": "error", "error": f"{type(e).__name__}: {e}"}
        except MemoryError:
            return {"ok": False, "kind": "error", "error": "out of memory"}
        if len(rows) > max_rows:
            return {"ok": False, "kind": "too_many_rows", "error": f"more than max_rows={max_rows} rows"}
        return {"ok": True, "rows": rows}


def _kind(e: sqlite3.Error) -> str:
    msg = str(e).lower()
    if "interrupted" in msg:
        return "timeout"
    if "not authorized" in msg or "readonly" in msg or "too many attached" in msg:
        return "denied"
    if "syntax error" in msg or "incomplete input" in msg or "unrecognized token" in msg:
        return "syntax"
    return "error"


def _jsonable(v: object) -> object:
    # JSON has no bytes; BLOBs travel tagged and come back as bytes (results are compared by value).
    if isinstance(v, bytes):
        return {"$b": v.hex()}
    return v


def _limit_memory(megabytes: int) -> None:
    if megabytes <= 0:
        return
    try:
        import resource

        limit = megabytes * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    except (ImportError, ValueError, OSError):
        pass  # not available on this platform; the parent's timeout still bounds the query


def main() -> None:
    _limit_memory(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
    worker = Worker()
    out = sys.stdout
    for line in sys.stdin:
        try:
            resp = worker.run(json.loads(line))
        except Exception as e:  # a malformed request must not end the worker
            resp = {"ok": False, "kind": "error", "error": f"worker: {type(e).__name__}: {e}"}
        text = json.dumps(resp)
        if len(text) > MAX_RESPONSE_CHARS:
            text = json.dumps(
                {
                    "ok": False,
                    "kind": "too_many_rows",
                    "error": f"result is {len(text)} characters as JSON, over {MAX_RESPONSE_CHARS}",
                }
            )
        out.write(text + "\n")
        out.flush()


if __name__ == "__main__":
    main()
