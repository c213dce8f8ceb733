"""The synthetic multi-hop generator: reproducible, answers present verbatim, budgets kept."""

import json
import subprocess
import sys

import pytest
from repo_paths import REPO

from recipes import longqa
from recipes.longqa import data, synth
from recipes.longqa.prompts import whitespace_length
from recipes.longqa.reward import normalize_answer

ROOT = REPO


def _context_tokens(record):
    return synth._context_tokens([(t, s) for t, s in record["context"]], whitespace_length)


def test_same_seed_same_records_and_different_seed_different():
    a = synth.generate(12, seed=3, context_tokens=1200)
    assert a == synth.generate(12, seed=3, context_tokens=1200)
    assert a[:5] == synth.generate(5, seed=3, context_tokens=1200)  # example i does not depend on num
    assert a != synth.generate(12, seed=4, context_tokens=1200)


@pytest.mark.parametrize("filler", ["essays", "entities"])
@pytest.mark.parametrize("hops", [2, 3])
def test_answer_is_in_supporting_passages_and_budget_is_kept(filler, hops):
    budget = 1500
    for record in synth.generate(30, seed=7, context_tokens=budget, filler=filler, hops=hops):
        titles = [t for t, _ in record["context"]]
        assert len(titles) == len(set(titles))
        supporting = {t for t, _ in record["supporting_facts"]}
        assert supporting <= set(titles)
        evidence = " ".join("".join(s) for t, s in record["context"] if t in supporting)
        assert f" {normalize_answer(record['answer'])} " in f" {normalize_answer(evidence)} "
        for title, index in record["supporting_facts"]:
            sentences = dict((t, s) for t, s in record["context"])[title]
            assert 0 <= index < len(sentences)
        assert budget - 200 < _context_tokens(record) <= budget  # filled to within about one filler passage
        assert synth.QUESTION_TYPES[record["type"]] == hops
        assert record["wrong_answers"] and record["answer"] not in record["wrong_answers"]
        context_text = normalize_answer(" ".join("".join(s) for _, s in record["context"]))
        assert all(f" {normalize_answer(w)} " in f" {context_text} " for w in record["wrong_answers"])


def test_difficulty_knobs():
    easy = synth.make_example(
        0, seed=1, context_tokens=100_000, num_distractors=0, filler="essays", question_types=["bridge_birthplace"]
    )
    hard = synth.make_example(
        0, seed=1, context_tokens=100_000, num_distractors=6, filler="essays", question_types=["bridge_birthplace"]
    )

    def count(r):
        return sum("essay, part" not in t for t, _ in r["context"])

    # Two entity passages (company, founder) per chain; at least two chains for comparisons.
    assert count(easy) == 4 and count(hard) == 14
    assert "province" in synth.make_example(0, seed=1, context_tokens=800, hops=3)["question"]
    with pytest.raises(ValueError, match="hops"):
        synth.make_example(0, seed=1, context_tokens=800, hops=5)
    with pytest.raises(ValueError, match="question_types"):
        synth.make_example(0, seed=1, context_tokens=800, question_types=["trivia"])
    with pytest.raises(ValueError, match="filler"):
        synth.make_example(0, seed=1, context_tokens=800, filler="lorem")


def test_comparison_answer_is_the_earlier_one():
    for i in range(20):
        record = synth.make_example(i, seed=2, context_tokens=600, question_types=["comparison_founded"])
        years = {}
        for title, sentences in record["context"]:
            text = "".join(sentences)
            if " company founded in " in text:
                years[title] = int(text.split(" company founded in ")[1][:4])
        first, second = record["question"].removeprefix("Which company was founded earlier, ").rstrip("?").split(" or ")
        assert record["answer"] == min((first, second), key=years.__getitem__)


def test_cli_writes_a_hotpotqa_file_that_loads(tmp_path):
    args = [sys.executable, "-m", "recipes.longqa.synth", "--num", "6", "--context-tokens", "700", "--seed", "5"]
    for out in ("a", "b"):
        done = subprocess.run(
            args + ["--out", str(tmp_path / out)], cwd=ROOT, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stderr
        assert "wrote 6 questions" in done.stdout
    first, second = (tmp_path / "a" / "train.json").read_bytes(), (tmp_path / "b" / "train.json").read_bytes()
    assert first == second
    assert not [p for p in (tmp_path / "a").iterdir() if p.name != "train.json"]  # no temp file left
    examples = data.load_hotpotqa(tmp_path / "a" / "train.json", cache_dir=str(tmp_path / "cache"))
    records = json.loads(first)
    assert [ex.answers[0] for ex in examples] == [r["answer"] for r in records]
    assert [ex.wrong_answers for ex in examples] == [r["wrong_answers"] for r in records]


def test_default_recipe_is_synthetic_and_splits_differ():
    train = longqa.load_examples("train", num_examples=4, context_tokens=900)
    test = longqa.load_examples("test", num_examples=4, context_tokens=900)
    assert {ex["source"] for ex in train} == {"synthetic"}
    assert [ex["messages"] for ex in train] != [ex["messages"] for ex in test]
    for ex in train:
        prompt = ex["messages"][0]["content"]
        assert whitespace_length(prompt) < 900 + 120  # budget covers passages; the template adds ~80 tokens
        assert ex["answers"][0] in prompt
        assert longqa.reward(ex["answers"][0], ex) == 1.0
        assert longqa.reward(f"{ex['answers'][0]} or {ex['wrong_answers'][0]}", ex) == 0.0
    with pytest.raises(ValueError, match="split"):
        longqa.load_examples("holdout", num_examples=1)
