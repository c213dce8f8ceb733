"""BIRD-layout loading, prompt building and the recipe contract (recipes.text2sql), on a tiny
hand-made BIRD folder (fast; the bundled mini set is tested in test_text2sql_build.py)."""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

from recipes import text2sql  # noqa: E402
from recipes.text2sql.data import load_bird_split  # noqa: E402
from recipes.text2sql.prompt import PREFILL  # noqa: E402
from recipes.text2sql.schema import schema_prompt, tables_in_sql  # noqa: E402

QUESTIONS = [
    {
        "question_id": 0,
        "db_id": "zoo",
        "question": "How many animals are there?",
        "evidence": "",
        "SQL": "SELECT COUNT(*) FROM animal",
        "difficulty": "simple",
    },
    {
        "question_id": 1,
        "db_id": "zoo",
        "question": "Which keeper looks after Leo?",
        "evidence": "Leo is an animal name",
        "difficulty": "moderate",
        "SQL": "SELECT k.name FROM keeper AS k JOIN animal AS a ON a.keeper_id = k.id WHERE a.name = 'Leo'",
    },
    {
        "question_id": 2,
        "db_id": "zoo",
        "question": "List the names of the cats.",
        "evidence": "cats: species = 'cat'",
        "SQL": "SELECT name FROM animal WHERE species = 'cat'",
        "difficulty": "simple",
    },
]


def make_db(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path)
    conn.executescript("""
        CREATE TABLE keeper (id INTEGER PRIMARY KEY, name TEXT);
        CREATE TABLE animal (id INTEGER PRIMARY KEY, name TEXT, species TEXT,
                             keeper_id INTEGER REFERENCES keeper (id));
        CREATE TABLE ticket (id INTEGER PRIMARY KEY, price REAL);
        INSERT INTO keeper VALUES (1, 'Ann'), (2, 'Bob');
        INSERT INTO animal VALUES (1, 'Leo', 'cat', 1), (2, 'Tom', 'cat', 2), (3, 'Rex', 'dog', 2);
        INSERT INTO ticket VALUES (1, 9.5);
    """)
    conn.commit()
    conn.close()


def make_bird(root: Path, nested: bool = False, with_tables: bool = True) -> Path:
    for split in ("train", "dev"):
        base = root / split if nested else root
        base.mkdir(parents=True, exist_ok=True)
        (base / f"{split}.json").write_text(json.dumps(QUESTIONS))
        make_db(base / f"{split}_databases" / "zoo" / "zoo.sqlite")
        if with_tables:
            (base / f"{split}_tables.json").write_text(json.dumps([{"db_id": "zoo"}]))
    return root


@pytest.fixture()
def bird(tmp_path: Path) -> Path:
    return make_bird(tmp_path / "bird")


def test_load_flat_layout(bird: Path) -> None:
    split = load_bird_split(bird, "dev")
    assert [r["question_id"] for r in split.records] == [0, 1, 2]
    assert split.records[1]["evidence"] == "Leo is an animal name"
    assert split.db_path("zoo") == bird / "dev_databases" / "zoo" / "zoo.sqlite"
    assert split.tables_file == bird / "dev_tables.json"


def test_load_nested_layout_and_bird_train_fields(tmp_path: Path) -> None:
    root = make_bird(tmp_path / "bird", nested=True, with_tables=False)
    # BIRD's train.json has no question_id and no difficulty.
    rows = [{k: v for k, v in q.items() if k not in ("question_id", "difficulty")} for q in QUESTIONS]
    (root / "train" / "train.json").write_text(json.dumps(rows))
    split = load_bird_split(root, "train")
    assert [r["question_id"] for r in split.records] == [0, 1, 2]
    assert {r["difficulty"] for r in split.records} == {"unknown"}
    assert split.tables_file is None


def test_missing_questions_file_is_named(bird: Path) -> None:
    (bird / "dev.json").unlink()
    with pytest.raises(FileNotFoundError, match=r"incomplete: no dev\.json .*dev\.json"):
        load_bird_split(bird, "dev")


def test_missing_databases_folder_is_named(bird: Path) -> None:
    (bird / "dev_databases" / "zoo" / "zoo.sqlite").unlink()
    (bird / "dev_databases" / "zoo").rmdir()
    (bird / "dev_databases").rmdir()
    with pytest.raises(FileNotFoundError, match="no dev_databases/"):
        load_bird_split(bird, "dev")


def test_missing_database_file_is_named(bird: Path) -> None:
    (bird / "dev_databases" / "zoo" / "zoo.sqlite").unlink()
    with pytest.raises(FileNotFoundError, match=r"db_id 'zoo' but .*zoo\.sqlite does not exist"):
        load_bird_split(bird, "dev")


def test_missing_data_folder_and_bad_rows(tmp_path: Path, bird: Path) -> None:
    with pytest.raises(FileNotFoundError, match="BIRD data folder not found"):
        load_bird_split(tmp_path / "nowhere", "dev")
    (bird / "dev.json").write_text(json.dumps([{"db_id": "zoo", "question": "q?"}]))
    with pytest.raises(ValueError, match=r"row 0 has no valid 'SQL'"):
        load_bird_split(bird, "dev")
    (bird / "dev_tables.json").write_text(json.dumps([{"db_id": "other"}]))
    (bird / "dev.json").write_text(json.dumps(QUESTIONS))
    with pytest.raises(ValueError, match=r"no entry for db_id\(s\) \['zoo'\]"):
        load_bird_split(bird, "dev")


