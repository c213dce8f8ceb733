"""BIRD execution accuracy (evals/bird.py) on a tiny BIRD folder and a hand-written prediction
file whose EX is computed by hand below."""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

from evals import bird  # noqa: E402

SEP = "\t----- bird -----\t"
DEV = [
    {
        "question_id": 10,
        "db_id": "zoo",
        "difficulty": "simple",
        "question": "How many animals?",
        "evidence": "",
        "SQL": "SELECT COUNT(*) FROM animal",
    },
    {
        "question_id": 11,
        "db_id": "zoo",
        "difficulty": "simple",
        "question": "Names of cats?",
        "evidence": "",
        "SQL": "SELECT name FROM animal WHERE species = 'cat'",
    },
    {
        "question_id": 12,
        "db_id": "zoo",
        "difficulty": "simple",
        "question": "Heaviest animal?",
        "evidence": "",
        "SQL": "SELECT name FROM animal ORDER BY weight DESC LIMIT 1",
    },
    {
        "question_id": 13,
        "db_id": "zoo",
        "difficulty": "moderate",
        "question": "Animals per species?",
        "evidence": "",
        "SQL": "SELECT species, COUNT(*) FROM animal GROUP BY species",
    },
    {
        "question_id": 14,
        "db_id": "zoo",
        "difficulty": "moderate",
        "question": "Total weight?",
        "evidence": "",
        "SQL": "SELECT SUM(weight) FROM animal",
    },
    {
        "question_id": 15,
        "db_id": "zoo",
        "difficulty": "challenging",
        "question": "Cats above mean weight?",
        "evidence": "",
        "SQL": "SELECT name FROM animal WHERE species = 'cat' AND weight > (SELECT AVG(weight) FROM animal)",
    },
]
# Hand-scored: simple 2/3 (10 right, 11 right in another row order with a duplicate, 12 wrong),
# moderate 1/2 (13 right with columns in the gold's order; 14 is a syntax error), challenging 0/1
# (15 has no prediction); total 3/6 = 50.00; simple 66.67, moderate 50.00, challenging 0.00.
PREDICTIONS = {
    "10": "SELECT count(id) FROM animal" + SEP + "zoo",
    "11": "SELECT name FROM animal WHERE species = 'cat' UNION ALL SELECT 'Tom'" + SEP + "zoo",
    "12": "SELECT name FROM animal ORDER BY weight ASC LIMIT 1" + SEP + "zoo",
    "13": "SELECT species, COUNT(*) FROM animal GROUP BY 1 ORDER BY 2" + SEP + "zoo",
    "14": "SELECT SUM(weight FROM animal" + SEP + "zoo",
}


@pytest.fixture()
def data(tmp_path: Path) -> Path:
    db = tmp_path / "bird" / "dev_databases" / "zoo" / "zoo.sqlite"
    db.parent.mkdir(parents=True)
    conn = sqlite3.connect(db)
    conn.executescript("""
        CREATE TABLE animal (id INTEGER PRIMARY KEY, name TEXT, species TEXT, weight REAL);
        INSERT INTO animal VALUES (1, 'Leo', 'cat', 190.5), (2, 'Tom', 'cat', 4.2), (3, 'Rex', 'dog', 30.0);
    """)
    conn.commit()
    conn.close()
    (tmp_path / "bird" / "dev.json").write_text(json.dumps(DEV))
    return tmp_path / "bird"


def test_ex_by_difficulty(data: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    preds = tmp_path / "predict_dev.json"
    preds.write_text(json.dumps(PREDICTIONS))
    out = tmp_path / "report.json"
    report = bird.main(
        ["--data", str(data), "--split", "dev", "--predictions", str(preds), "--out", str(out), "--num-workers", "1"]
    )
    assert report["ex"] == 50.0 and report["count"] == 6 and report["correct"] == 3
    by = report["by_difficulty"]
    assert by["simple"] == {"ex": 66.67, "count": 3, "correct": 2}
    assert by["moderate"] == {"ex": 50.0, "count": 2, "correct": 1}
    assert by["challenging"] == {"ex": 0.0, "count": 1, "correct": 0}
    assert report["missing"] == [15]
    assert report["results"] == {"10": True, "11": True, "12": False, "13": True, "14": False, "15": False}
    assert json.loads(out.read_text()) == report
    printed = capsys.readouterr().out
    assert "execution accuracy" in printed and "66.67" in printed and "50.00" in printed


def test_predictions_cannot_touch_the_database(data: Path, tmp_path: Path) -> None:
    db = data / "dev_databases" / "zoo" / "zoo.sqlite"
    before = db.read_bytes()
    preds = {"10": "DROP TABLE animal" + SEP + "zoo", "11": "DELETE FROM animal" + SEP + "zoo"}
    report = bird.evaluate(data, "dev", {int(k): (v.split(SEP)[0], "zoo") for k, v in preds.items()}, num_workers=1)
    assert report["correct"] == 0
    assert db.read_bytes() == before


def test_prediction_file_errors(data: Path, tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    path.write_text(json.dumps(["SELECT 1"]))
    with pytest.raises(ValueError, match="must hold a JSON object"):
        bird.parse_predictions(path)
    path.write_text(json.dumps({"ten": "SELECT 1" + SEP + "zoo"}))
    with pytest.raises(ValueError, match="key 'ten' is not a question_id"):
        bird.parse_predictions(path)
    path.write_text(json.dumps({"10": "SELECT 1" + SEP + "farm"}))
    with pytest.raises(ValueError, match="names db_id 'farm'"):
        bird.evaluate(data, "dev", bird.parse_predictions(path), num_workers=1)


def test_format_round_trip(tmp_path: Path) -> None:
    line = bird.format_prediction("SELECT a\nFROM t", "zoo")
    assert line == "SELECT a FROM t" + SEP + "zoo"
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"3": line}))
    assert bird.parse_predictions(path) == {3: ("SELECT a FROM t", "zoo")}
