"""Execution-match reward, SQL extraction and the SQL sandbox (recipes/text2sql).

The destructive corpus checks the promise that matters most: no predicted SQL changes a single
byte of any database file (sha256 of every file in the database folder, before and after).
"""

from __future__ import annotations

import hashlib
import os
import signal
import sqlite3
import threading
import time
from pathlib import Path

import pytest

from recipes.text2sql import _sql_worker
from recipes.text2sql.extract import extract_sql, parses_as_sqlite, sqlite_rewrites
from recipes.text2sql.reward import RewardOptions, execution_match, score
from recipes.text2sql.sandbox import SQLSandbox

LOOP_SQL = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT COUNT(*) FROM c"


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("db") / "shop" / "shop.sqlite"
    path.parent.mkdir()
    conn = sqlite3.connect(path)
    conn.executescript("""
        CREATE TABLE item (id INTEGER PRIMARY KEY, name TEXT, price REAL, color TEXT, stock INTEGER);
        INSERT INTO item VALUES (1, 'pen', 1.5, 'blue', 10), (2, 'cup', 4.0, 'red', 0),
                                (3, 'mug', 4.0, NULL, 3), (4, 'ink', 0.1, 'blue', 7);
        CREATE TABLE sale (item_id INTEGER REFERENCES item (id), qty INTEGER);
        INSERT INTO sale VALUES (1, 2), (1, 3), (3, 1);
    """)
    conn.commit()
    conn.close()
    return path


@pytest.fixture(scope="module")
def box() -> SQLSandbox:
    with SQLSandbox(num_workers=2, max_rows=1000, grace_s=2.0) as b:
        yield b


def match(box: SQLSandbox, db: Path, pred: str, gold: str, **kw: float) -> bool:
    return execution_match(pred, gold, str(db), sandbox=box, **kw)


# --- execution match, as BIRD compares ---------------------------------------------------------


def test_matching_and_non_matching(box: SQLSandbox, db: Path) -> None:
    gold = "SELECT name FROM item WHERE color = 'blue'"
    assert match(box, db, "SELECT name FROM item WHERE color = 'blue'", gold)
    assert match(box, db, "SELECT name FROM item WHERE id IN (1, 4)", gold)  # other SQL, same rows
    assert not match(box, db, "SELECT name FROM item", gold)
    assert not match(box, db, "SELECT name FROM item WHERE color = 'red'", gold)
    assert not match(box, db, "SELECT id, name FROM item WHERE color = 'blue'", gold)  # extra column


def test_row_order_and_duplicates_do_not_count(box: SQLSandbox, db: Path) -> None:
    gold = "SELECT name FROM item ORDER BY name"
    assert match(box, db, "SELECT name FROM item ORDER BY name DESC", gold)
    # BIRD compares sets: duplicate rows collapse.
    assert match(box, db, "SELECT name FROM item UNION ALL SELECT name FROM item", gold)
    assert match(box, db, "SELECT price FROM item", "SELECT DISTINCT price FROM item")


def test_column_order_counts(box: SQLSandbox, db: Path) -> None:
    assert not match(box, db, "SELECT price, name FROM item", "SELECT name, price FROM item")


def test_nulls(box: SQLSandbox, db: Path) -> None:
    assert match(box, db, "SELECT color FROM item WHERE id = 3", "SELECT NULL")
    assert match(box, db, "SELECT DISTINCT color FROM item", "SELECT color FROM item")
    assert not match(box, db, "SELECT color FROM item WHERE color IS NOT NULL", "SELECT color FROM item")
    assert not match(box, db, "SELECT ''", "SELECT NULL")


def test_floats_and_types(box: SQLSandbox, db: Path) -> None:
    assert match(box, db, "SELECT 4", "SELECT price FROM item WHERE id = 2")  # 4 == 4.0 in Python sets
    assert not match(box, db, "SELECT '4.0'", "SELECT price FROM item WHERE id = 2")  # text is not a number
    assert not match(box, db, "SELECT 0.1 + 0.2", "SELECT 0.3")  # exact comparison, as BIRD
    assert match(box, db, "SELECT ROUND(0.1 + 0.2, 2)", "SELECT 0.3")
    assert match(box, db, "SELECT AVG(price) FROM item", "SELECT SUM(price) / COUNT(*) FROM item")


