"""Pull the SQL out of a model's answer, and offer SQLite rewrites of SQL written in other dialects.

The answer format asked for is `<think>...</think>` then a ```sql block, but models write many
shapes; `extract_sql` accepts, in order of preference:
  - the last fenced block tagged sql/sqlite (then the last fenced block with any or no tag);
  - an opened fence that never closes (the loop stops *on* the closing fence, and a pre-filled
    "```sql\\nSELECT" prefix is part of the completion);
  - bare SQL: from the first SELECT/WITH at a line start (or the text's start) to the first ";"
    or blank line.
Think blocks are dropped first (an unclosed <think> drops everything after it), unless that
leaves no SQL at all.

    extract_sql("<think>count them</think>\\n```sql\\nSELECT COUNT(*) FROM t;\\n```\\nDone.")
    'SELECT COUNT(*) FROM t'
"""

from __future__ import annotations

import re

import sqlglot

_THINK = re.compile(r"<think>.*?(?:</think>|\Z)", re.S | re.I)
_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[ \t]*\n?(.*?)(?:```|\Z)", re.S)
_BARE_START = re.compile(r"(?:^|\n)[ \t]*((?:SELECT|WITH)\b.*)", re.S | re.I)
_SQL_TAGS = {"sql", "sqlite", "sqlite3", "mysql", "postgresql", "postgres", "tsql"}
# Dialects tried, in order, when SQL fails in SQLite: what models most often write otherwise.
FALLBACK_DIALECTS = ("mysql", "postgres", "tsql", "snowflake", "bigquery")


def _from_fences(text: str) -> str | None:
    blocks = [(tag.lower(), body) for tag, body in _FENCE.findall(text)]
    if not blocks:
        return None
    tagged = [body for tag, body in blocks if tag in _SQL_TAGS]
    untagged = [body for tag, body in blocks if not tag]
    for candidates in (tagged, untagged, [b for _, b in blocks]):
        for body in reversed(candidates):
            if body.strip():
                return body
    return None


def _from_bare(text: str) -> str | None:
    m = _BARE_START.search(text)
    if not m:
        return None
    sql = m.group(1)
    sql = re.split(r";|\n[ \t]*\n", sql, maxsplit=1)[0]
    return sql


def _clean(sql: str) -> str:
    sql = sql.strip()
    # A trailing ";" (or several) is the end of the one statement, not a second statement.
    while sql.endswith(";"):
        sql = sql[:-1].rstrip()
    return sql


def extract_sql(completion: str) -> str | None:
    """The SQL query in `completion`, or None when there is none."""
    for text in (_THINK.sub("", completion), completion):
        for finder in (_from_fences, _from_bare):
            sql = finder(text)
            if sql is not None and _clean(sql):
                return _clean(sql)
    return None


def parses_as_sqlite(sql: str) -> bool:
    """Whether sqlglot reads `sql` as exactly one SQLite statement (a format check, not a run)."""
    try:
        statements = [s for s in sqlglot.parse(sql, read="sqlite") if s is not None]
    except Exception:  # noqa: BLE001 - as in sqlite_rewrites: whatever the parser raises, it does not parse
        return False
    return len(statements) == 1


def sqlite_rewrites(sql: str, dialects: tuple[str, ...] = FALLBACK_DIALECTS) -> list[str]:
    """`sql` transpiled to SQLite from each dialect that parses it, distinct and different from
    `sql` itself; tried by the reward only after the SQL as written failed in SQLite (so a query
    that SQLite already runs is never rewritten)."""
    seen = {sql.strip()}
    out: list[str] = []
    for dialect in dialects:
        try:
            statements = sqlglot.transpile(sql, read=dialect, write="sqlite")
        except Exception:  # noqa: BLE001 - predicted SQL is hostile: sqlglot's dialects also raise ValueError
            continue  # (T-SQL's DATEDIFF('', a, b)) and RecursionError; any of them means no rewrite
        if len(statements) != 1 or statements[0].strip() in seen:
            continue
        seen.add(statements[0].strip())
        out.append(statements[0])
    return out
