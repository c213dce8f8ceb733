"""Which sampler replica serves a prompt. Prompts with a routing key (a conversation, or a prompt group of a
multi-turn step) go where that key went before, so each turn finds the conversation's earlier tokens in that
replica's prefix cache; a key seen for the first time goes to the replica with the least work, counting the
prompt tokens of this request and the conversations each replica already holds. Prompts without a key keep the
controller's contiguous slices (a prompt's n samples and its neighbours, which often share a prefix, together).
"""

from __future__ import annotations

from collections import OrderedDict

MAX_KEYS = 65536  # keys remembered; the least recently used go first (a conversation that long gone restarts cold)


class StickyRouter:
    def __init__(self, num_replicas: int, max_keys: int = MAX_KEYS):
        if num_replicas < 1:
            raise ValueError(f"num_replicas must be >= 1, got {num_replicas}")
        self.k, self.max_keys = num_replicas, max_keys
        self.table: OrderedDict[str, int] = OrderedDict()
        self.held = [0] * num_replicas  # keys each replica holds

    def assign(self, keys: list[str], weights: list[int]) -> list[int]:
        """The replica of each prompt (keys[i] its routing key, weights[i] its token count)."""
        if len(keys) != len(weights):
            raise ValueError(f"{len(keys)} routing keys for {len(weights)} prompts")
        load = [0] * self.k
        out = []
        for key, w in zip(keys, weights, strict=True):
            r = self.table.get(key)
            if r is None:
                r = min(range(self.k), key=lambda i: (load[i], self.held[i], i))
                self.table[key] = r
                self.held[r] += 1
                while len(self.table) > self.max_keys:
                    _, old = self.table.popitem(last=False)
                    self.held[old] -= 1
            else:
                self.table.move_to_end(key)
            load[r] += w
            out.append(r)
        return out
