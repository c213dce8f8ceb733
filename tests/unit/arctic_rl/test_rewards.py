"""Rewards scored in a process pool give what scoring one by one gives (text2sql's bundled mini set, real
SQL execution in its sandbox)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import recipes.text2sql as text2sql
from arctic_rl.rewards import score_all, score_one


def _completions(examples):
    """Right, runs-but-wrong, does-not-run and no-SQL answers, for every example."""
    out = []
    for ex in examples:
        prefix = ex.get("assistant_prefix", "")
        gold = text2sql.sft_completion(ex)
        out += [
            (prefix + gold if gold else prefix + " 1", ex),
            (prefix + "```sql\nSELECT 1\n```", ex),
            (prefix + "```sql\nSELECT nope FROM nowhere\n```", ex),
            (prefix + "no idea", ex),
        ]
    return out


def test_parallel_scores_equal_serial():
    examples = text2sql.load_examples("train", schema_tables="relevant", num_shots=0, limit=6, timeout_s=10.0)
    pairs = _completions(examples)
    completions, exs = [c for c, _ in pairs], [e for _, e in pairs]
    serial = [float(text2sql.reward(c, e)) for c, e in pairs]
    assert max(serial) == 1.0 and min(serial) < max(serial)  # the set has both right and wrong answers
    assert score_all(text2sql.reward, completions, exs, workers=2) == serial
    with ThreadPoolExecutor(4) as threads:  # verl's reward loop: one compute_score call per thread
        assert list(threads.map(lambda p: score_one(text2sql.reward, *p), pairs)) == serial


def test_verl_compute_score_is_the_recipe_reward():
    import json

    from recipes.verl.reward_fn import compute_score

    ex = text2sql.load_examples("train", schema_tables="relevant", num_shots=0, limit=1)[0]
    gold = ex.get("assistant_prefix", "") + text2sql.sft_completion(ex)
    info = {"recipe": "text2sql", "example": json.dumps({k: v for k, v in ex.items() if k != "messages"})}
    assert compute_score("arctic_rl/text2sql", gold, None, info) == text2sql.reward(gold, ex) == 1.0


def test_threads_scoring_at_once_share_one_pool():
    """SkyRL's generator scores each batch from its own thread (asyncio.to_thread), many at once: they must share
    the process's one pool. Two-node SkyRL jobs kept 13 pool workers alive (700 MB each) where 2 CPUs allow 2:
    first calls racing to create the pool each made one and kept its workers, and pools were also made per
    batch size (min(CPUs, rows))."""
    import multiprocessing
    import threading

    from arctic_rl import rewards

    rewards.shutdown()
    start = threading.Barrier(8)

    def score(rows: int) -> list[float]:
        start.wait()
        return score_all(len, ["abc", "de", "f"][:rows], workers=3)

    with ThreadPoolExecutor(8) as threads:
        got = list(threads.map(score, [2, 3] * 4))
    assert got == [[3.0, 2.0], [3.0, 2.0, 1.0]] * 4
    assert list(rewards._pools) == [3] and len(multiprocessing.active_children()) == 3
    rewards.shutdown()
