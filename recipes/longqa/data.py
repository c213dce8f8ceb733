"""Loaders: HotpotQA (distractor / fullwiki JSON), 2WikiMultihopQA (JSON), MuSiQue (jsonl) and
LongBench v1 (jsonl per task), read with HF `datasets` from local files into `QAExample`s.

Hub access is switched off here: every path is a local file, and a hub lookup would otherwise
retry for ~20 s before failing.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

from collections.abc import Callable, Iterable  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any

from recipes.longqa.schema import Passage, QAExample  # noqa: E402

Record = dict[str, Any]
FORMATS: tuple[str, ...] = ("hotpotqa", "2wikimqa", "musique", "longbench")
# Tasks whose LongBench files are English QA scored by token F1; other tasks need other metrics.
LONGBENCH_QA_TASKS: tuple[str, ...] = (
    "hotpotqa",
    "2wikimqa",
    "musique",
    "narrativeqa",
    "qasper",
    "multifieldqa_en",
    "triviaqa",
)


def read_records(path: str | Path, cache_dir: str | None = None) -> list[Record]:
    """Rows of a local .json (a list of objects) or .jsonl file, via `datasets`' json builder."""
    import datasets  # heavy; only loaders need it

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"data_path {str(path)!r} is not a file")
    datasets.disable_progress_bars()
    table = datasets.load_dataset("json", data_files=str(path), split="train", cache_dir=cache_dir)
    return [dict(row) for row in table]


def _require(record: Record, key: str, where: str) -> Any:
    value = record.get(key)
    if value is None or value == "":
        raise ValueError(f"{where}: field {key!r} is missing or empty (got {value!r})")
    return value


def _title_sentence_context(record: Record, where: str) -> list[Passage]:
    """HotpotQA / 2Wiki `context`: [[title, [sentence, ...]], ...]; support from `supporting_facts`."""
    supporting = {str(fact[0]) for fact in record.get("supporting_facts") or []}
    passages = []
    for i, entry in enumerate(_require(record, "context", where)):
        if not (isinstance(entry, (list, tuple)) and len(entry) == 2 and isinstance(entry[1], list)):
            raise ValueError(f"{where}: context[{i}] must be [title, [sentences]], got {entry!r}")
        title, sentences = str(entry[0]), entry[1]
        # HotpotQA sentences keep their leading space ("Paris. It is ..."); join without a separator.
        text = "".join(sentences).strip()
        passages.append(Passage(title=title, text=text, is_supporting=title in supporting))
    return passages


def from_hotpotqa_record(record: Record, index: int, source: str = "hotpotqa") -> QAExample:
    where = f"{source} example {index} (_id={record.get('_id')!r})"
    answer = record.get("answer")
    if answer is None or answer == "":
        raise ValueError(f"{where}: field 'answer' is missing (test sets carry none; use a dev or train file)")
    return QAExample(
        id=str(record.get("_id", index)),
        source=source,
        question=_require(record, "question", where),
        answers=[str(answer)],
        passages=_title_sentence_context(record, where),
        type=str(record.get("type") or ""),
        wrong_answers=[str(w) for w in record.get("wrong_answers") or []],
    )


def from_musique_record(record: Record, index: int) -> QAExample | None:
    """MuSiQue rows; unanswerable ones (MuSiQue-Full) have no gold answer and are dropped."""
    where = f"musique example {index} (id={record.get('id')!r})"
    if record.get("answerable") is False:
        return None
    answers = [str(_require(record, "answer", where))] + [str(a) for a in record.get("answer_aliases") or []]
    passages = [
        Passage(
            title=str(p.get("title", "")),
            text=str(_require(p, "paragraph_text", f"{where} paragraph {j}")),
            is_supporting=bool(p.get("is_supporting")),
        )
        for j, p in enumerate(_require(record, "paragraphs", where))
    ]
    hops = str(record.get("id", "")).split("_")[0]  # ids look like "2hop__123_456"
    return QAExample(
        id=str(record.get("id", index)),
        source="musique",
        question=_require(record, "question", where),
        answers=answers,
        passages=passages,
        type=hops if "hop" in hops else "",
    )


def from_longbench_record(record: Record, index: int, task: str) -> QAExample:
    where = f"longbench/{task} example {index} (_id={record.get('_id')!r})"
    answers = _require(record, "answers", where)
    if isinstance(answers, str) or not all(isinstance(a, str) for a in answers):
        raise ValueError(f"{where}: field 'answers' must be a list of strings, got {answers!r}")
    return QAExample(
        id=str(record.get("_id", index)),
        source=f"longbench/{task}",
        question=str(record.get("input") or ""),
        answers=list(answers),
        context=str(_require(record, "context", where)),
        length=record.get("length"),
        all_classes=record.get("all_classes"),
    )


def _convert(records: Iterable[Record], fn: Callable[[Record, int], QAExample | None]) -> list[QAExample]:
    return [ex for ex in (fn(r, i) for i, r in enumerate(records)) if ex is not None]


def load_hotpotqa(path: str | Path, *, source: str = "hotpotqa", cache_dir: str | None = None) -> list[QAExample]:
    """HotpotQA distractor or fullwiki JSON (and the synthetic files, which share the layout and
    add `wrong_answers`)."""
    return _convert(read_records(path, cache_dir), lambda r, i: from_hotpotqa_record(r, i, source))


def load_2wikimqa(path: str | Path, *, cache_dir: str | None = None) -> list[QAExample]:
    """2WikiMultihopQA JSON: HotpotQA's layout (plus `evidences`, unused)."""
    return load_hotpotqa(path, source="2wikimqa", cache_dir=cache_dir)


def load_musique(path: str | Path, *, cache_dir: str | None = None) -> list[QAExample]:
    return _convert(read_records(path, cache_dir), from_musique_record)


def longbench_file(path: str | Path, task: str) -> Path:
    """`path` is the task's .jsonl, or a folder holding `<task>.jsonl` (LongBench's data layout)."""
    path = Path(path)
    return path / f"{task}.jsonl" if path.is_dir() else path


def load_longbench(path: str | Path, task: str, *, cache_dir: str | None = None) -> list[QAExample]:
    if task not in LONGBENCH_QA_TASKS:
        raise ValueError(f"longbench task {task!r} is not supported; supported: {list(LONGBENCH_QA_TASKS)}")
    file = longbench_file(path, task)
    return _convert(read_records(file, cache_dir), lambda r, i: from_longbench_record(r, i, task))


def load_file(
    data_format: str, path: str | Path, *, task: str | None = None, cache_dir: str | None = None
) -> list[QAExample]:
    """One entry point for the recipe: dispatches on `data_format` (one of FORMATS)."""
    if data_format in ("hotpotqa", "synthetic"):
        return load_hotpotqa(path, source=data_format, cache_dir=cache_dir)
    if data_format == "2wikimqa":
        return load_2wikimqa(path, cache_dir=cache_dir)
    if data_format == "musique":
        return load_musique(path, cache_dir=cache_dir)
    if data_format == "longbench":
        if task is None:
            raise ValueError("data_format 'longbench' needs option 'task' (e.g. 'hotpotqa'), got None")
        return load_longbench(path, task, cache_dir=cache_dir)
    raise ValueError(f"data_format must be one of {FORMATS} or 'synthetic', got {data_format!r}")
