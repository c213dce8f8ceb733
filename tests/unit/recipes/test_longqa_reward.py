"""Answer extraction, normalization and scoring of the longqa reward, on hand-written cases."""

import pytest

from recipes import longqa
from recipes.longqa.reward import extract_answer, match_score, normalize_answer, score, token_f1


@pytest.mark.parametrize(
    "text, expected",
    [
        ("The  Beatles!", "beatles"),
        ("An apple a day", "apple day"),
        ("Theater of the Absurd", "theater of absurd"),  # articles only as whole words
        ("  New\tYork \n City ", "new york city"),
        ("1,000", "1000"),
        ("3.14", "314"),  # the official rule drops the decimal point too
        ("$5 (50%)", "5 50"),
        ("Nineteen-eighty", "nineteeneighty"),
        ("São Paulo", "são paulo"),  # accents are kept, as in the official scripts
        ("", ""),
    ],
)
def test_normalize_matches_official_rules(text, expected):
    assert normalize_answer(text) == expected
    assert normalize_answer(text, unicode=False) == expected


@pytest.mark.parametrize(
    "text, reward_form, official_form",
    [
        ("“Paris”", "paris", "“paris”"),  # curly quotes are not in string.punctuation
        ("Ｐａｒｉｓ", "paris", "ｐａｒｉｓ"),  # full-width letters fold under NFKC
        ("Paris…", "paris", "paris…"),
        ("ﬁve", "five", "ﬁve"),
    ],
)
def test_unicode_normalization_only_in_reward_form(text, reward_form, official_form):
    assert normalize_answer(text) == reward_form
    assert normalize_answer(text, unicode=False) == official_form


@pytest.mark.parametrize(
    "completion, expected",
    [
        ("\\boxed{Paris}", "Paris"),
        ("first \\boxed{Rome}, finally \\boxed{Paris}", "Paris"),
        ("\\boxed{f(x) = {1}}", "f(x) = {1}"),  # nested braces
        ("\\boxed{Paris} then a broken \\boxed{Lon", "Paris"),  # unbalanced last box is skipped
        ("Reasoning here.\nAnswer: Velmora", "Velmora"),
        ("Answer: Rome\nWait, no.\nAnswer: Velmora", "Velmora"),  # the last answer line
        ("**Final Answer:** Velmora", "Velmora"),
        ("So the answer is Velmora.", "So the answer is Velmora."),  # not at line start: first line
        ("The answer is Velmora.", "Velmora."),
        ("Answer:\n\nVelmora\nmore text", "Velmora"),  # answer on the next line
        ("Answer the question carefully\nParis", "Answer the question carefully"),  # not an answer line
        ("\n\nVelmora\nBecause the passage says so.", "Velmora"),
        ("<think>It could be Paris.</think>\nLondon", "London"),
        ("<think>It could be Paris, I think", ""),  # never finished thinking: no answer
        ("", ""),
    ],
)
def test_extract_answer(completion, expected):
    assert extract_answer(completion) == expected


@pytest.mark.parametrize(
    "completion, answers, expected",
    [
        ("Answer: the city of Velmora.", ["Velmora"], 1.0),  # gold inside the prediction
        ("Velmora", ["Velmora Province"], 0.0),  # a part of the gold is not the gold (LongBench's direction)
        ("Lorsen", ["Bram Lorsen"], 0.0),
        ("John", ["John Lennon"], 0.0),
        ("Answer: John Lennon of the Beatles", ["John Lennon"], 1.0),
        ("V", ["Velmora"], 0.0),  # whole words only: no reward for a letter
        ("ora", ["Velmora"], 0.0),
        ("Answer: a", ["A"], 0.0),  # both normalize to nothing
        ("", ["Paris"], 0.0),
        ("London", ["Paris", "City of Paris"], 0.0),
        ("Answer: City of Paris", ["Paris", "Lutetia"], 1.0),
        ("“Paris”", ["Paris"], 1.0),
        ("1,000 people", ["1000"], 1.0),
    ],
)
def test_substring_score(completion, answers, expected):
    assert score(completion, answers) == expected


def test_exact_and_f1_modes():
    assert score("Paris.", ["paris"], mode="exact") == 1.0
    assert score("Paris France", ["Paris"], mode="exact") == 0.0
    assert score("\\boxed{Paris, France}", ["Paris"], mode="f1") == pytest.approx(2 / 3)
    # Best answer wins: [he, kills, dragon] vs [he, killed, dragon] -> 2/3; vs [dragon, dies] -> 0.4.
    assert score("He kills the dragon.", ["He killed the dragon", "The dragon dies"], mode="f1") == pytest.approx(2 / 3)
    assert token_f1("", "Paris") == 0.0
    assert match_score("the", "the", mode="f1") == 0.0


def test_wrong_answers_veto_listing_several_candidates():
    wrong = ["Brightwater Foods"]
    listing = "Brightwater Foods was founded earlier, but Redwell Labs was bigger."
    assert score(listing, ["Redwell Labs"]) == 1.0  # the exploit the veto closes
    assert score(listing, ["Redwell Labs"], wrong_answers=wrong) == 0.0
    assert score("Redwell Labs", ["Redwell Labs"], wrong_answers=wrong) == 1.0
    # A wrong candidate that is part of the gold itself does not veto it.
    assert score("Velmora Province", ["Velmora Province"], wrong_answers=["Velmora"]) == 1.0
    # F1 already pays less for the listing; the veto is substring mode's.
    assert 0 < score(listing, ["Redwell Labs"], mode="f1", wrong_answers=wrong) < 1


@pytest.mark.parametrize("gold", ["yes", "no", "Yes.", "NO"])
def test_yes_or_no_hedge_scores_on_neither(gold):
    # Gold-in-prediction alone would credit "yes or no" on every yes/no question.
    assert score("Answer: yes or no", [gold]) == 0.0
    assert score("Answer: No, not yes.", [gold]) == 0.0
    assert score(f"Answer: {gold}", [gold]) == 1.0


def test_yes_no_gold_still_credits_a_plain_sentence():
    assert score("Answer: Yes, both were founded in 1990.", ["yes"]) == 1.0
    assert score("Answer: No, they were not.", ["no"]) == 1.0
    assert score("Answer: Yes.", ["no"]) == 0.0


def test_score_accepts_a_single_answer_string():
    assert score("Velmora", "Velmora") == 1.0


def test_bad_inputs_name_the_field():
    with pytest.raises(ValueError, match="mode"):
        score("x", ["x"], mode="fuzzy")
    with pytest.raises(ValueError, match="answers"):
        score("x", [])


def test_contract_reward_delegates_with_the_examples_mode():
    example = {"answers": ["Paris"], "reward_mode": "f1"}
    assert longqa.reward("Paris France", example) == pytest.approx(2 / 3)
    assert longqa.reward("Paris France", {"answers": ["Paris"]}) == 1.0
    assert longqa.reward("Paris or Lyon", {"answers": ["Paris"], "wrong_answers": ["Lyon"]}) == 0.0