def test_errors_are_no_match(box: SQLSandbox, db: Path) -> None:
    gold = "SELECT COUNT(*) FROM item"
    assert not match(box, db, "SELEC COUNT(*) FROM item", gold)
    assert not match(box, db, "SELECT COUNT(* FROM item", gold)
    assert not match(box, db, "SELECT COUNT(*) FROM nope", gold)
    assert not match(box, db, "SELECT COUNT(*) FROM item; SELECT 1", gold)
    res = box.execute(db, "SELECT COUNT(*) FROM item; SELECT 1")
    assert not res.ok and "one statement" in res.error
    res = box.execute(db, "SELECT COUNT(* FROM item")
    assert not res.ok and res.kind == "syntax"
    # A gold that fails never matches, even against the same failing SQL.
    assert not match(box, db, "SELECT * FROM nope", "SELECT * FROM nope")


@pytest.mark.parametrize("sql", ["SELECT DATEDIFF('', price, stock) FROM item", 'SELECT DATEADD("", 1, price)'])
def test_sql_that_crashes_a_dialects_parser_scores_instead_of_raising(box: SQLSandbox, db: Path, sql: str) -> None:
    # sqlglot's T-SQL reader raises ValueError (not its ParseError) on these; a sampled answer like them ended
    # a benchmark run in the reward pool.
    assert sqlite_rewrites(sql) == [] or all(isinstance(r, str) for r in sqlite_rewrites(sql))
    assert isinstance(parses_as_sqlite(sql), bool)
    ex = {"db_path": str(db), "gold_sql": "SELECT COUNT(*) FROM item", "reward_options": {"format_credit": 0.02}}
    assert 0.0 <= score(f"```sql\n{sql}\n```", ex, sandbox=box) < 1.0  # another dialect's rewrite may run


def test_timeout(box: SQLSandbox, db: Path) -> None:
    start = time.monotonic()
    res = box.execute(db, LOOP_SQL, timeout_s=0.5)
    assert not res.ok and res.kind == "timeout", res
    assert time.monotonic() - start < 5
    assert not match(box, db, LOOP_SQL, "SELECT 1", timeout_s=0.5)
    assert box.execute(db, "SELECT 1").rows == ((1,),)  # the worker is still usable


def test_row_cap(db: Path) -> None:
    with SQLSandbox(num_workers=1, max_rows=3) as small:
        assert small.execute(db, "SELECT id FROM item LIMIT 3").ok
        res = small.execute(db, "SELECT id FROM item")
        assert not res.ok and res.kind == "too_many_rows"


def test_blobs_round_trip(box: SQLSandbox, db: Path) -> None:
    assert box.execute(db, "SELECT x'00ff', 2.5, NULL, 'a'").rows == ((b"\x00\xff", 2.5, None, "a"),)


def test_missing_database(box: SQLSandbox, tmp_path: Path) -> None:
    res = box.execute(tmp_path / "nope.sqlite", "SELECT 1")
    assert not res.ok and "not found" in res.error
    assert not (tmp_path / "nope.sqlite").exists()  # read-only open never creates a file


# --- the sandbox: nothing predicted can write ------------------------------------------------

DESTRUCTIVE = [
    "DROP TABLE item",
    "DELETE FROM item",
    "UPDATE item SET price = 0",
    "INSERT INTO item VALUES (9, 'x', 1, 'x', 1)",
    "REPLACE INTO item VALUES (1, 'x', 1, 'x', 1)",
    "ALTER TABLE item ADD COLUMN z",
    "ALTER TABLE item RENAME TO gone",
    "CREATE TABLE t2 (a)",
    "CREATE INDEX ix ON item (name)",
    "CREATE VIEW v AS SELECT 1",
    "CREATE TRIGGER tr AFTER INSERT ON item BEGIN DELETE FROM item; END",
    "CREATE TEMP TABLE t (a)",
    "CREATE TEMP VIEW tv AS SELECT 1",
    "CREATE TEMP TRIGGER tt AFTER INSERT ON item BEGIN DELETE FROM item; END",
    "ATTACH DATABASE '{other}' AS o",
    "ATTACH DATABASE ':memory:' AS m",
    "DETACH DATABASE main",
    "PRAGMA writable_schema = 1",
    "PRAGMA journal_mode = WAL",
    "PRAGMA user_version = 7",
    "PRAGMA query_only = 0",
    "VACUUM",
    "VACUUM INTO '{other}'",
    "REINDEX",
    "ANALYZE",
    "BEGIN IMMEDIATE",
    "SAVEPOINT s",
    "SELECT load_extension('/tmp/evil.so')",
    "SELECT load_extension('libc.so.6', 'system')",
    "SELECT writefile('{other}', 'x')",
    "SELECT * FROM pragma_table_info('item')",
    "WITH x AS (SELECT 1) DELETE FROM item",
    "WITH x AS (SELECT 1) UPDATE item SET price = 0",
    "WITH x AS (SELECT 1) INSERT INTO item SELECT * FROM item",
    "SELECT 1; DROP TABLE item",
    "SELECT 1; ATTACH DATABASE '{other}' AS o",
    "/* hi */ DROP TABLE item",
    "-- comment\nDELETE FROM item",
    "(DELETE FROM item)",
    "EXPLAIN DELETE FROM item",
]


