"""jobs.smoke's config is a strict model: the file's keys and the overrides are checked alike."""

from __future__ import annotations

import pytest

from jobs.smoke import parse


def test_overrides_are_typed_and_a_wrong_key_names_the_allowed_ones(tmp_path):
    cfg = parse(["-", "steps=200", "step_s=1", "checkpoint.dir=/tmp/ck"])
    assert cfg["steps"] == 200 and cfg["step_s"] == 1.0 and cfg["checkpoint.dir"] == "/tmp/ck"
    with pytest.raises(SystemExit, match=r"stpes: Extra inputs.*allowed: steps, step_s"):
        parse(["-", "stpes=3"])
    config = tmp_path / "smoke.yaml"
    config.write_text("engines: 2\nengnes: 3\n")  # a typo in the file was ignored before
    with pytest.raises(SystemExit, match=r"engnes: Extra inputs.*allowed: .*engines"):
        parse([str(config)])
