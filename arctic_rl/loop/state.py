"""The reference loop's saved state: checkpoints, the RNG states and LoopState.

A checkpoint is <dir>/step_K: the backend's save_checkpoint (weights, optimizer, scheduler), then
loop_state.json (step, rewards so far, metrics not yet logged, RNG states, MLflow run id) written last and
atomically: a step_K without it is half-written and resume skips it. The checkpoint dir must be on a
filesystem the backend also sees (it writes there). Loading one also syncs the sampler to the resumed weights.
"""

from __future__ import annotations

import json
import os
import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch

from arctic_rl import tracking
from arctic_rl.client.client import ArcticRLClient
from arctic_rl.errors import ConfigError
from arctic_rl.runconfig import RunConfig

STATE_FILE = "loop_state.json"
_STEP_DIR = re.compile(r"^step_(\d+)$")


@dataclass
class LoopState:
    step: int = 0  # steps done
    run_id: str | None = None
    rewards: list[float] = field(default_factory=list)
    # With checkpoints on, a step's metrics reach MLflow only once a checkpoint covers the step: a step run
    # again after a requeue is then never logged twice. They travel in the checkpoint, so steps whose
    # checkpoint was written but whose metrics were not yet logged (killed in between) are logged on resume.
    unlogged: dict[int, dict[str, float]] = field(default_factory=dict)


def latest_checkpoint(root: Path) -> Path | None:
    """The complete step_K folder with the largest K (complete = loop_state.json was written)."""
    if not root.is_dir():
        return None
    done = [
        (int(m.group(1)), p) for p in root.iterdir() if (m := _STEP_DIR.match(p.name)) and (p / STATE_FILE).is_file()
    ]
    return max(done)[1] if done else None


def resume_path(cfg: RunConfig) -> Path | None:
    if cfg.resume == "never":
        return None
    if cfg.resume == "auto":
        return latest_checkpoint(cfg.checkpoint_dir)
    path = Path(cfg.resume).expanduser()
    if not (path / STATE_FILE).is_file():
        raise ConfigError(f"resume={cfg.resume!r}: {path / STATE_FILE} does not exist (not a complete checkpoint)")
    return path


def save_checkpoint(client: ArcticRLClient, root: Path, state: LoopState) -> Path:
    path = (root / f"step_{state.step}").resolve()
    client.save_checkpoint(str(path))
    np_state = cast(tuple, np.random.get_state())  # the legacy tuple form (legacy=True is the default)
    payload = {
        "step": state.step,
        "run_id": state.run_id,
        "rewards": state.rewards,
        "unlogged": {str(k): v for k, v in state.unlogged.items()},
        "rng": {
            "python": _jsonable(random.getstate()),
            "numpy": [np_state[0], np_state[1].tolist(), *np_state[2:]],
            "torch": torch.get_rng_state().tolist(),
        },
    }
    tmp = path / f".{STATE_FILE}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(payload))
    tmp.replace(path / STATE_FILE)  # last: its presence marks the checkpoint complete
    return path


def load_checkpoint(client: ArcticRLClient, path: Path) -> LoopState:
    payload = json.loads((path / STATE_FILE).read_text())
    client.load_checkpoint(str(path.resolve()))
    client.sync_weights()  # the sampler must sample with the resumed weights
    rng = payload["rng"]
    random.setstate(_tupled(rng["python"]))
    np.random.set_state((rng["numpy"][0], np.array(rng["numpy"][1], dtype=np.uint32), *rng["numpy"][2:]))
    torch.set_rng_state(torch.tensor(rng["torch"], dtype=torch.uint8))
    return LoopState(
        step=int(payload["step"]),
        run_id=payload.get("run_id"),
        rewards=list(payload["rewards"]),
        unlogged={int(k): v for k, v in payload.get("unlogged", {}).items()},
    )


def flush_metrics(tracker: tracking.Tracker, state: LoopState) -> None:
    """Logs the held-back metrics of checkpointed steps, skipping any MLflow already has (exactly once)."""
    if not state.unlogged:
        return
    done = tracker.logged_steps(tracking.TIMING_STEP)
    for step, metrics in sorted(state.unlogged.items()):
        if step not in done:
            tracker.log_metrics(metrics, step=step)
    state.unlogged.clear()


def _jsonable(x: Any) -> Any:
    return [_jsonable(v) for v in x] if isinstance(x, (tuple, list)) else x


def _tupled(x: Any) -> Any:
    return tuple(_tupled(v) for v in x) if isinstance(x, list) else x
