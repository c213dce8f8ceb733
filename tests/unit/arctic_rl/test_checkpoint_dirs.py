"""Checkpoint folders are replaced whole (arctic_rl/server/checkpoint_dirs.py), on the real filesystem. That a save
killed midway leaves the previous checkpoint loadable is tests/e2e/test_training.py's (a SIGKILLed engine)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from arctic_rl.config import ArcticRLClientConfig
from arctic_rl.errors import ConfigError
from arctic_rl.server import checkpoint_dirs
from arctic_rl.server.requests import check_request


def checkpoint(folder: Path, step: int) -> Path:
    (folder / "arctic-rl").mkdir(parents=True)
    (folder / "arctic-rl" / "weights.pt").write_text(f"weights {step}")
    (folder / "arctic_rl.json").write_text(json.dumps({"step": step}))
    return folder


def step_of(folder: Path) -> int:
    assert (
        folder / "arctic-rl" / "weights.pt"
    ).read_text() == f"weights {json.loads((folder / 'arctic_rl.json').read_text())['step']}"
    return json.loads((folder / "arctic_rl.json").read_text())["step"]


def test_a_save_swaps_the_whole_folder_and_leaves_nothing_beside_it(tmp_path):
    target = tmp_path / "ck"
    for step in (1, 2):  # new, then over the previous one
        staging = checkpoint_dirs.staging_dir(target)
        assert staging.parent == tmp_path and staging.name.startswith(".ck.saving-") and not any(staging.iterdir())
        checkpoint_dirs.publish(checkpoint(staging, step), target)
        assert step_of(target) == step and [p.name for p in tmp_path.iterdir()] == ["ck"]
    (target / "arctic-rl" / "stale.pt").write_text("from the previous save only")
    checkpoint_dirs.publish(checkpoint(checkpoint_dirs.staging_dir(target), 3), target)
    assert not (target / "arctic-rl" / "stale.pt").exists()  # replaced, not merged


def test_leftovers_of_a_killed_save_go_with_the_next_save_and_a_checkpoint_left_aside_comes_back(tmp_path):
    target = checkpoint(tmp_path / "ck", 1)
    killed = checkpoint_dirs.staging_dir(target)
    (killed / "arctic-rl").mkdir()  # half-written, no arctic_rl.json
    checkpoint_dirs.publish(checkpoint(checkpoint_dirs.staging_dir(target), 2), target)
    assert [p.name for p in tmp_path.iterdir()] == ["ck"] and step_of(target) == 2
    # Where the filesystem cannot swap, publish renames the previous one aside first; a crash right after:
    target.rename(tmp_path / ".ck.old-0123456789ab")
    checkpoint_dirs.recover(target)  # what every save and load of the name runs first
    assert step_of(target) == 2 and [p.name for p in tmp_path.iterdir()] == ["ck"]


def test_a_save_never_replaces_a_folder_that_is_not_a_checkpoint(tmp_path):
    cfg = ArcticRLClientConfig(model_name="org/model", server={"checkpoint_root": str(tmp_path)})
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("mine")
    with pytest.raises(ConfigError, match=r"'.*/notes' is a folder of other files \(\['todo.txt'\]\).*new name"):
        check_request("save_checkpoint", {"path": "notes"}, cfg)
    with pytest.raises(ConfigError, match="is the server's checkpoint_root itself: save under a name inside it"):
        check_request("save_checkpoint", {"path": str(tmp_path)}, cfg)
    check_request("load_checkpoint", {"path": "notes"}, cfg)  # a load reads only (and fails on no arctic_rl.json)
    checkpoint(tmp_path / "ck", 1)
    (tmp_path / "empty").mkdir()
    for ok in ("ck", "empty", "new/sub"):
        check_request("save_checkpoint", {"path": ok}, cfg)
    assert (tmp_path / "notes" / "todo.txt").read_text() == "mine"


@pytest.mark.parametrize("name", ["c*", "c?", "[cd]k", "ck.saving-0123456789ab"])
def test_a_name_matches_only_its_own_hidden_folders(tmp_path, name):
    """A name is taken literally: one with glob characters (`c*`), or one that reads like another's staging folder,
    neither deletes another checkpoint's unfinished save nor takes its previous checkpoint left aside by a crash."""
    other = tmp_path / "ck"
    saving = checkpoint_dirs.staging_dir(other)  # a save of `ck` in progress
    aside = checkpoint(tmp_path / ".ck.old-0123456789ab", 7)  # `ck` left aside by a crash between the two renames
    target = tmp_path / name
    checkpoint_dirs.recover(target)
    checkpoint_dirs.publish(checkpoint(checkpoint_dirs.staging_dir(target), 1), target)
    checkpoint_dirs.publish(checkpoint(checkpoint_dirs.staging_dir(target), 2), target)  # over its own
    assert step_of(target) == 2 and saving.is_dir() and step_of(aside) == 7
    checkpoint_dirs.recover(other)  # `ck`'s own recovery still finds its previous checkpoint
    assert step_of(other) == 7
    unfinished = checkpoint_dirs.staging_dir(target)  # and the other way round: a save of `name` in progress
    checkpoint_dirs.publish(checkpoint(checkpoint_dirs.staging_dir(other), 8), other)
    assert step_of(other) == 8 and unfinished.is_dir() and step_of(target) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([name, "ck", unfinished.name])
