"""Checkpoint folders are replaced whole, never rewritten in place.

DeepSpeed writes its files into the folder it is given, so saving over an existing checkpoint in place would
leave, after a crash midway, new files next to old ones under a still-valid arctic_rl.json: a torn checkpoint
that loads. Instead a save writes a new hidden folder next to the target (`.<name>.saving-<id>`), arctic_rl.json
last, and only then makes it the checkpoint: renamed into place when the target is new, else swapped with the
previous one in one rename(2) (renameat2 RENAME_EXCHANGE) and the previous one removed. A reader of the target
sees the previous complete checkpoint or the new complete one, nothing between.

Where the filesystem has no atomic exchange (NFS, some FUSE), the previous checkpoint is renamed aside
(`.<name>.old-<id>`) and the new one into place; a crash between the two renames leaves no target and the
previous checkpoint aside, which `recover` (run by every save and load of that name) puts back.
"""

from __future__ import annotations

import ctypes
import errno
import os
import re
import shutil
import uuid
from pathlib import Path

from arctic_rl.errors import ConfigError

META_FILE = "arctic_rl.json"  # written last into a save: a folder holding it is a complete checkpoint
DS_TAG = "arctic-rl"  # DeepSpeed's folder in a checkpoint (TrainingWorker saves under this tag)
_AT_FDCWD = -100
_RENAME_EXCHANGE = 2  # linux/fs.h
_NO_EXCHANGE = (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP)
_ID = "[0-9a-f]{12}"  # _new_id's


def _new_id() -> str:
    return uuid.uuid4().hex[:12]


def check_replaceable(path: Path) -> None:
    """A save may go to a new path, an empty folder or a checkpoint (complete or torn); never over a folder
    of other files, which the swap would delete."""
    if not path.exists():
        return
    if not path.is_dir():
        raise ConfigError(f"checkpoint path {str(path)!r} is a file, not a folder: save under another name")
    if any(path.iterdir()) and not ((path / META_FILE).is_file() or (path / DS_TAG).is_dir()):
        names = sorted(p.name for p in path.iterdir())[:5]
        raise ConfigError(
            f"checkpoint path {str(path)!r} is a folder of other files ({names}), not a checkpoint: a save replaces "
            "the folder whole, so save under a new name"
        )


def staging_dir(path: Path) -> Path:
    """A new empty hidden folder next to `path` for its next save. Leftovers of saves of `path` killed midway go
    first (a deployment saves one path at a time: its training lock)."""
    recover(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    for old in _siblings(path, "saving"):
        shutil.rmtree(old, ignore_errors=True)
    for old in _siblings(path, "old") if path.exists() else []:  # kept only while `path` was missing
        shutil.rmtree(old, ignore_errors=True)
    staging = path.parent / f".{path.name}.saving-{_new_id()}"
    staging.mkdir()
    return staging


def publish(staging: Path, path: Path) -> None:
    """Makes the complete folder `staging` the checkpoint at `path` in one step; the previous one is removed."""
    recover(path)
    if not path.exists():
        os.rename(staging, path)
    elif _exchange(staging, path):
        shutil.rmtree(staging)  # the previous checkpoint, now under the staging name
    else:
        aside = path.parent / f".{path.name}.old-{_new_id()}"
        os.rename(path, aside)
        os.rename(staging, path)
        shutil.rmtree(aside)


def recover(path: Path) -> None:
    """Puts back the previous checkpoint that a crash between publish's two renames left aside."""
    if path.exists():
        return
    complete = [p for p in _siblings(path, "old") if (p / META_FILE).is_file()]
    if complete:
        os.rename(max(complete, key=lambda p: (p / META_FILE).stat().st_mtime), path)


def _siblings(path: Path, kind: str) -> list[Path]:
    """`path`'s own hidden folders of `kind`, matched literally: a name is the caller's (hostile) string, so no glob
    (`ck*` or `[a-z]k` would match other checkpoints' folders) and the id exactly as written (else a checkpoint named
    `ck.saving-<id>` would have its staging folders taken for `ck`'s)."""
    if not path.parent.is_dir():
        return []
    own = re.compile(rf"\.{re.escape(path.name)}\.{kind}-{_ID}")
    return [p for p in path.parent.iterdir() if own.fullmatch(p.name)]


def _exchange(a: Path, b: Path) -> bool:
    """Swaps two paths atomically (renameat2 RENAME_EXCHANGE); False where the filesystem or libc cannot."""
    libc = ctypes.CDLL(None, use_errno=True)
    fn = getattr(libc, "renameat2", None)
    if fn is None:  # glibc before 2.28
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in _NO_EXCHANGE:
        return False
    raise OSError(err, os.strerror(err), str(a), None, str(b))
