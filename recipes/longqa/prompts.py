"""Prompt text for long-context QA: LongBench v1's templates, passage formatting, and a context
builder that fills a token budget with supporting passages first, then distractors.

LongBench's templates and generation lengths are data (THUDM/LongBench, config/dataset2prompt.json
and dataset2maxlen.json), reproduced here for its English QA tasks.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence

from recipes.longqa.schema import Passage

LengthFn = Callable[[str], int]

_MULTIHOP = (
    "Answer the question based on the given passages. Only give me the answer and do not output any other words."
    "\n\nThe following are given passages.\n{context}\n\nAnswer the question based on the given passages. "
    "Only give me the answer and do not output any other words.\n\nQuestion: {input}\nAnswer:"
)
# Typos ("asconcisely") are LongBench's own; kept so scores stay comparable with published ones.
LONGBENCH_PROMPTS: dict[str, str] = {
    "hotpotqa": _MULTIHOP,
    "2wikimqa": _MULTIHOP,
    "musique": _MULTIHOP,
    "narrativeqa": (
        "You are given a story, which can be either a novel or a movie script, and a question. Answer the question "
        "asconcisely as you can, using a single phrase if possible. Do not provide any explanation.\n\nStory: "
        "{context}\n\nNow, answer the question based on the story asconcisely as you can, using a single phrase if "
        "possible. Do not provide any explanation.\n\nQuestion: {input}\n\nAnswer:"
    ),
    "qasper": (
        "You are given a scientific article and a question. Answer the question as concisely as you can, using a "
        "single phrase or sentence if possible. If the question cannot be answered based on the information in the "
        'article, write "unanswerable". If the question is a yes/no question, answer "yes", "no", or '
        '"unanswerable". Do not provide any explanation.\n\nArticle: {context}\n\n Answer the question based on '
        "the above article as concisely as you can, using a single phrase or sentence if possible. If the question "
        'cannot be answered based on the information in the article, write "unanswerable". If the question is a '
        'yes/no question, answer "yes", "no", or "unanswerable". Do not provide any explanation.\n\n'
        "Question: {input}\n\nAnswer:"
    ),
    "multifieldqa_en": (
        "Read the following text and answer briefly.\n\n{context}\n\nNow, answer the following question based on "
        "the above text, only give me the answer and do not output any other words.\n\nQuestion: {input}\nAnswer:"
    ),
    "triviaqa": (
        "Answer the question based on the given passage. Only give me the answer and do not output any other "
        "words. The following are some examples.\n\n{context}\n\n{input}"
    ),
}
# Maximum new tokens LongBench generates per task.
LONGBENCH_MAX_NEW_TOKENS: dict[str, int] = {
    "hotpotqa": 32,
    "2wikimqa": 32,
    "musique": 32,
    "narrativeqa": 128,
    "qasper": 128,
    "multifieldqa_en": 64,
    "triviaqa": 32,
}
# Tasks LongBench prompts without the chat template (few-shot continuation tasks).
LONGBENCH_NO_CHAT_TEMPLATE: frozenset[str] = frozenset({"trec", "triviaqa", "samsum", "lsht", "lcc", "repobench-p"})

# For reasoning models trained with long responses: think, then commit to one boxed answer.
BOXED_PROMPT = (
    "Answer the question based on the given passages.\n\nThe following are given passages.\n{context}\n\n"
    "Answer the question based on the given passages. Think step by step, then give the final answer, a short "
    "phrase taken from the passages, as \\boxed{{answer}}.\n\nQuestion: {input}"
)
PROMPT_STYLES: tuple[str, ...] = ("longbench", "boxed")


def whitespace_length(text: str) -> int:
    """Cheap token estimate: BPE tokenizers give about 4 tokens per 3 English words."""
    return math.ceil(len(text.split()) * 4 / 3)


def format_passages(passages: Sequence[Passage]) -> str:
    """LongBench's multi-document layout: 'Passage i:' then the title line, then the text."""
    return "\n".join(f"Passage {i}:\n{p.title}\n{p.text}" for i, p in enumerate(passages, start=1))


