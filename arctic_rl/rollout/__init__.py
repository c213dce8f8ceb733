"""The generation side of the reference loop: where a step's samples come from and which of them it trains on.

pipeline.py   rollouts in step (sync) or up to async.max_staleness policy versions ahead (async)
partial.py    the same look-ahead generated in chunks, weight syncs landing between them (partial rollouts)
dynamic.py    DAPO's dynamic sampling (groups without signal dropped, more drawn) and overlong handling
multiturn.py  conversations with an environment (arctic_rl.envs), one token sequence each, never re-tokenized
"""
