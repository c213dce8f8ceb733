"""The multi-turn text-to-SQL environment (`env.name: text2sql`), SkyRL-SQL's shape sized for small models.

Each model turn is one query in the prompt's answer format (a ```sql block; with `prefill`, the turn opens
with "```sql\\nSELECT"). The environment runs it in the recipe's sandbox (read-only, time- and row-limited:
sandbox.py) and shows the result as the next message: the first `max_rows` rows, each value and the whole
text cut to `max_chars`, or the error. The model then writes the query again to submit it, or a corrected
one. The episode ends when a turn repeats the previous query (submitted), has no query, or is the
`max_queries`-th; its reward is the recipe's single-turn reward (execution match, reward.py) of the last
query written, so a conversation is scored exactly as a single answer would be.

Nothing the model runs can change a database: the sandbox opens it read-only and its authorizer refuses
writes, ATTACH and PRAGMA (tests/unit/recipes/test_text2sql_env.py checks the file's bytes after a
conversation of destructive queries).
"""

from __future__ import annotations

import re

from arctic_rl.envs import Step, register_env
from recipes.text2sql.extract import extract_sql
from recipes.text2sql.reward import RewardOptions, run_prediction, score
from recipes.text2sql.sandbox import ExecResult, SQLSandbox, default_sandbox

RESUBMIT = "Write the same query again to submit it as your answer, or a corrected query."


def _same(a: str, b: str) -> bool:
    return re.sub(r"\s+", " ", a).strip().rstrip(";").lower() == re.sub(r"\s+", " ", b).strip().rstrip(";").lower()


def render_result(res: ExecResult, max_rows: int, max_chars: int) -> str:
    """What the model is shown of a query's outcome: rows or the error, never more than max_chars."""
    if not res.ok:
        text = f"Error ({res.kind}): {res.error}"
    else:
        shown = res.rows[:max_rows]
        lines = [", ".join(str(v)[:max_chars] for v in row) for row in shown]
        more = f" (first {len(shown)} shown)" if len(res.rows) > len(shown) else ""
        text = f"Result: {len(res.rows)} row(s){more}\n" + "\n".join(lines)
    return text[:max_chars]


@register_env("text2sql")
class SQLEnv:
    """One conversation over one question's database; options are the run config's env.options."""

    def __init__(
        self, max_queries: int = 3, max_rows: int = 5, max_chars: int = 400, sandbox: SQLSandbox | None = None
    ):
        for name, v in (("max_queries", max_queries), ("max_rows", max_rows), ("max_chars", max_chars)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"env.options.{name} must be an integer >= 1, got {v!r}")
        self.max_queries, self.max_rows, self.max_chars = max_queries, max_rows, max_chars
        self.sandbox = sandbox

    def reset(self, example: dict) -> None:
        self.example, self.queries = example, 0
        self.last: tuple[str, str] | None = None  # the last query run and the turn that wrote it

    def step(self, turn: str) -> Step:
        sql = extract_sql(turn)
        if sql is None or (self.last is not None and _same(sql, self.last[0])) or self.queries + 1 >= self.max_queries:
            final = turn if sql is not None else (self.last[1] if self.last else turn)
            return Step(done=True, reward=score(final, self.example, self.sandbox))
        self.queries += 1
        self.last = (sql, turn)
        opts = RewardOptions.from_dict(self.example.get("reward_options"))
        res = run_prediction(sql, str(self.example["db_path"]), opts, self.sandbox or default_sandbox())
        return Step(observation=f"{render_result(res, self.max_rows, self.max_chars)}\n\n{RESUBMIT}")
