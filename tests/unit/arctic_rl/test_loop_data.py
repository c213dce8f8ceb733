"""Prompts the sampler cannot take are left out of the train data before the run, with a count (as verl's
filter_overlong_prompts), instead of failing the step that draws one."""

from __future__ import annotations

from tiny_models import make_tokenizer

from arctic_rl.loop.data import fit_window, prompt_ids


def test_prompts_at_or_past_the_window_are_left_out(tmp_path):
    tok = make_tokenizer(tmp_path / "tok")
    short = {"messages": [{"role": "user", "content": "how many albums"}]}
    long = {"messages": [{"role": "user", "content": "select count(*) from tracks " * 40}]}
    n_short, n_long = len(prompt_ids(tok, short)), len(prompt_ids(tok, long))
    assert n_short < n_long
    kept, dropped = fit_window([short, long, short], tok, n_long)  # a prompt must be shorter than the window
    assert kept == [short, short] and dropped == 1
    assert fit_window([short, long], tok, n_long + 1) == ([short, long], 0)
    assert fit_window([long], tok, None) == ([long], 0)  # no window known: vLLM enforces the model's own
