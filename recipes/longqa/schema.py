"""The internal example every loader produces, whatever the source format."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Passage:
    title: str
    text: str
    is_supporting: bool = False


@dataclass(slots=True)
class QAExample:
    """One question. Multi-document sources fill `passages`; LongBench gives one finished
    `context` string instead (its passages are already laid out and cannot be re-selected)."""

    id: str
    source: str  # "hotpotqa", "2wikimqa", "musique", "longbench/<task>", "synthetic"
    question: str
    answers: list[str]
    passages: list[Passage] = field(default_factory=list)
    context: str | None = None
    type: str = ""  # "bridge", "comparison", ... where the source says
    length: int | None = None  # LongBench's word count, for its length buckets
    all_classes: list[str] | None = None
    # Candidates that must not appear in the answer (the other side of a comparison, the
    # confounders' values); only the synthetic set records them.
    wrong_answers: list[str] = field(default_factory=list)
