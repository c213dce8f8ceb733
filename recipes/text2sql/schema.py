"""Database schema as the prompt shows it: CREATE TABLE statements read from the database, with a
few sample values per column, and the schema-pruning stand-in (`tables_in_sql`).

    print(schema_prompt("chinook.sqlite", tables=["Artist"], num_values=3))
    CREATE TABLE Artist (
      ArtistId INTEGER PRIMARY KEY, -- e.g. 1, 2, 3
      Name TEXT -- e.g. 'AC/DC', 'Accept', 'Aerosmith'
    );

These read trusted databases with our own SQL (identifiers come from sqlite_master), so they use
a plain read-only connection, not the sandbox.
"""

from __future__ import annotations

import functools
import sqlite3
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import sqlglot
from sqlglot import exp

MAX_VALUE_CHARS = 40


def quote_ident(name: str) -> str:
    """`name` as SQLite would accept it: bare when it is a plain word, else double-quoted."""
    if name.replace("_", "a").isalnum() and not name[0].isdigit() and name.isascii():
        return name
    return '"' + name.replace('"', '""') + '"'


@contextmanager
def _connect(db_path: str | Path) -> Iterator[sqlite3.Connection]:
    path = Path(db_path).resolve()
    if not path.is_file():
        raise FileNotFoundError(f"database file not found: {path}")
    conn = sqlite3.connect(f"file:{urllib.parse.quote(str(path))}?mode=ro&immutable=1", uri=True)
    try:
        yield conn
    finally:
        conn.close()


@functools.lru_cache(maxsize=256)
def table_names(db_path: str) -> tuple[str, ...]:
    with _connect(db_path) as conn:
        rows = conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY rowid"
        ).fetchall()
    return tuple(r[0] for r in rows)


def _literal(v: object) -> str:
    if isinstance(v, str):
        s = v if len(v) <= MAX_VALUE_CHARS else v[:MAX_VALUE_CHARS] + "..."
        return "'" + s.replace("'", "''").replace("\n", " ") + "'"
    if isinstance(v, bytes):
        return "<blob>"
    if isinstance(v, float):
        return repr(round(v, 6))  # 10.357019999999999 reads as 10.35702; samples only illustrate
    return repr(v)


def _create_table(conn: sqlite3.Connection, table: str, num_values: int) -> str:
    q = quote_ident(table)
    cols = conn.execute(f"PRAGMA table_info({q})").fetchall()  # cid, name, type, notnull, dflt, pk
    # id, seq, table, from, to, ...; SQLite numbers them last-declared first.
    fks = sorted(conn.execute(f"PRAGMA foreign_key_list({q})").fetchall(), key=lambda f: (-f[0], f[1]))
    single_pk = sum(1 for c in cols if c[5]) == 1
    lines = []
    for _, name, col_type, _, _, pk in cols:
        line = f"{quote_ident(name)} {col_type or ''}".rstrip()
        if pk and single_pk:
            line += " PRIMARY KEY"
        lines.append([line, _sample_comment(conn, q, name, num_values)])
    if not single_pk and any(c[5] for c in cols):
        pk_cols = [c[1] for c in sorted(cols, key=lambda c: c[5]) if c[5]]
        lines.append([f"PRIMARY KEY ({', '.join(map(quote_ident, pk_cols))})", ""])
    for fk in fks:
        ref_col = quote_ident(fk[4]) if fk[4] else ""
        lines.append(
            [
                f"FOREIGN KEY ({quote_ident(fk[3])}) REFERENCES {quote_ident(fk[2])}"
                f"{f' ({ref_col})' if ref_col else ''}",
                "",
            ]
        )
    body = []
    for i, (line, comment) in enumerate(lines):
        sep = "," if i < len(lines) - 1 else ""
        body.append(f"  {line}{sep}{f' -- {comment}' if comment else ''}")
    return f"CREATE TABLE {q} (\n" + "\n".join(body) + "\n);"


def _sample_comment(conn: sqlite3.Connection, q_table: str, column: str, num_values: int) -> str:
    if num_values <= 0:
        return ""
    c = quote_ident(column)
    values = conn.execute(f"SELECT DISTINCT {c} FROM {q_table} WHERE {c} IS NOT NULL LIMIT ?", (num_values,)).fetchall()
    return "e.g. " + ", ".join(_literal(v[0]) for v in values) if values else "all NULL"


@functools.lru_cache(maxsize=1024)
def _schema_prompt(db_path: str, tables: tuple[str, ...] | None, num_values: int) -> str:
    names = table_names(db_path)
    if tables is None:
        chosen = names
    else:
        lower = {t.lower() for t in tables}
        chosen = tuple(n for n in names if n.lower() in lower)
        missing = lower - {n.lower() for n in chosen}
        if missing:
            raise ValueError(f"tables {sorted(missing)} are not in {db_path} (it has {list(names)})")
    with _connect(db_path) as conn:
        return "\n\n".join(_create_table(conn, t, num_values) for t in chosen)


def schema_prompt(db_path: str | Path, tables: list[str] | tuple[str, ...] | None = None, num_values: int = 3) -> str:
    """CREATE TABLE statements for `tables` (all tables when None), in the database's order,
    each column commented with up to `num_values` distinct sample values."""
    key = tuple(sorted(tables, key=str.lower)) if tables is not None else None
    return _schema_prompt(str(Path(db_path).resolve()), key, num_values)


def tables_in_sql(sql: str, db_path: str | Path) -> list[str]:
    """The database tables that `sql` reads, spelled as in the database, in database order.

    This is how `schema_tables: relevant` prunes the prompt's schema: it reads the tables off the
    gold SQL, a stand-in for a schema-linking step (which real pipelines run as a retriever or a
    first model call). It leaks which tables are needed, never the query itself.
    """
    parsed = sqlglot.parse_one(sql, read="sqlite")
    ctes = {c.alias_or_name.lower() for c in parsed.find_all(exp.CTE)}
    used = {t.name.lower() for t in parsed.find_all(exp.Table)} - ctes
    names = table_names(str(Path(db_path).resolve()))
    unknown = used - {n.lower() for n in names}
    if unknown:
        raise ValueError(f"SQL reads tables {sorted(unknown)} that {db_path} does not have: {sql!r}")
    return [n for n in names if n.lower() in used]