def _folder_digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def test_destructive_corpus_changes_no_byte(tmp_path: Path) -> None:
    folder = tmp_path / "shop"
    folder.mkdir()
    db = folder / "shop.sqlite"
    conn = sqlite3.connect(db)
    conn.executescript(
        "CREATE TABLE item (id INTEGER PRIMARY KEY, name TEXT, price REAL, color TEXT, stock INT);"
        "INSERT INTO item VALUES (1, 'pen', 1.5, 'blue', 10); CREATE INDEX ix_color ON item (color);"
    )
    conn.commit()
    conn.close()
    other = tmp_path / "elsewhere" / "stolen.sqlite"
    other.parent.mkdir()
    before = _folder_digest(folder)
    mtime = db.stat().st_mtime_ns
    with SQLSandbox(num_workers=1) as box:
        for sql in DESTRUCTIVE:
            res = box.execute(db, sql.format(other=other), timeout_s=5)
            assert not res.ok, f"ran: {sql}"
            assert res.kind in ("denied", "error", "syntax"), (sql, res)
        assert box.execute(db, "SELECT COUNT(*) FROM item").rows == ((1,),)
    assert _folder_digest(folder) == before  # no byte changed, no -journal/-wal/-shm file appeared
    assert db.stat().st_mtime_ns == mtime
    assert list(other.parent.iterdir()) == []  # nothing written elsewhere (VACUUM INTO, ATTACH)


@pytest.mark.parametrize("sql", [s for s in DESTRUCTIVE if not s.startswith(("SELECT 1;",))])
def test_authorizer_alone_refuses_writes(tmp_path: Path, sql: str) -> None:
    # Defence in depth: even without the statement gate, and on a connection that is NOT
    # read-only, the authorizer refuses every write (here on a scratch copy).
    db = tmp_path / "scratch.sqlite"
    conn = sqlite3.connect(db)
    conn.executescript(
        "CREATE TABLE item (id INTEGER PRIMARY KEY, name TEXT, price REAL, color TEXT, stock INT);"
        "INSERT INTO item VALUES (1, 'pen', 1.5, 'blue', 10); CREATE INDEX ix_color ON item (color);"
    )
    conn.commit()
    before = hashlib.sha256(db.read_bytes()).hexdigest()
    conn.set_authorizer(_sql_worker.authorize)
    conn.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
    with pytest.raises((sqlite3.DatabaseError, sqlite3.ProgrammingError, sqlite3.Warning)):
        conn.execute(sql.format(other=tmp_path / "o.sqlite"))
    conn.close()
    assert hashlib.sha256(db.read_bytes()).hexdigest() == before
    assert not (tmp_path / "o.sqlite").exists()


def test_first_keyword_gate() -> None:
    assert _sql_worker.first_keyword("  /* x */ -- y\n ( SELECT 1)") == "select"
    assert _sql_worker.first_keyword("with x as (select 1) select 1") == "with"
    assert _sql_worker.first_keyword("/* unterminated") == ""


