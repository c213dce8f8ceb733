"""The multi-turn text-to-SQL environment (recipes/text2sql/env.py), driven by scripted model turns: each query
is run and its rows shown, a repeated query submits it, the max_queries-th turn is the answer, the reward is
the single-turn reward of the last query; and the destructive corpus of the sandbox's tests, issued mid-
conversation, changes no byte of the database."""

from __future__ import annotations

import hashlib
import sqlite3
import sys
from pathlib import Path

import pytest

from arctic_rl.envs import make_env
from arctic_rl.errors import ConfigError
from recipes.text2sql import env as sql_env
from recipes.text2sql.sandbox import ExecResult, SQLSandbox

sys.path.insert(0, str(Path(__file__).parent))
from test_text2sql_reward import DESTRUCTIVE  # noqa: E402

PREFIX = "```sql\nSELECT"
GOLD = "SELECT name FROM item WHERE color = 'blue'"


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "shop" / "shop.sqlite"
    path.parent.mkdir()
    conn = sqlite3.connect(path)
    conn.executescript(
        "CREATE TABLE item (id INTEGER PRIMARY KEY, name TEXT, price REAL, color TEXT);"
        "INSERT INTO item VALUES (1, 'pen', 1.5, 'blue'), (2, 'cup', 4.0, 'red'), (3, 'ink', 0.1, 'blue');"
    )
    conn.commit()
    conn.close()
    return path


@pytest.fixture(scope="module")
def box():
    with SQLSandbox(num_workers=1) as b:
        yield b


def example(db: Path) -> dict:
    opts = {"execution_credit": 0.1, "format_credit": 0.0, "timeout_s": 5.0, "transpile": True}
    return {"db_path": str(db), "gold_sql": GOLD, "alt_sql": [], "reward_options": opts, "assistant_prefix": PREFIX}


def turn(body: str) -> str:
    """A model turn as the environment reads it: the pre-filled opening plus the sampled text."""
    return f"{PREFIX} {body}\n```"


def play(env, ex: dict, turns: list[str]):
    env.reset(ex)
    steps = []
    for t in turns:
        steps.append(env.step(t))
        if steps[-1].done:
            break
    return steps


def test_each_query_is_run_and_shown_and_a_repeat_submits_it(db: Path, box) -> None:
    env = sql_env.SQLEnv(max_queries=5, sandbox=box)
    blue = "name FROM item WHERE color = 'blue'"
    steps = play(
        env, example(db), [turn("name FROM item"), turn(blue), turn("name\n FROM  item WHERE color = 'blue';")]
    )
    assert [s.done for s in steps] == [False, False, True]  # turn 3 repeats turn 2 (up to spacing): submitted
    assert steps[0].observation.startswith("Result: 3 row(s)\npen\ncup\nink")
    assert "Write the same query again" in steps[0].observation
    assert steps[1].observation.startswith("Result: 2 row(s)\npen\nink")
    assert steps[2].reward == 1.0


def test_the_last_allowed_query_is_the_answer_and_scored_as_one(db: Path, box) -> None:
    env = sql_env.SQLEnv(max_queries=2, sandbox=box)
    steps = play(env, example(db), [turn("name FROM item WHERE color = 'blue'"), turn("name FROM item")])
    assert [s.done for s in steps] == [False, True] and steps[1].reward == 0.1  # runs, wrong rows
    steps = play(env, example(db), [turn("nme FROM item"), turn("name FROM item WHERE color = 'blue'")])
    assert (
        steps[0].observation.startswith("Error (error): OperationalError: no such column: nme")
        and steps[1].reward == 1.0
    )


def test_a_turn_without_sql_submits_the_last_query(db: Path, box) -> None:
    env = sql_env.SQLEnv(max_queries=3, sandbox=box)
    steps = play(env, example(db), [turn("name FROM item WHERE color = 'blue'"), "I am done."])
    assert steps[1].done and steps[1].reward == 1.0
    assert play(env, example(db), ["no idea"])[0].reward == 0.0


def test_what_is_shown_is_bounded(db: Path) -> None:
    rows = tuple((i, "x" * 1000) for i in range(50))
    text = sql_env.render_result(ExecResult(True, rows), max_rows=5, max_chars=300)
    assert text.startswith("Result: 50 row(s) (first 5 shown)\n0, " + "x" * 10) and len(text) == 300
    assert sql_env.render_result(ExecResult(False, kind="denied", error="x" * 999), 5, 80) == (
        "Error (denied): " + "x" * 64
    )


def test_destructive_queries_mid_conversation_change_no_byte(db: Path, tmp_path: Path, box) -> None:
    other = tmp_path / "elsewhere" / "stolen.sqlite"
    other.parent.mkdir()
    before = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in db.parent.iterdir()}
    env = sql_env.SQLEnv(max_queries=len(DESTRUCTIVE) + 2, sandbox=box)
    env.reset(example(db))
    for sql in DESTRUCTIVE:
        step = env.step(f"```sql\n{sql.format(other=other)}\n```")
        assert not step.done and step.observation.startswith("Error ("), (sql, step)
    last = env.step(turn("name FROM item WHERE color = 'blue'"))
    assert last.observation.startswith("Result: 2 row(s)")  # the database still answers as before
    assert {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in db.parent.iterdir()} == before
    assert list(other.parent.iterdir()) == []


def test_the_environment_is_registered_and_its_options_checked(db: Path) -> None:
    assert isinstance(make_env("text2sql", {"max_queries": 2}), sql_env.SQLEnv)
    with pytest.raises(ValueError, match=r"env.options.max_queries must be an integer >= 1, got 0"):
        make_env("text2sql", {"max_queries": 0})
    with pytest.raises(ConfigError, match="env.options"):
        make_env("text2sql", {"max_querys": 2})
