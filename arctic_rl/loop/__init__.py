"""The reference GRPO loop behind `arctic-rl run`: a recipe run on the client's public ops (grpo.py), with its
stages and saved state beside it (data.py, state.py, sft.py, evaluation.py). The generation side it draws samples
from is arctic_rl.rollout; the losses it names live in arctic_rl.losses.

    from arctic_rl.loop import run; run(load_run_config(path, overrides))
"""

from arctic_rl.loop.grpo import RunResult, run

__all__ = ["RunResult", "run"]
