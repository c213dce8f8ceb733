"""`arctic-rl export` reads a checkpoint someone handed over without running code from it: every file is read
tensors-only, on both of its paths (the module states of a run without ZeRO, and the ZeRO partitions that
DeepSpeed's zero_to_fp32 would unpickle). That a real checkpoint still exports exactly is
tests/e2e/test_training.py's (ZeRO-1/2/3) and tests/e2e/test_lora.py's."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from arctic_rl.cli import main as cli
from arctic_rl.errors import ConfigError
from arctic_rl.export import export


class Evil:
    """Unpickling it runs os.makedirs(marker)."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return os.makedirs, (self.marker,)


def crafted_checkpoint(root: Path, files: dict[str, object]) -> Path:
    """A folder that looks like save_checkpoint's: arctic_rl.json, then DeepSpeed's files under `arctic-rl/`."""
    ckpt = root / "handed-over"
    (ckpt / "arctic-rl").mkdir(parents=True)
    (ckpt / "arctic_rl.json").write_text(json.dumps({"step": 1, "config": {"model_name": str(root)}}))
    for name, obj in files.items():
        torch.save(obj, ckpt / "arctic-rl" / name)
    return ckpt


# Plain data a model states file holds (parsed before the optimizer partitions are read).
MODEL_STATES = {"module": {}, "buffer_names": [], "param_shapes": [], "shared_params": {}}


@pytest.mark.parametrize(
    "files, refused",
    [
        # fp32 without ZeRO: export reads the module DeepSpeed saved
        (lambda m: {"mp_rank_00_model_states.pt": {"module": Evil(m)}}, "mp_rank_00_model_states.pt"),
        # ZeRO-1/2/3: the fp32 masters come from the optimizer partitions (zero_to_fp32's reading)
        (
            lambda m: {
                "mp_rank_00_model_states.pt": MODEL_STATES,
                "zero_pp_rank_0_mp_rank_00_optim_states.pt": {"optimizer_state_dict": Evil(m)},
            },
            "zero_pp_rank_0_mp_rank_00_optim_states.pt",
        ),
        (
            lambda m: {
                "mp_rank_00_model_states.pt": {**MODEL_STATES, "param_shapes": Evil(m)},
                "zero_pp_rank_0_mp_rank_00_optim_states.pt": {"optimizer_state_dict": {}},
            },
            "mp_rank_00_model_states.pt",
        ),
    ],
    ids=["no-zero-module", "zero-optimizer-partition", "zero-model-states"],
)
def test_export_refuses_a_checkpoint_file_holding_pickled_code(tmp_path, capsys, files, refused):
    marker = tmp_path / "code-ran"
    ckpt = crafted_checkpoint(tmp_path, files(str(marker)))
    with pytest.raises(ConfigError, match=rf"refused to load .*/arctic-rl/{refused}: it holds more than tensors"):
        export(ckpt, tmp_path / "hf")
    assert not marker.exists(), "exporting the checkpoint ran code from it"
    assert cli(["export", str(ckpt), "--out", str(tmp_path / "hf")]) == 2
    assert f"refused to load {ckpt / 'arctic-rl' / refused}" in capsys.readouterr().err
    assert not marker.exists() and not (tmp_path / "hf").exists()
