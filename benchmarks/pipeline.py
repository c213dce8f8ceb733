"""Async vs sync reference loop on one workload and one deployment: step time of both, their ratio,
and the limit overlap allows.

Sync step  = gen + train + sync   (train = reward + adv + old_log_prob + ref + update_actor)
Async step >= max(gen, train) + sync: generation of step t + 1 overlaps training of step t, but
sync_weights waits for it (arctic_rl/rollout/pipeline.py), so the best speedup is
(gen + train + sync) / (max(gen, train) + sync) <= (gen + train) / max(gen, train) <= 2.
On a CPU-only machine the sampler and the trainer share the same cores, so the overlap mostly
trades one's cores for the other's; on GPUs (split placement) they do not compete.

    python benchmarks/pipeline.py                 # minutes on a 2-core machine
    python benchmarks/pipeline.py --steps 4 --out /tmp/bench
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from report import Report, add_report_args  # noqa: E402

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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--n", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--out", type=Path, default=Path("outputs/bench_pipeline"))
    add_report_args(p)
    a = p.parse_args()
    report = Report.start("pipeline", f"Async vs sync reference loop ({a.prompts} prompts x n={a.n}, tiny model)", a)
    a.out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("MLFLOW_TRACKING_URI", f"sqlite:///{a.out.resolve() / 'mlflow.db'}")
    from arctic_rl import create_arctic_rl_client
    from arctic_rl.loop import run

    model = make_model(a.out / "model", hidden=128, layers=2)
    backend = {
        "training_config": {"optimizer": {"lr": 1e-4}, "micro_batch_size": 16},
        "vllm_config": {"max_seq_len": 512, "dtype": "float32"},
    }
    kw = dict(steps=a.steps, prompts=a.prompts, n=a.n, max_tokens=a.max_tokens, filler_words=32, backend=backend)
    cfg_sync = run_config(model, a.out / "sync", **kw)
    cfg_async = run_config(model, a.out / "async", async_enable=True, **kw)
    client = create_arctic_rl_client(cfg_sync.client_config())
    try:
        run(cfg_sync, client, quiet=True)  # warm-up pass: vLLM and DeepSpeed first-call costs
        sync = medians(run(cfg_sync, client, quiet=True).history)
        asyn = medians(run(cfg_async, client, quiet=True).history)
    finally:
        client.shutdown()
    gen = sync["timing_s/gen"]
    sync_s = sync["timing_s/update_weights"]
    train = sync["timing_s/step"] - gen - sync_s
    limit = (gen + train + sync_s) / (max(gen, train) + sync_s)
    ratio = sync["timing_s/step"] / asyn["timing_s/step"]
    png = bar_png(a.out / "pipeline.png", {"sync": sync, "async": asyn}, "reference loop: sync vs async")
    print(f"sync  step {sync['timing_s/step']:.3f}s (gen {gen:.3f}s, train {train:.3f}s, sync {sync_s:.3f}s)")
    print(
        f"async step {asyn['timing_s/step']:.3f}s (waited for gen {asyn['timing_s/gen']:.3f}s, "
        f"gen ran {asyn.get('async/gen_s', float('nan')):.3f}s)"
    )
    report.add(
        "step time",
        **{"sync step s": sync["timing_s/step"], "async step s": asyn["timing_s/step"]},
        ratio=f"{ratio:.2f}x",
        limit=f"{limit:.2f}x",
        **{"% of limit": f"{100 * ratio / limit:.0f}%"},
        **{"gen s": gen, "train s": train, "sync_weights s": sync_s},
    )
    report.note(
        "limit = (gen + train + sync) / (max(gen, train) + sync) from the sync loop's phases; on a CPU-only "
        "machine the sampler and trainer share the cores, so the overlap trades one's cores for the other's."
    )
    report.write()
    print(f"speedup sync/async {ratio:.2f}x | limit (gen+train+sync)/(max(gen,train)+sync) = {limit:.2f}x | {png}")


if __name__ == "__main__":
    main()
