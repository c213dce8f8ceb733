"""Answer extraction, normalization and scoring for multi-hop QA.

    >>> score("Let me think.\\nAnswer: the city of Velmora.", ["Velmora"])
    1.0
    >>> score("\\\\boxed{Paris, France}", ["Paris"], mode="f1")  # doctest: +ELLIPSIS
    0.66...

Normalization is the one of the official HotpotQA / LongBench scripts (lower case, drop
punctuation, drop the articles a/an/the, collapse whitespace); `unicode=True` (the reward's
default) also applies NFKC and drops every Unicode punctuation character, because sampled text
carries curly quotes and full-width forms the ASCII-only official rule keeps.
`evals.longbench` calls it with `unicode=False` so its numbers match LongBench's eval.py.

Substring matching credits a prediction only when the normalized gold occurs in it (LongBench's
direction): a part of the gold ("John" for "John Lennon") is not the answer. It also credits a
prediction that lists several names if one is the answer ("A was founded before B" for "which
came first, A or B?"), which GRPO learns to exploit. Three guards: containment is on whole words
(no reward for single letters); `wrong_answers` (the other candidates, e.g. the other company of a
comparison; the synthetic set records them) veto a prediction that names one of them; and a
yes/no gold has the other word as an implied wrong answer, so "yes or no" scores on neither.
Real sets carry no candidate list: there `mode="f1"` is the mode that penalizes long answers.
"""

from __future__ import annotations

import re
import string
import unicodedata
from collections import Counter
from collections.abc import Sequence
from typing import Literal

Mode = Literal["substring", "exact", "f1"]
MODES: tuple[str, ...] = ("substring", "exact", "f1")

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_ASCII_PUNCT = frozenset(string.punctuation)
# "Answer: X", "**Final answer:** X", "The answer is X" (a colon or "is" is required, so a line
# that starts "Answer the question ..." is not taken for an answer).
_ANSWER_LINE = re.compile(
    r"^[\s*_#>]*(?:the\s+)?(?:final\s+)?answer\s*(?:is\b\s*[:：]?|[:：])[\s*_]*(.*)$", re.IGNORECASE
)
_BOXED = "\\boxed{"
# A yes/no question's other answer, vetoed like a listed wrong candidate.
_OPPOSITE = {"yes": "no", "no": "yes"}


def normalize_answer(text: str, *, unicode: bool = True) -> str:
    """Lower-cases and strips punctuation, articles and extra whitespace (official order)."""
    if unicode:
        text = unicodedata.normalize("NFKC", text)
    text = text.lower()
    if unicode:
        text = "".join(ch for ch in text if ch not in _ASCII_PUNCT and not unicodedata.category(ch).startswith("P"))
    else:
        text = "".join(ch for ch in text if ch not in _ASCII_PUNCT)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def _last_boxed(text: str) -> str | None:
    """Content of the last balanced \\boxed{...}, or None."""
    start = text.rfind(_BOXED)
    while start != -1:
        depth, i = 1, start + len(_BOXED)
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth == 0:
            return text[start + len(_BOXED) : i - 1]
        start = text.rfind(_BOXED, 0, start)
    return None


def _strip_thinking(text: str) -> str:
    # Reasoning models answer after </think>; an unclosed <think> means the answer never came,
    # and a name mentioned while thinking must not earn reward.
    if "</think>" in text:
        return text.rsplit("</think>", 1)[1]
    if "<think>" in text:
        return ""
    return text


def extract_answer(completion: str) -> str:
    """The answer a completion commits to: the last \\boxed{...}, else the last final-answer line
    ("Answer: X"; when X is on the next line, that line), else the first non-empty line."""
    text = _strip_thinking(completion)
    boxed = _last_boxed(text)
    if boxed is not None:
        return boxed.strip()
    lines = [line.strip() for line in text.splitlines()]
    for i in range(len(lines) - 1, -1, -1):
        match = _ANSWER_LINE.match(lines[i])
        if match is None:
            continue
        found = match.group(1).strip()
        if found:
            return found
        following = [line for line in lines[i + 1 :] if line]
        if following:
            return following[0]
    non_empty = [line for line in lines if line]
    return non_empty[0] if non_empty else ""


def token_f1(prediction: str, ground_truth: str, *, unicode: bool = True) -> float:
    """Token-level F1 of the normalized strings (LongBench's qa_f1_score)."""
    pred_tokens = normalize_answer(prediction, unicode=unicode).split()
    truth_tokens = normalize_answer(ground_truth, unicode=unicode).split()
    num_same = sum((Counter(pred_tokens) & Counter(truth_tokens)).values())
    if num_same == 0:
        return 0.0
    precision = num_same / len(pred_tokens)
    recall = num_same / len(truth_tokens)
    return 2 * precision * recall / (precision + recall)


def _contains_words(outer: str, inner: str) -> bool:
    return bool(inner) and f" {inner} " in f" {outer} "


def names_wrong_answer(prediction: str, ground_truth: str, wrong_answers: Sequence[str]) -> bool:
    """Whether the prediction names a wrong candidate (one that is not itself part of the gold)."""
    pred, truth = normalize_answer(prediction), normalize_answer(ground_truth)
    for wrong in wrong_answers:
        norm = normalize_answer(wrong)
        if norm and not _contains_words(truth, norm) and _contains_words(pred, norm):
            return True
    return False


def match_score(prediction: str, ground_truth: str, mode: Mode = "substring") -> float:
    """Scores one extracted prediction against one gold answer."""
    if mode == "f1":
        return token_f1(prediction, ground_truth)
    pred, truth = normalize_answer(prediction), normalize_answer(ground_truth)
    if not pred or not truth:
        return 0.0
    if mode == "exact":
        return float(pred == truth)
    if mode == "substring":
        return float(_contains_words(pred, truth))
    raise ValueError(f"mode must be one of {MODES}, got {mode!r}")


def score(
    completion: str, answers: Sequence[str] | str, mode: Mode = "substring", wrong_answers: Sequence[str] = ()
) -> float:
    """Best score of the completion's extracted answer over the gold `answers`; in substring mode
    an answer that also names one of `wrong_answers` scores 0."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    gold = [answers] if isinstance(answers, str) else list(answers)
    if not gold:
        raise ValueError("answers must hold at least one gold answer, got []")
    prediction = extract_answer(completion)
    return max(
        0.0
        if mode == "substring" and names_wrong_answer(prediction, truth, _vetoes(truth, wrong_answers))
        else match_score(prediction, truth, mode)
        for truth in gold
    )


def _vetoes(truth: str, wrong_answers: Sequence[str]) -> list[str]:
    opposite = _OPPOSITE.get(normalize_answer(truth))
    return [*wrong_answers, opposite] if opposite else list(wrong_answers)
