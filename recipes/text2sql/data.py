"""Read a BIRD-layout data set: questions from `<split>.json`, databases from
`<split>_databases/<db_id>/<db_id>.sqlite`, optionally `<split>_tables.json`.

Both layouts of the official downloads are accepted: the files directly in DIR (as the dev set
unpacks, and as `build_data` writes) or in DIR/<split>/ (as the train set unpacks). Questions are
read with HF `datasets` (`load_dataset("json", ...)`, a local file: nothing is fetched).

Fields: `db_id`, `question`, `SQL` are required; `evidence` defaults to "", `question_id` to the
row's index (BIRD's train.json has none), `difficulty` to "unknown" (nor has it difficulties);
`alt_SQL` (a list of further accepted gold queries) is ours and optional.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

REQUIRED_FIELDS = ("db_id", "question", "SQL")


@dataclass(frozen=True)
class BirdSplit:
    split: str
    questions_file: Path
    db_root: Path
    tables_file: Path | None
    records: list[dict]

    def db_path(self, db_id: str) -> Path:
        return self.db_root / db_id / f"{db_id}.sqlite"


def _first_existing(candidates: list[Path], what: str, data_dir: Path) -> Path:
    for c in candidates:
        if c.exists():
            return c
    tried = ", ".join(str(c) for c in candidates)
    raise FileNotFoundError(f"BIRD layout in {data_dir} is incomplete: no {what} (looked for {tried})")


def _read_json_records(path: Path) -> list[dict]:
    # HF datasets reads JSON arrays and JSON lines alike; offline flags make sure a misread path
    # is never retried against the hub.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    from datasets import load_dataset

    try:
        ds = load_dataset("json", data_files=str(path), split="train")
    except Exception as e:  # datasets wraps parse errors in several types
        raise ValueError(f"cannot read questions from {path}: {type(e).__name__}: {e}") from e
    return ds.to_list()


def _normalize(rows: list[dict], path: Path) -> list[dict]:
    out = []
    for i, row in enumerate(rows):
        for field in REQUIRED_FIELDS:
            if not isinstance(row.get(field), str) or not row[field].strip():
                raise ValueError(f"{path}: row {i} has no valid {field!r} (got {row.get(field)!r})")
        qid = row.get("question_id")
        out.append(
            {
                "question_id": int(qid) if qid is not None else i,
                "db_id": row["db_id"],
                "question": row["question"].strip(),
                "evidence": (row.get("evidence") or "").strip(),
                "SQL": row["SQL"].strip(),
                "difficulty": row.get("difficulty") or "unknown",
                "alt_SQL": list(row.get("alt_SQL") or []),
            }
        )
    return out


def load_bird_split(data_dir: str | Path, split: str) -> BirdSplit:
    """Reads one split and checks that every database it names exists."""
    if not split or "/" in split:
        raise ValueError(f"split must be a plain name such as 'dev' or 'train', got {split!r}")
    data_dir = Path(data_dir).expanduser().resolve()
    if not data_dir.is_dir():
        raise FileNotFoundError(f"BIRD data folder not found: {data_dir}")
    roots = [data_dir, data_dir / split]
    questions_file = _first_existing([r / f"{split}.json" for r in roots], f"{split}.json", data_dir)
    db_root = _first_existing([r / f"{split}_databases" for r in roots], f"{split}_databases/", data_dir)
    tables = [r / f"{split}_tables.json" for r in roots if (r / f"{split}_tables.json").exists()]
    records = _normalize(_read_json_records(questions_file), questions_file)
    result = BirdSplit(split, questions_file, db_root, tables[0] if tables else None, records)
    _check_databases(result)
    return result


def _check_databases(s: BirdSplit) -> None:
    db_ids = sorted({r["db_id"] for r in s.records})
    for db_id in db_ids:
        path = s.db_path(db_id)
        if not path.is_file():
            raise FileNotFoundError(
                f"BIRD layout in {s.db_root.parent} is incomplete: {s.questions_file.name} "
                f"names db_id {db_id!r} but {path} does not exist"
            )
    if s.tables_file is not None:
        known = {t.get("db_id") for t in json.loads(s.tables_file.read_text(encoding="utf-8"))}
        missing = [d for d in db_ids if d not in known]
        if missing:
            raise ValueError(f"{s.tables_file} has no entry for db_id(s) {missing}")
