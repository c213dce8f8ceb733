"""Build the bundled BIRD-layout mini set (the embedded default's data), reproducibly.

    python -m recipes.text2sql.build_data --out DIR     # DIR defaults to the cache folder

writes, as BIRD lays out its dev and train sets:

    DIR/train.json  DIR/train_tables.json  DIR/train_databases/<db_id>/<db_id>.sqlite
    DIR/dev.json    DIR/dev_tables.json    DIR/dev_databases/<db_id>/<db_id>.sqlite
    DIR/MANIFEST.json   (fingerprint of the inputs, counts per split and difficulty)

The databases are built from packaged public data (`databases.py`), the questions come from
`mini_questions.py`. Every gold query (and alternative) is executed through the SQL sandbox; the
build fails on an error or an empty (or all-NULL) result. Everything is written to a temporary
folder beside DIR and renamed into place at the end, so DIR is either the old set or the new one.
Unlike BIRD, both splits use the same two databases (each split gets its own copy, hard-linked
where the file system allows), so dev measures new questions, not unseen schemas.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sqlite3
import sys
import time
from collections import Counter
from pathlib import Path

from filelock import FileLock
from tqdm import tqdm

from recipes.text2sql import databases, mini_questions
from recipes.text2sql.sandbox import SQLSandbox
from recipes.text2sql.schema import tables_in_sql

BUILD_VERSION = 1
SPLITS = ("train", "dev")
DIFFICULTIES = ("simple", "moderate", "challenging")
DEFAULT_CACHE_DIR = Path(os.environ.get("ARCTIC_RL_CACHE", Path.home() / ".cache" / "arctic-rl")) / "text2sql-mini"


def fingerprint() -> str:
    """Changes whenever the questions, the database builders or the build itself change."""
    h = hashlib.sha256(f"build v{BUILD_VERSION}".encode())
    for mod in (mini_questions, databases, sys.modules[__name__]):
        h.update(Path(mod.__file__ or "").read_bytes())
    return h.hexdigest()


def tables_json(db_id: str, db_path: Path) -> dict:
    """The Spider/BIRD `*_tables.json` entry of one database, read from the database itself."""
    conn = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
    try:
        tables = [
            r[0]
            for r in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY rowid"
            )
        ]
        columns: list[list] = [[-1, "*"]]
        types = ["text"]
        primary_keys: list = []
        index: dict[tuple[str, str], int] = {}
        for ti, t in enumerate(tables):
            info = conn.execute(f'PRAGMA table_info("{t}")').fetchall()
            pk = []
            for _, name, col_type, _, _, is_pk in info:
                index[(t.lower(), name.lower())] = len(columns)
                if is_pk:
                    pk.append(len(columns))
                columns.append([ti, name])
                types.append("number" if any(k in (col_type or "").upper() for k in ("INT", "REAL", "NUM")) else "text")
            if pk:
                primary_keys.append(pk[0] if len(pk) == 1 else pk)
        foreign_keys = []
        for t in tables:
            for fk in conn.execute(f'PRAGMA foreign_key_list("{t}")').fetchall():
                src, dst = index.get((t.lower(), fk[3].lower())), index.get((fk[2].lower(), (fk[4] or "").lower()))
                if src is not None and dst is not None:
                    foreign_keys.append([src, dst])
    finally:
        conn.close()
    return {
        "db_id": db_id,
        "table_names_original": tables,
        "table_names": [t.lower() for t in tables],
        "column_names_original": columns,
        "column_names": [[i, n.replace("_", " ").lower()] for i, n in columns],
        "column_types": types,
        "primary_keys": primary_keys,
        "foreign_keys": foreign_keys,
    }


def _link_or_copy(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _verify_gold(records: list[dict], db_root: Path, box: SQLSandbox) -> None:
    queries = [(r, sql) for r in records for sql in [r["SQL"], *r.get("alt_SQL", [])]]
    with tqdm(total=len(queries), desc=f"verify gold SQL ({db_root.name})", leave=False) as bar:
        results = box.execute_many(
            [(db_root / r["db_id"] / f"{r['db_id']}.sqlite", sql) for r, sql in queries],
            timeout_s=60.0,
            on_done=bar.update,
        )
    for (rec, sql), res in zip(queries, results):
        where = f"question_id {rec['question_id']} ({rec['db_id']}: {rec['question']!r})"
        if not res.ok:
            raise ValueError(f"gold SQL of {where} failed ({res.kind}): {res.error}\n  SQL: {sql}")
        if not any(v is not None for row in res.rows for v in row):
            raise ValueError(f"gold SQL of {where} returns no rows (or only NULLs)\n  SQL: {sql}")
        tables_in_sql(sql, db_root / rec["db_id"] / f"{rec['db_id']}.sqlite")  # sqlglot must read it


def _records(split: str) -> list[dict]:
    out = []
    for q in (q for q in mini_questions.QUESTIONS if q.split == split):
        if q.db_id not in databases.DATABASES:
            raise ValueError(f"question {q.question!r}: db_id {q.db_id!r} is not one of {sorted(databases.DATABASES)}")
        if q.difficulty not in DIFFICULTIES:
            raise ValueError(f"question {q.question!r}: difficulty {q.difficulty!r} is not one of {DIFFICULTIES}")
        rec = {
            "question_id": len(out),
            "db_id": q.db_id,
            "question": q.question,
            "evidence": q.evidence,
            "SQL": q.sql,
            "difficulty": q.difficulty,
        }
        if q.alt:
            rec["alt_SQL"] = list(q.alt)
        out.append(rec)
    return out


def build(out_dir: Path, num_workers: int = 2) -> dict:
    """Builds the mini set into `out_dir` (replacing it) and returns its manifest."""
    out_dir = Path(out_dir).resolve()
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_dir.parent / f".{out_dir.name}.building-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    start = time.monotonic()
    try:
        built = tmp / "_build"
        for db_id, builder in tqdm(databases.DATABASES.items(), desc="build databases", leave=False):
            builder(built / f"{db_id}.sqlite")
        manifest: dict = {"version": BUILD_VERSION, "fingerprint": fingerprint(), "databases": {}, "counts": {}}
        for db_id in databases.DATABASES:
            db = built / f"{db_id}.sqlite"
            manifest["databases"][db_id] = {
                "sha256": hashlib.sha256(db.read_bytes()).hexdigest(),
                "bytes": db.stat().st_size,
            }
        with SQLSandbox(num_workers=num_workers) as box:
            for split in SPLITS:
                records = _records(split)
                db_root = tmp / f"{split}_databases"
                used = sorted({r["db_id"] for r in records})
                for db_id in used:
                    _link_or_copy(built / f"{db_id}.sqlite", db_root / db_id / f"{db_id}.sqlite")
                _verify_gold(records, db_root, box)
                (tmp / f"{split}.json").write_text(json.dumps(records, indent=2, ensure_ascii=False) + "\n")
                tables = [tables_json(d, db_root / d / f"{d}.sqlite") for d in used]
                (tmp / f"{split}_tables.json").write_text(json.dumps(tables, indent=2) + "\n")
                manifest["counts"][split] = dict(Counter(r["difficulty"] for r in records))
        shutil.rmtree(built)
        (tmp / "MANIFEST.json").write_text(json.dumps(manifest, indent=2) + "\n")
        old = out_dir.parent / f".{out_dir.name}.old-{os.getpid()}"
        if out_dir.exists():
            out_dir.rename(old)
        tmp.rename(out_dir)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    counts = ", ".join(
        f"{s} {sum(c.values())} ({', '.join(f'{k} {v}' for k, v in c.items())})" for s, c in manifest["counts"].items()
    )
    print(
        f"[text2sql] built {len(manifest['databases'])} databases, {counts} in {out_dir} "
        f"({time.monotonic() - start:.1f}s)",
        file=sys.stderr,
    )
    return manifest


def ensure_mini_data(cache_dir: Path | str | None = None) -> Path:
    """The mini set's folder, built first if it is missing or older than the current inputs.
    Safe when several processes ask at once (a file lock serializes the build)."""
    out = Path(cache_dir).expanduser().resolve() if cache_dir else DEFAULT_CACHE_DIR
    out.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(out.parent / f".{out.name}.lock")):
        if _manifest_fingerprint(out) != fingerprint():
            build(out)
    return out


def _manifest_fingerprint(out: Path) -> str | None:
    try:
        return json.loads((out / "MANIFEST.json").read_text())["fingerprint"]
    except (OSError, ValueError, KeyError):
        return None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--out", type=Path, default=DEFAULT_CACHE_DIR, help=f"output folder (default {DEFAULT_CACHE_DIR})"
    )
    parser.add_argument("--num-workers", type=int, default=2, help="sandbox workers that verify the gold SQL")
    args = parser.parse_args(argv)
    build(args.out, num_workers=args.num_workers)


if __name__ == "__main__":
    main()
