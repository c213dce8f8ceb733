"""Loaders for each source format, on the hand-written files in tests/data/longqa, and the prompts
built from them."""

import json

import pytest
from repo_paths import TESTS

from recipes import longqa
from recipes.longqa import data
from recipes.longqa.prompts import (
    LONGBENCH_PROMPTS,
    format_passages,
    select_passages,
    truncate_middle,
    whitespace_length,
)
from recipes.longqa.schema import Passage

DATA = TESTS / "data" / "longqa"


@pytest.fixture
def cache(tmp_path):
    return str(tmp_path / "hf_cache")  # keep the datasets cache out of the home folder


def test_hotpotqa_distractor(cache):
    bridge = data.load_hotpotqa(DATA / "hotpot_distractor.json", cache_dir=cache)[1]
    assert bridge.id == "5a8c7595554299585d9e36b6" and bridge.type == "bridge"
    assert bridge.answers == ["Chief of Protocol"]
    assert [p.title for p in bridge.passages if p.is_supporting] == ["Kiss and Tell (1945 film)", "Shirley Temple"]
    assert bridge.wrong_answers == []  # real HotpotQA has none
    # Sentences carry their leading space, as HotpotQA writes them.
    assert bridge.passages[2].text.endswith(
        "American actress and diplomat. She was named United States Ambassador "
        "to Ghana and to Czechoslovakia and also served as Chief of Protocol of "
        "the United States."
    )


def test_hotpotqa_fullwiki(cache):
    (ex,) = data.load_file("hotpotqa", DATA / "hotpot_fullwiki.json", cache_dir=cache)
    assert ex.answers == ["1999"] and len(ex.passages) == 2 and ex.passages[0].is_supporting


def test_hotpotqa_without_answer_is_refused(tmp_path, cache):
    record = json.loads((DATA / "hotpot_fullwiki.json").read_text())[0]
    del record["answer"]
    path = tmp_path / "test_fullwiki.json"
    path.write_text(json.dumps([record]))
    with pytest.raises(ValueError, match="'answer' is missing"):
        data.load_hotpotqa(path, cache_dir=cache)


def test_2wikimqa(cache):
    first, second = data.load_file("2wikimqa", DATA / "2wikimqa.json", cache_dir=cache)
    assert first.source == "2wikimqa" and first.answers == ["Małgorzata Braunek"]
    assert {p.title for p in first.passages if p.is_supporting} == {"Polish-Russian War (film)", "Xawery Żuławski"}
    assert second.type == "comparison" and second.answers == ["The Mask Of Fu Manchu"]


def test_musique_keeps_aliases_and_drops_unanswerable(cache):
    examples = data.load_file("musique", DATA / "musique.jsonl", cache_dir=cache)
    assert [ex.id for ex in examples] == ["2hop__13548_13529", "3hop1__9285_5188_23307"]
    assert examples[0].answers == ["Fort Lauderdale", "Fort Lauderdale, Florida", "Ft. Lauderdale"]
    assert [p.is_supporting for p in examples[0].passages] == [True, True, False]
    assert [ex.type for ex in examples] == ["2hop", "3hop1"]


def test_longbench_folder_and_file(cache):
    (ex,) = data.load_file("longbench", DATA / "longbench", task="hotpotqa", cache_dir=cache)
    assert ex.source == "longbench/hotpotqa" and ex.answers == ["Paris"] and ex.length == 30
    assert ex.context.startswith("Passage 1:\nEiffel Tower") and ex.all_classes is None
    two = data.load_file("longbench", DATA / "longbench" / "qasper.jsonl", task="qasper", cache_dir=cache)
    assert [e.answers for e in two] == [["BERT", "a BERT baseline"], ["unanswerable"]]


def test_longbench_errors_name_the_option():
    with pytest.raises(ValueError, match="task"):
        data.load_file("longbench", DATA / "longbench")
    with pytest.raises(ValueError, match="gov_report"):
        data.load_file("longbench", DATA / "longbench", task="gov_report")
    with pytest.raises(ValueError, match="data_format"):
        data.load_file("squad", DATA / "musique.jsonl")
    with pytest.raises(FileNotFoundError, match="nope.json"):
        data.load_file("hotpotqa", DATA / "nope.json")


def test_contract_examples_from_hotpotqa(cache):
    examples = longqa.load_examples(
        "dev", data_format="hotpotqa", data_path=str(DATA / "hotpot_distractor.json"), cache_dir=cache
    )
    ex = examples[0]
    assert ex["answers"] == ["yes"] and ex["reward_mode"] == "substring"
    (message,) = ex["messages"]
    prompt = message["content"]
    assert message["role"] == "user"
    assert prompt.startswith("Answer the question based on the given passages.")
    assert prompt.endswith("Question: Were Scott Derrickson and Ed Wood of the same nationality?\nAnswer:")
    assert "Passage 1:\nAdam Collis\nAdam Collis is an American filmmaker" in prompt
    assert longqa.reward("Yes.", ex) == 1.0


