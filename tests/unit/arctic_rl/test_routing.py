"""The sampler router (arctic_rl.server.routing): a routing key stays on the replica it first went to (its
conversation's prefix cache is there), new keys go to the least-loaded replica, old keys are forgotten first."""

from __future__ import annotations

import pytest

from arctic_rl.server.routing import StickyRouter


def test_a_key_stays_on_its_replica_and_new_keys_balance():
    r = StickyRouter(2)
    first = r.assign(["a", "b", "c", "d"], [100, 100, 100, 100])
    assert first == [0, 1, 0, 1]  # least load in this request, ties to the replica holding fewer keys
    # Turn 2: the same conversations in another order, longer prompts, and a new one.
    again = r.assign(["d", "c", "b", "a", "e"], [300, 300, 300, 300, 50])
    assert again[:4] == [1, 0, 1, 0]
    assert again[4] in (0, 1)


def test_new_keys_go_where_the_work_is_least():
    r = StickyRouter(3)
    assert r.assign(["big"], [1000]) == [0]
    out = r.assign(["big", "x", "y", "z"], [1000, 10, 10, 10])
    assert out[0] == 0 and sorted(out[1:3]) == [1, 2] and out[3] in (1, 2)  # nothing new on the busy replica


def test_the_least_recently_used_keys_are_forgotten():
    r = StickyRouter(2, max_keys=2)
    r.assign(["a", "b"], [1, 1])
    r.assign(["a"], [1])  # a is used again: b is now the oldest
    r.assign(["c"], [1])
    assert list(r.table) == ["a", "c"] and sum(r.held) == 2


def test_bad_arguments():
    with pytest.raises(ValueError, match="num_replicas"):
        StickyRouter(0)
    with pytest.raises(ValueError, match="2 routing keys for 1 prompts"):
        StickyRouter(2).assign(["a", "b"], [1])
