"""Reading DeepSpeed checkpoint files without unpickling code: the trainer's load_checkpoint and `arctic-rl
export` both read through `load_tensors_only`.

torch.load(weights_only=False), which DeepSpeed's checkpoint engine and its zero_to_fp32 use, runs whatever a
pickled object's __reduce__ names: a crafted file would run code as the user who loads it. weights_only=True
restores tensors, plain containers and numbers only. Besides those, the files of ZeRO-1/2/3 checkpoints hold
three DeepSpeed data classes (only their fields are restored, no code of theirs runs); any other object makes
the load fail with a ConfigError naming the file.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import torch

from arctic_rl.errors import ConfigError


def _allowed_globals() -> list:
    from deepspeed.runtime.fp16.loss_scaler import LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    return [LossScaler, ZeroStageEnum, fragment_address]


def load_tensors_only(path: str | Path, map_location: Any = None, mmap: bool = False) -> Any:
    """torch.load(path) restoring tensors, plain data and the three DeepSpeed classes only."""
    try:
        with torch.serialization.safe_globals(_allowed_globals()):
            return torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as e:
        why = next((ln.strip() for ln in str(e).splitlines() if "Unsupported" in ln), str(e).splitlines()[0])
        raise ConfigError(
            f"refused to load {path}: it holds more than tensors and plain data ({why[:300]}); "
            "only checkpoints written by arctic-rl's trainer can be read"
        ) from None
