"""GSM8K-style starter data: GSM8K's own jsonl format from a local path, or the small generated arithmetic set
shipped in recipes/verl/data (same format), converted to the parquet layout verl's RLHFDataset reads
(verl's examples/data_preprocess/gsm8k.py: data_source "openai/gsm8k", chat `prompt`, reward_model.ground_truth),
so verl's own GSM8K rule reward (verl.utils.reward_score.gsm8k) scores it.

    python -m recipes.verl.gsm8k --out runs/verl-data [--train path/train.jsonl --test path/test.jsonl]
"""

from __future__ import annotations

import argparse
import json
import random
import re
from pathlib import Path

DATA_DIR = Path(__file__).parent / "data"
INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
DATA_SOURCE = "openai/gsm8k"


def make_arithmetic(n: int, seed: int) -> list[dict]:
    """Word problems with GSM8K's answer format ('<reasoning>\\n#### <number>')."""
    rng = random.Random(seed)
    names = ["Ava", "Ben", "Cara", "Dev", "Eli", "Fay", "Gus", "Hana"]
    things = ["apples", "books", "coins", "pens", "stamps", "shells"]
    out = []
    for _ in range(n):
        who, what = rng.choice(names), rng.choice(things)
        a, b, c = rng.randint(2, 40), rng.randint(2, 20), rng.randint(1, 9)
        kind = rng.randrange(3)
        if kind == 0:
            q = f"{who} has {a} {what} and buys {b} more. How many {what} does {who} have now?"
            ans, work = a + b, f"{a} + {b} = <<{a}+{b}={a + b}>>{a + b}"
        elif kind == 1:
            a = a + b
            q = f"{who} has {a} {what} and gives away {b}. How many {what} are left?"
            ans, work = a - b, f"{a} - {b} = <<{a}-{b}={a - b}>>{a - b}"
        else:
            q = f"{who} buys {c} bags with {b} {what} in each bag. How many {what} is that in total?"
            ans, work = b * c, f"{c} * {b} = <<{c}*{b}={b * c}>>{b * c}"
        out.append({"question": q, "answer": f"{who} ends with {work} {what}.\n#### {ans}"})
    return out


def read_jsonl(path: Path) -> list[dict]:
    rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    for i, r in enumerate(rows):
        if "question" not in r or "answer" not in r or "####" not in r["answer"]:
            raise ValueError(f"{path}: row {i} is not GSM8K format (question, answer with '#### <n>'): {r}")
    return rows


def extract_solution(answer: str) -> str:
    return re.search(r"#### (\-?[0-9\.\,]+)", answer).group(1).replace(",", "")


def to_verl_rows(rows: list[dict], split: str) -> list[dict]:
    return [
        {
            "data_source": DATA_SOURCE,
            "prompt": [{"role": "user", "content": r["question"] + " " + INSTRUCTION}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": extract_solution(r["answer"])},
            "extra_info": {"split": split, "index": i, "answer": r["answer"], "question": r["question"]},
        }
        for i, r in enumerate(rows)
    ]


def write_parquet(rows: list[dict], path: Path) -> Path:
    import pandas as pd

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    pd.DataFrame(rows).to_parquet(tmp)
    tmp.replace(path)
    return path


def prepare(
    out: str | Path,
    train: str | Path | None = None,
    test: str | Path | None = None,
    max_train: int | None = None,
    max_test: int | None = None,
) -> tuple[Path, Path]:
    """Writes <out>/train.parquet and <out>/test.parquet; default input: the shipped arithmetic set."""
    out = Path(out)
    tr = read_jsonl(Path(train) if train else DATA_DIR / "arith_train.jsonl")[:max_train]
    te = read_jsonl(Path(test) if test else DATA_DIR / "arith_test.jsonl")[:max_test]
    return (
        write_parquet(to_verl_rows(tr, "train"), out / "train.parquet"),
        write_parquet(to_verl_rows(te, "test"), out / "test.parquet"),
    )


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="runs/verl-data")
    ap.add_argument("--train", help="GSM8K-format train jsonl (default: the shipped arithmetic set)")
    ap.add_argument("--test", help="GSM8K-format test jsonl")
    ap.add_argument("--regenerate", action="store_true", help="rewrite the shipped arithmetic set")
    a = ap.parse_args(argv)
    if a.regenerate:
        DATA_DIR.mkdir(exist_ok=True)
        for name, n, seed in (("arith_train.jsonl", 256, 0), ("arith_test.jsonl", 64, 1)):
            (DATA_DIR / name).write_text("".join(json.dumps(r) + "\n" for r in make_arithmetic(n, seed)))
    tr, te = prepare(a.out, a.train, a.test)
    print(f"verl GSM8K-format data: {tr} {te}")


if __name__ == "__main__":
    main()
