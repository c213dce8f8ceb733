"""Execution-match reward, as BIRD's official evaluation scores: the predicted and the gold query
each run on the question's database, and they match when their result rows are equal *as sets*
(`set(pred_rows) == set(gold_rows)`): row order and duplicate rows do not count, column order
and values do (1 == 1.0, but 1 != '1'; NULL equals NULL; floats compare exactly).

    score(completion, example) -> float
      1.0                          results match the gold SQL's (or one of `alt_sql`'s)
      reward_options.execution_credit (0.1)   the SQL runs, but the result differs
      reward_options.format_credit (0.0)      SQL was found and parses, but does not run
      0.0                          no SQL found / unparsable, or every run failed

The small credits give GRPO a gradient before the first exact match; format credit is 0 by
default because a pre-filled "```sql\\nSELECT" makes nearly every completion well-formed.
Predicted SQL runs in the sandbox (`sandbox.py`); gold results are cached per (db, SQL).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping

from pydantic import ConfigDict, ValidationInfo, field_validator

from arctic_rl.strict import Strict, parse
from recipes.text2sql.extract import extract_sql, parses_as_sqlite, sqlite_rewrites
from recipes.text2sql.sandbox import ExecResult, SQLSandbox, default_sandbox


class RewardOptions(Strict):
    model_config = ConfigDict(frozen=True, validate_assignment=False)

    execution_credit: float = 0.1  # the SQL runs but its result differs from the gold's
    format_credit: float = 0.0  # the SQL parses but does not run
    timeout_s: float = 30.0  # per query, as BIRD's evaluation (meta_time_out=30)
    transpile: bool = True  # retry SQL that fails in SQLite as transpiled from other dialects

    @field_validator("execution_credit", "format_credit")
    @classmethod
    def _credit(cls, v: float, info: ValidationInfo) -> float:
        if not 0.0 <= v < 1.0:
            raise ValueError(f"{info.field_name} must be in [0, 1), got {v!r}")
        return v

    @field_validator("timeout_s")
    @classmethod
    def _timeout(cls, v: float) -> float:
        if v <= 0:
            raise ValueError(f"timeout_s must be > 0, got {v!r}")
        return v

    @classmethod
    def from_dict(cls, d: Mapping[str, object] | None) -> RewardOptions:
        """Raises ConfigError (a ValueError) naming the option and the value."""
        return parse(cls, dict(d or {}), name="reward option", noun="reward option")


def results_match(pred: ExecResult, gold: ExecResult) -> bool:
    """BIRD's comparison: both ran, and their rows are equal as sets."""
    return pred.ok and gold.ok and set(pred.rows) == set(gold.rows)


@functools.lru_cache(maxsize=8192)
def _gold_result(db_path: str, mtime_ns: int, gold_sql: str, timeout_s: float) -> ExecResult:
    # Cached because a GRPO group scores n samples against one gold query; the file's mtime is in
    # the key so that a rebuilt database is not scored against stale rows.
    return default_sandbox().execute(db_path, gold_sql, timeout_s)


def gold_result(db_path: str, gold_sql: str, timeout_s: float = 30.0, sandbox: SQLSandbox | None = None) -> ExecResult:
    if sandbox is not None:
        return sandbox.execute(db_path, gold_sql, timeout_s)
    try:
        mtime_ns = os.stat(db_path).st_mtime_ns
    except OSError:
        return ExecResult(False, kind="error", error=f"database file not found: {db_path}")
    return _gold_result(str(db_path), mtime_ns, gold_sql, float(timeout_s))


def execution_match(
    pred_sql: str, gold_sql: str, db_path: str, timeout_s: float = 30.0, sandbox: SQLSandbox | None = None
) -> bool:
    """Whether `pred_sql` returns the same set of rows as `gold_sql` on `db_path` (the SQL as
    written, no dialect rewriting; that is `score`'s business)."""
    box = sandbox or default_sandbox()
    gold = gold_result(db_path, gold_sql, timeout_s, sandbox)
    if not gold.ok:
        return False
    return results_match(box.execute(db_path, pred_sql, timeout_s), gold)


def run_prediction(pred_sql: str, db_path: str, opts: RewardOptions, sandbox: SQLSandbox | None = None) -> ExecResult:
    """Runs `pred_sql`; if SQLite rejects it (not a timeout or a denial), retries its rewrites
    from other dialects and returns the first that runs, else the first failure."""
    box = sandbox or default_sandbox()
    first = box.execute(db_path, pred_sql, opts.timeout_s)
    if first.ok or not opts.transpile or first.kind not in ("syntax", "error"):
        return first
    for rewrite in sqlite_rewrites(pred_sql):
        res = box.execute(db_path, rewrite, opts.timeout_s)
        if res.ok:
            return res
    return first


def score(completion: str, example: Mapping[str, object], sandbox: SQLSandbox | None = None) -> float:
    """The reward of `completion` (assistant_prefix + sampled text) for `example`, which holds
    `db_path`, `gold_sql`, optionally `alt_sql` (more accepted gold queries) and
    `reward_options` (see RewardOptions)."""
    opts = RewardOptions.from_dict(example.get("reward_options"))  # type: ignore[arg-type]
    sql = extract_sql(completion)
    if sql is None:
        return 0.0
    db_path = str(example["db_path"])
    pred = run_prediction(sql, db_path, opts, sandbox)
    if not pred.ok:
        return float(opts.format_credit) if parses_as_sqlite(sql) else 0.0
    golds = [str(example["gold_sql"]), *[str(s) for s in example.get("alt_sql") or ()]]  # type: ignore[union-attr]
    for gold_sql in golds:
        if results_match(pred, gold_result(db_path, gold_sql, opts.timeout_s, sandbox)):
            return 1.0
    return float(opts.execution_credit)