def test_budget_keeps_supporting_passages(cache):
    (ex, _) = longqa.load_examples(
        "dev",
        data_format="hotpotqa",
        data_path=str(DATA / "hotpot_distractor.json"),
        context_tokens=60,
        cache_dir=cache,
    )
    prompt = ex["messages"][0]["content"]
    assert "Scott Derrickson\n" in prompt and "Ed Wood\n" in prompt
    assert "Adam Collis" not in prompt and "Tyler Bates" not in prompt


def test_data_path_split_pattern_and_mapping(cache):
    pattern = str(DATA / "hotpot_{split}.json")
    assert len(longqa.load_examples("fullwiki", data_format="hotpotqa", data_path=pattern, cache_dir=cache)) == 1
    mapping = {"train": str(DATA / "2wikimqa.json")}
    assert len(longqa.load_examples("train", data_format="2wikimqa", data_path=mapping, cache_dir=cache)) == 2
    with pytest.raises(ValueError, match="no entry for split 'test'"):
        longqa.load_examples("test", data_format="2wikimqa", data_path=mapping)


def test_longbench_prompt_uses_its_template(cache):
    (ex,) = longqa.load_examples(
        "test", data_format="longbench", data_path=str(DATA / "longbench"), task="hotpotqa", cache_dir=cache
    )
    prompt = ex["messages"][0]["content"]
    context = (
        "Passage 1:\nEiffel Tower\nThe Eiffel Tower is a wrought-iron lattice tower in France.\nPassage 2:\n"
        "France\nThe capital of France is Paris; {braces} stay as written."
    )
    question = "Which city is the capital of the country where the Eiffel Tower stands?"
    assert prompt == LONGBENCH_PROMPTS["hotpotqa"].replace("{context}", context).replace("{input}", question)
    assert ex["length"] == 30


def test_boxed_style_and_options_are_checked(cache):
    (ex,) = longqa.load_examples(
        "test",
        data_format="longbench",
        data_path=str(DATA / "longbench"),
        task="hotpotqa",
        prompt_style="boxed",
        cache_dir=cache,
    )
    assert "\\boxed{answer}" in ex["messages"][0]["content"]
    with pytest.raises(ValueError, match="prompt_style"):
        longqa.load_examples("test", prompt_style="chatty")
    with pytest.raises(ValueError, match="unknown option"):
        longqa.load_examples("test", context_token=5)


def test_pad_from_pool_fills_the_budget(cache):
    path = str(DATA / "hotpot_distractor.json")
    plain = longqa.load_examples("dev", data_format="hotpotqa", data_path=path, cache_dir=cache)
    padded = longqa.load_examples(
        "dev", data_format="hotpotqa", data_path=path, context_tokens=400, pad_from_pool=True, cache_dir=cache
    )
    again = longqa.load_examples(
        "dev", data_format="hotpotqa", data_path=path, context_tokens=400, pad_from_pool=True, cache_dir=cache
    )
    assert padded == again  # seeded
    assert "Shirley Temple" in padded[0]["messages"][0]["content"]  # a passage of the other question
    assert len(padded[0]["messages"][0]["content"]) > len(plain[0]["messages"][0]["content"])


def test_select_passages_respects_budget_and_order():
    passages = [
        Passage("d1", "one two three " * 10),
        Passage("s1", "gold fact", True),
        Passage("d2", "four five"),
        Passage("s2", "second fact", True),
    ]
    # Costs add up per passage (each rounded up), so the budget is their sum.
    budget = sum(whitespace_length(format_passages([p])) for p in passages[1:])
    kept = select_passages(passages, budget)
    assert [p.title for p in kept] == ["s1", "d2", "s2"]
    assert [p.title for p in select_passages(passages, 1)] == ["s1", "s2"]  # evidence stays, even over budget
    assert select_passages(passages, None) == passages


def test_truncate_middle_keeps_both_ends():
    text = " ".join(f"w{i}" for i in range(300))
    cut = truncate_middle(text, 30)
    assert whitespace_length(cut) <= 30
    assert cut.startswith("w0 w1 ") and cut.endswith(" w298 w299")
    assert truncate_middle("short text", 30) == "short text"


class _CharTokenizer:
    """Stands in for an HF tokenizer: one token per character."""

    def encode(self, text, add_special_tokens=False):
        return [ord(c) for c in text]

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(i) for i in ids)


def test_truncate_middle_with_a_tokenizer_cuts_ids_like_pred_py():
    assert truncate_middle("abcdefghij", 4, tokenizer=_CharTokenizer()) == "abij"