def select_passages(
    passages: Sequence[Passage], context_tokens: int | None, length_fn: LengthFn = whitespace_length
) -> list[Passage]:
    """All supporting passages, then distractors in their given order while the formatted context
    stays within `context_tokens` (None keeps all). Relative order is kept, so where the evidence
    sits is decided by the data, not by the budget. Costs are summed per passage (tokenizers are
    near-additive across the newline joins; the budget may be under-filled by about one token per
    passage), then an exact check trims the last distractors if the sum was optimistic."""
    if context_tokens is None:
        return list(passages)
    if context_tokens <= 0:
        raise ValueError(f"context_tokens must be positive, got {context_tokens}")
    costs = [length_fn(format_passages([p])) for p in passages]
    keep = [p.is_supporting for p in passages]
    total = sum(c for c, k in zip(costs, keep) if k)
    for i in range(len(passages)):
        if not keep[i] and total + costs[i] <= context_tokens:
            keep[i], total = True, total + costs[i]
    added = [i for i, p in enumerate(passages) if keep[i] and not p.is_supporting]
    while added and length_fn(format_passages([p for p, k in zip(passages, keep) if k])) > context_tokens:
        keep[added.pop()] = False
    return [p for p, k in zip(passages, keep) if k]


def fill_from_pool(
    selected: Sequence[Passage],
    pool: Sequence[Passage],
    context_tokens: int,
    rng: random.Random,
    length_fn: LengthFn = whitespace_length,
    max_misses: int = 8,
) -> list[Passage]:
    """Adds random passages of `pool` (other questions' passages) after `selected` until the
    budget is full (`max_misses` draws in a row that do not fit), then shuffles, so the evidence
    lands anywhere in the context. Draws lazily: the cost is about one length_fn call per passage
    added, not per pool entry."""
    out, titles = list(selected), {p.title for p in selected}
    total, misses = length_fn(format_passages(out)), 0
    for _ in range(len(pool) if pool else 0):
        if misses >= max_misses:
            break
        candidate = pool[rng.randrange(len(pool))]
        if candidate.title in titles:
            continue
        cost = length_fn(format_passages([candidate]))
        if total + cost > context_tokens:
            misses += 1
            continue
        out.append(Passage(candidate.title, candidate.text, is_supporting=False))
        titles.add(candidate.title)
        total, misses = total + cost, 0
    while len(out) > len(selected) and length_fn(format_passages(out)) > context_tokens:
        out.pop()
    rng.shuffle(out)
    return out


def truncate_middle(
    text: str, max_tokens: int, length_fn: LengthFn = whitespace_length, tokenizer: object | None = None
) -> str:
    """LongBench's truncation: keep the first and last halves, since instructions sit at both ends.
    With a tokenizer it cuts token ids exactly like LongBench's pred.py; else it cuts words."""
    if max_tokens <= 0:
        raise ValueError(f"max_tokens must be positive, got {max_tokens}")
    if tokenizer is not None:
        ids = tokenizer.encode(text, add_special_tokens=False)
        if len(ids) <= max_tokens:
            return text
        half = max_tokens // 2
        return tokenizer.decode(ids[:half], skip_special_tokens=True) + tokenizer.decode(
            ids[-half:], skip_special_tokens=True
        )
    if length_fn(text) <= max_tokens:
        return text
    words = text.split(" ")
    lo, hi = 0, len(words) // 2
    while lo < hi:  # largest half-width k whose head + tail fits
        k = (lo + hi + 1) // 2
        if length_fn(" ".join(words[:k] + words[-k:])) <= max_tokens:
            lo = k
        else:
            hi = k - 1
    return " ".join(words[:lo] + words[len(words) - lo :]) if lo else ""


def render(template: str, context: str, question: str) -> str:
    # format() parses only the template, so braces inside the context or question stay as they are.
    return template.format(context=context, input=question)