def test_crashed_worker_is_replaced(db: Path) -> None:
    with SQLSandbox(num_workers=1, grace_s=2.0) as box:
        assert box.execute(db, "SELECT 1").ok
        (pid,) = box.worker_pids()
        # Kill the worker mid-query, as a segfault inside SQLite would.
        killer = threading.Timer(0.5, os.kill, (pid, signal.SIGSEGV))
        killer.start()
        res = box.execute(db, LOOP_SQL, timeout_s=20)
        killer.join()
        assert not res.ok and res.kind == "crash", res
        assert box.execute(db, "SELECT 2").rows == ((2,),)
        assert box.worker_pids() != [pid]


def test_hung_worker_is_killed_and_replaced(db: Path) -> None:
    with SQLSandbox(num_workers=1, grace_s=0.5) as box:
        assert box.execute(db, "SELECT 1").ok
        (pid,) = box.worker_pids()
        os.kill(pid, signal.SIGSTOP)  # hung: no progress handler can run
        start = time.monotonic()
        res = box.execute(db, "SELECT 1", timeout_s=0.5)
        assert not res.ok and res.kind == "timeout" and "killed" in res.error
        assert time.monotonic() - start < 5
        assert box.execute(db, "SELECT 3").rows == ((3,),)
        assert box.worker_pids() != [pid]


