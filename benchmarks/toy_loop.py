"""The reference loop on the toy recipe and a tiny random model, for the benchmarks that time its phases
(grpo_step.py): the run config, the model, the median of each phase, and the phase bar chart."""

from __future__ import annotations

import os
import statistics
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


from arctic_rl import tracking  # noqa: E402
from arctic_rl.runconfig import RunConfig, parse_run_config  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PHASES = [p for p in tracking.PHASES if p != "step"]


def make_model(folder: Path, **shape) -> Path:
    """A random model from tests/tiny_models.py (nothing is downloaded); reused if already there."""
    if (folder / "config.json").exists():
        return folder
    sys.path.insert(0, str(ROOT / "tests"))
    from tiny_models import make_tiny_model

    return make_tiny_model(folder, "llama", **shape)


def run_config(
    model: Path,
    out: Path,
    *,
    steps: int,
    prompts: int,
    n: int,
    max_tokens: int,
    filler_words: int,
    backend: dict,
    async_enable: bool = False,
) -> RunConfig:
    return parse_run_config(
        {
            "model": {"name_or_path": str(model), "dtype": "float32"},
            "backend": backend,
            "recipe": {"name": "toy", "options": {"num_examples": prompts * steps, "filler_words": filler_words}},
            "sampling": {"n": n, "max_tokens": max_tokens, "temperature": 1.0},
            "train": {"steps": steps, "prompts_per_step": prompts},
            "loss": {"name": "grpo", "config": {}},
            "async": {"enable": async_enable, "max_staleness": 1},
            "checkpoint": {"dir": str(out), "every": 0},
            "resume": "never",
        },
        source="benchmark",
    )


def medians(history: list[dict], skip: int = 1) -> dict[str, float]:
    """Median of each timing_s/* metric over the steps after the first `skip` (warm-up) ones."""
    rows = history[skip:] or history
    keys = [tracking.TIMING_PREFIX + p for p in tracking.PHASES] + ["async/gen_s"]
    return {k: statistics.median(h[k] for h in rows) for k in keys if k in rows[0]}


def bar_png(path: Path, series: dict[str, dict[str, float]], title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [tracking.TIMING_PREFIX + p for p in tracking.PHASES]
    fig, ax = plt.subplots(figsize=(8, 3.8))
    width = 0.8 / len(series)
    for i, (label, m) in enumerate(series.items()):
        ax.bar([x + i * width for x in range(len(names))], [m.get(k, 0.0) for k in names], width, label=label)
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(names))], [n.split("/")[1] for n in names], rotation=30)
    ax.set_ylabel("seconds per step (median)")
    ax.set_title(title)
    ax.legend()
    return tracking.save_figure(fig, path)