def test_schema_prompt_and_relevant_tables(bird: Path) -> None:
    db = bird / "dev_databases" / "zoo" / "zoo.sqlite"
    text = schema_prompt(db)
    assert text.count("CREATE TABLE") == 3
    assert "name TEXT, -- e.g. 'Leo', 'Tom', 'Rex'" in text
    assert "FOREIGN KEY (keeper_id) REFERENCES keeper (id)" in text
    assert tables_in_sql(QUESTIONS[1]["SQL"], db) == ["keeper", "animal"]
    assert tables_in_sql("WITH c AS (SELECT * FROM ANIMAL) SELECT * FROM c", db) == ["animal"]
    with pytest.raises(ValueError, match=r"tables \['zebra'\]"):
        tables_in_sql("SELECT * FROM zebra", db)


def test_load_examples_defaults(bird: Path) -> None:
    examples = text2sql.load_examples("dev", data_dir=str(bird))
    ex = examples[1]
    assert [m["role"] for m in ex["messages"]] == ["system", "user"]
    assert "<think>" in ex["messages"][0]["content"]
    user = ex["messages"][-1]["content"]
    assert user.count("CREATE TABLE") == 3  # schema_tables: all
    assert "Evidence: Leo is an animal name" in user and user.endswith("Question: Which keeper looks after Leo?")
    assert "assistant_prefix" not in ex
    assert ex["gold_sql"] == QUESTIONS[1]["SQL"] and ex["db_id"] == "zoo" and ex["difficulty"] == "moderate"
    assert Path(ex["db_path"]).is_file()
    assert "Evidence" not in examples[0]["messages"][-1]["content"]  # empty evidence is left out


def test_load_examples_small_model_options(bird: Path) -> None:
    examples = text2sql.load_examples(
        "dev", data_dir=str(bird), schema_tables="relevant", num_shots=2, prefill=True, num_values=1
    )
    ex = examples[1]
    assert ex["assistant_prefix"] == PREFILL == "```sql\nSELECT"
    roles = [m["role"] for m in ex["messages"]]
    assert roles == ["system", "user", "assistant", "user", "assistant", "user"]
    question_turn = ex["messages"][-1]["content"]
    assert "CREATE TABLE keeper" in question_turn and "CREATE TABLE animal" in question_turn
    assert "CREATE TABLE ticket" not in question_turn  # pruned to the gold SQL's tables
    shots = [m["content"] for m in ex["messages"][2:-1:2]]
    assert all(s.startswith("```sql\n") and s.endswith("\n```") for s in shots)
    assert QUESTIONS[1]["SQL"] not in shots[0] + shots[1]  # a question is never its own shot
    # The same shots on every call.
    again = text2sql.load_examples(
        "dev", data_dir=str(bird), schema_tables="relevant", num_shots=2, prefill=True, num_values=1
    )
    assert again[1]["messages"] == ex["messages"]
    # The gold SQL, answered in the pre-filled format, scores 1.
    completion = ex["assistant_prefix"] + ex["gold_sql"][len("SELECT") :] + "\n"
    assert text2sql.reward(completion, ex) == 1.0
    assert text2sql.reward(ex["assistant_prefix"] + " name FROM keeper\n", ex) == pytest.approx(0.1)


def test_load_examples_think_shots_filters_and_reward_options(bird: Path) -> None:
    examples = text2sql.load_examples(
        "dev", data_dir=str(bird), num_shots=1, difficulties=["simple"], limit=1, execution_credit=0.3
    )
    assert len(examples) == 1 and examples[0]["difficulty"] == "simple"
    shot_answer = examples[0]["messages"][2]["content"]
    assert shot_answer.startswith("<think>\n") and "\n</think>\n```sql\n" in shot_answer
    assert examples[0]["reward_options"]["execution_credit"] == 0.3


@pytest.mark.parametrize(
    "options, message",
    [
        ({"schema_tables": "some"}, "schema_tables must be one of"),
        ({"num_shots": -1}, "num_shots must be an integer >= 0"),
        ({"prefill": "yes"}, "prefill must be true or false"),
        ({"limit": 0}, "limit must be an integer >= 1"),
        ({"difficulties": "simple"}, "difficulties must be a list"),
        ({"shots": 2}, r"unknown text2sql recipe option\(s\) \['shots'\]"),
        ({"execution_credit": 2.0}, "execution_credit must be in"),
    ],
)
def test_bad_options_are_named(bird: Path, options: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        text2sql.load_examples("dev", data_dir=str(bird), **options)


def test_shots_need_the_train_split(bird: Path) -> None:
    (bird / "train.json").unlink()
    assert text2sql.load_examples("dev", data_dir=str(bird))  # no shots: train is not needed
    with pytest.raises(FileNotFoundError, match="no train.json"):
        text2sql.load_examples("dev", data_dir=str(bird), num_shots=1)