def test_a_worker_s_environment_carries_no_secret(db: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The loop's environment holds Ray's and arctic-rl's tokens, MLflow's URI, keys; a worker that runs the model's
    SQL starts without them (read from the kernel's record of the real worker process: its initial os.environ)."""
    secrets = {
        "ARCTIC_RL_TOKEN": "arctic-secret-1",
        "RAY_AUTH_TOKEN": "ray-secret-2",
        "RAY_AUTH_TOKEN_PATH": "/job/ray-token-3",
        "MLFLOW_TRACKING_URI": "https://user:mlflow-secret-4@mlflow.example",
        "MLFLOW_TRACKING_PASSWORD": "mlflow-secret-5",
        "AWS_SECRET_ACCESS_KEY": "aws-secret-6",
        "HF_TOKEN": "hf-secret-7",
        "DATABASE_URL": "postgres://me:db-secret-8@db.example/x",
    }
    for name, value in secrets.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("PLAIN_SETTING_KEPT", "kept")
    with SQLSandbox(num_workers=1) as box:
        assert box.execute(db, "SELECT 1").rows == ((1,),)  # the worker works with the scrubbed environment
        (pid,) = box.worker_pids()
        raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    seen = dict(item.decode().partition("=")[::2] for item in raw if item)
    assert seen["PLAIN_SETTING_KEPT"] == "kept"
    assert {k: v for k, v in seen.items() if any(s in v for s in secrets.values())} == {}
    assert not set(secrets) & set(seen)


def test_many_queries_in_parallel(box: SQLSandbox, db: Path) -> None:
    queries = [(db, f"SELECT {i}") for i in range(40)] + [(db, LOOP_SQL)]
    results = box.execute_many(queries, timeout_s=1.0)
    assert [r.rows for r in results[:40]] == [((i,),) for i in range(40)]
    assert results[40].kind == "timeout"


# --- SQL extraction --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "completion, expected",
    [
        ("```sql\nSELECT a FROM t\n```", "SELECT a FROM t"),
        ("<think>need t</think>\n```sql\nSELECT a FROM t;\n```\nThis returns a.", "SELECT a FROM t"),
        ("```\nSELECT a FROM t\n```", "SELECT a FROM t"),
        ("```SQLite\nSELECT a FROM t\n```", "SELECT a FROM t"),
        ("```sql\nSELECT a FROM t\n", "SELECT a FROM t"),  # stopped at the closing fence
        ("```sql\nSELECT COUNT(*) FROM t WHERE x = 1", "SELECT COUNT(*) FROM t WHERE x = 1"),  # prefill + sample
        ("Here it is:\nSELECT a\nFROM t;\nIt selects a.", "SELECT a\nFROM t"),
        ("SELECT a FROM t\n\nExplanation: ...", "SELECT a FROM t"),
        ("<think>```sql\nSELECT wrong\n```</think>\n```sql\nSELECT right\n```", "SELECT right"),
        ("```python\nprint(1)\n```\n```sql\nSELECT 1\n```", "SELECT 1"),
        ("```sql\nSELECT 1\n```\n```sql\nSELECT 2\n```", "SELECT 2"),  # the last block is the answer
        ("<think>unfinished thoughts", None),
        ("I don't know.", None),
        ("```sql\n\n```", None),
    ],
)
def test_extract_sql(completion: str, expected: str | None) -> None:
    assert extract_sql(completion) == expected


def test_parse_and_transpile() -> None:
    assert parses_as_sqlite("SELECT a FROM t WHERE b = 1")
    assert not parses_as_sqlite("SELECT a FROM")
    assert not parses_as_sqlite("SELECT 1; SELECT 2")
    assert "SELECT name FROM t LIMIT 5" in sqlite_rewrites("SELECT TOP 5 name FROM t")
    assert sqlite_rewrites("SELECT 1") == []  # nothing to rewrite


# --- the full reward -------------------------------------------------------------------------


def _example(db: Path, gold: str, **kw: object) -> dict:
    return {"db_path": str(db), "gold_sql": gold, "alt_sql": [], "reward_options": {"timeout_s": 2.0}, **kw}


def test_score_levels(box: SQLSandbox, db: Path) -> None:
    ex = _example(db, "SELECT COUNT(*) FROM item WHERE color = 'blue'")
    assert score("```sql\nSELECT COUNT(*) FROM item WHERE color = 'blue'\n```", ex, box) == 1.0
    assert score("```sql\nSELECT COUNT(*) FROM item\n```", ex, box) == pytest.approx(0.1)  # runs, wrong
    assert score("```sql\nSELECT COUNT(*) FROM items\n```", ex, box) == 0.0  # parses, fails to run
    assert score("```sql\nSELECT COUNT(* FROM\n```", ex, box) == 0.0
    assert score("no sql here", ex, box) == 0.0
    shaped = {**ex, "reward_options": {"execution_credit": 0.2, "format_credit": 0.05}}
    assert score("```sql\nSELECT COUNT(*) FROM item\n```", shaped, box) == pytest.approx(0.2)
    assert score("```sql\nSELECT COUNT(*) FROM items\n```", shaped, box) == pytest.approx(0.05)
    assert score("```sql\nSELECT COUNT(* FROM\n```", shaped, box) == 0.0
    assert score("```sql\nDROP TABLE item\n```", shaped, box) == pytest.approx(0.05)  # parses, refused


def test_score_with_prefill_and_other_dialects(box: SQLSandbox, db: Path) -> None:
    # assistant_prefix "```sql\nSELECT" + a sample that stopped at (and so lacks) the closing fence
    ex = _example(db, "SELECT name FROM item WHERE price > 3")
    assert score("```sql\nSELECT" + " name FROM item WHERE price > 3\n", ex, box) == 1.0
    assert score("```sql\nSELECT" + " name FROM item WHERE price > 3", ex, box) == 1.0
    ex = _example(db, "SELECT name FROM item ORDER BY id LIMIT 2")
    assert score("```sql\nSELECT TOP 2 name FROM item ORDER BY id\n```", ex, box) == 1.0  # T-SQL
    no_transpile = {**ex, "reward_options": {"transpile": False}}
    assert score("```sql\nSELECT TOP 2 name FROM item ORDER BY id\n```", no_transpile, box) == 0.0


def test_score_alternative_gold(box: SQLSandbox, db: Path) -> None:
    ex = _example(db, "SELECT name FROM item WHERE price = 4.0", alt_sql=["SELECT name FROM item WHERE id = 2"])
    assert score("```sql\nSELECT name FROM item WHERE price = 4.0\n```", ex, box) == 1.0
    assert score("```sql\nSELECT 'cup'\n```", ex, box) == 1.0
    assert score("```sql\nSELECT 'mug'\n```", ex, box) == pytest.approx(0.1)


def test_score_default_sandbox(db: Path) -> None:
    # No sandbox given: the process-wide one, with the gold result cached.
    ex = _example(db, "SELECT MAX(stock) FROM item")
    assert score("```sql\nSELECT 10\n```", ex) == 1.0
    assert score("```sql\nSELECT 9\n```", ex) == pytest.approx(0.1)


def test_reward_options_are_checked() -> None:
    with pytest.raises(ValueError, match="unknown reward option.*bonus"):
        RewardOptions.from_dict({"bonus": 1})
    with pytest.raises(ValueError, match="execution_credit must be in"):
        RewardOptions.from_dict({"execution_credit": 1.0})
    with pytest.raises(ValueError, match="timeout_s must be > 0"):
        RewardOptions.from_dict({"timeout_s": 0})
