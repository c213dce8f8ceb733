"""Sync vs one-step-ahead vs continuous generation with partial rollouts, on the text2sql CPU workload with
the sampler and the trainer on disjoint cores (as separate GPUs are on a cluster): steps/s of each mode beside
its limit, and the reward curves over several seeds with a paired confidence interval against sync.

Every run starts from the same weights: the SFT warm-up of the CPU demo runs once, is saved, and each
(mode, seed) run loads it (weights and optimizer) before its first step, so the runs of one seed differ only
in the mode. Runs of the same seed draw the same prompts at each step (the loop seeds them by (seed, step)),
which is what makes the pairing fair: per seed, mode minus sync of the mean reward over the steps.

The limit of both async modes is (gen + train + sync) / (max(gen, train) + sync), from the sync runs' median
phases: per step the sampler must still generate a step's tokens and both engines stop for the weight sync.
One-step-ahead reaches it only if the generation of step t + 1 always ends before training step t does
(the sync waits for it); partial rollouts stop one chunk at a sync and continue the rest under the new
weights, so a long tail of generation no longer holds the sync back. Sync's limit is 1 by definition.

    python benchmarks/pipeline.py                       # the recorded run (about an hour on 2 cores)
    python benchmarks/pipeline.py --quick               # 1 seed, 2 steps: checks the script
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from report import Report, add_report_args  # noqa: E402

from arctic_rl import tracking  # noqa: E402
from arctic_rl.runconfig import RunConfig, load_run_config  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
BASE = ROOT / "recipes" / "text2sql" / "configs" / "cpu_demo_async.yaml"
MODES = {
    "sync": {"enable": False},
    "one-step-ahead": {"enable": True, "partial_rollouts": False},
    "partial": {"enable": True, "partial_rollouts": True},
}


def mode_config(mode: str, seed: int, out: Path, a: argparse.Namespace) -> RunConfig:
    """The async CPU demo (same loss and corrections in every mode) with this mode's async section, disjoint
    cores, no warm-up or eval (done once, before), and the benchmark's size."""
    return load_run_config(
        BASE,
        [
            "model.name_or_path=demo",
            "backend.cpu.split=true",
            f"async.enable={str(MODES[mode]['enable']).lower()}",
            f"async.partial_rollouts={str(MODES[mode].get('partial_rollouts', False)).lower()}",
            f"async.chunk_tokens={a.chunk_tokens}",
            "sft_warmup.epochs=0",
            "eval.split=null",
            f"train.steps={a.steps}",
            f"train.prompts_per_step={a.prompts}",
            f"train.mini_batch_size={a.prompts}",
            f"seed={seed}",
            f"checkpoint.dir={out / f'{mode}-seed{seed}'}",  # the server's checkpoint root is `out`, their parent
            f"tracking.run_name=pipeline_{mode}_seed{seed}",
        ],
    )


def warm_start(cfg: RunConfig, client, path: Path, quiet: bool) -> None:
    """The demo's SFT warm-up, once, saved at `path` (weights and optimizer) for every run to start from."""
    from transformers import AutoTokenizer

    from arctic_rl.loop.grpo import open_tracker
    from arctic_rl.loop.sft import sft_warmup

    warm = load_run_config(
        BASE, ["model.name_or_path=demo", "backend.cpu.split=true", "tracking.run_name=pipeline_sft"]
    )
    recipe = importlib.import_module(f"recipes.{warm.recipe.name}")
    tokenizer = AutoTokenizer.from_pretrained(cfg.model.path)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    tracker = open_tracker(warm, None, {})
    try:
        sft_warmup(warm, client, recipe, tokenizer, pad, tracker, quiet)
    finally:
        tracker.end("FINISHED")
    client.save_checkpoint(str(path))


def t_quantile(df: int, level: float = 0.95) -> float:
    from scipy import stats

    return float(stats.t.ppf(0.5 + level / 2, df))


def paired_interval(diffs: list[float], level: float = 0.95) -> tuple[float, float, float]:
    """Mean of the per-seed differences and its two-sided t-interval (nan-wide with one seed)."""
    mean = statistics.fmean(diffs)
    if len(diffs) < 2:
        return mean, math.nan, math.nan
    half = t_quantile(len(diffs) - 1, level) * statistics.stdev(diffs) / math.sqrt(len(diffs))
    return mean, mean - half, mean + half


def overlap_limit(gen: float, train: float, sync: float) -> float:
    """Best speedup over sync when generation overlaps training and both stop for the weight sync."""
    return (gen + train + sync) / (max(gen, train) + sync)


def step_times(history: list[dict]) -> list[float]:
    """Each step's wall time after the first (the first waits for the whole first generation in every mode)."""
    return [h[tracking.TIMING_STEP] for h in history[1:]] or [h[tracking.TIMING_STEP] for h in history]


def curves_png(path: Path, rewards: dict[str, dict[int, list[float]]], title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for i, (mode, by_seed) in enumerate(rewards.items()):
        color = f"C{i}"
        for r in by_seed.values():
            ax.plot(range(1, len(r) + 1), r, color=color, alpha=0.3, linewidth=0.8)
        mean = [statistics.fmean(v) for v in zip(*by_seed.values(), strict=True)]
        ax.plot(range(1, len(mean) + 1), mean, color=color, linewidth=2, label=f"{mode} (mean of {len(by_seed)})")
    ax.set_xlabel("step")
    ax.set_ylabel("mean reward")
    ax.set_title(title)
    ax.legend()
    return tracking.save_figure(fig, path)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--prompts", type=int, default=2, help="prompts per step (8 samples each, as the demo)")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--chunk-tokens", type=int, default=16)
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    p.add_argument("--quick", action="store_true", help="1 seed, 2 steps: checks the script, records nothing")
    p.add_argument("--out", type=Path, default=Path("outputs/bench_pipeline"))
    add_report_args(p)
    a = p.parse_args()
    if a.quick:
        a.seeds, a.steps = 1, 2
    if "sync" not in a.modes:
        p.error("--modes must include sync: it is the baseline of every ratio and interval")
    report = Report.start(
        "pipeline",
        f"Sync vs async reference loop, text2sql CPU demo workload, sampler and trainer on disjoint cores "
        f"({a.prompts} prompts x 8 samples, {a.steps} steps, {a.seeds} seeds)",
        a,
    )
    a.out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("MLFLOW_TRACKING_URI", f"sqlite:///{a.out.resolve() / 'mlflow.db'}")
    from arctic_rl import create_arctic_rl_client
    from arctic_rl.loop import run

    seeds = list(range(a.seeds))
    first = mode_config("sync", 0, a.out, a)
    client = create_arctic_rl_client(first.client_config())
    cores = {name: e.get("cpu", {}) for name, e in client.health().get("engines", {}).items()}
    print(f"engines' cores: {cores}", flush=True)
    results: dict[str, dict[int, dict]] = {m: {} for m in a.modes}
    try:
        init = a.out / "warm_start"
        if init.exists():  # saves are atomic: a folder there is whole (delete --out to start over)
            print(f"SFT warm-up: reusing {init}", flush=True)
        else:
            t0 = time.perf_counter()
            warm_start(first, client, init, quiet=False)
            print(f"SFT warm-up saved in {time.perf_counter() - t0:.0f}s", flush=True)
        total = len(seeds) * len(a.modes)
        for k, (seed, mode) in enumerate((s, m) for s in seeds for m in a.modes):
            client.load_checkpoint(str(init.resolve()))
            client.sync_weights()
            r = run(mode_config(mode, seed, a.out, a), client, quiet=True)
            results[mode][seed] = {"history": r.history, "rewards": r.rewards, "run_id": r.run_id}
            times = step_times(r.history)
            print(
                f"[{k + 1}/{total}] {mode} seed {seed}: step {statistics.median(times):.1f}s median, "
                f"reward {statistics.fmean(r.rewards):.3f} mean, mlflow run {r.run_id}",
                flush=True,
            )
            (a.out / "results.json").write_text(json.dumps(results))  # kept as each run ends
    finally:
        client.shutdown()

    sync_hist = [h for s in seeds for h in results["sync"][s]["history"][1:]]
    gen = statistics.median(h["timing_s/gen"] for h in sync_hist)
    sync_s = statistics.median(h["timing_s/update_weights"] for h in sync_hist)
    sync_step = statistics.median(t for s in seeds for t in step_times(results["sync"][s]["history"]))
    train = sync_step - gen - sync_s
    limit = overlap_limit(gen, train, sync_s)
    base_reward = {s: statistics.fmean(results["sync"][s]["rewards"]) for s in seeds}
    ratios = {}
    for mode in a.modes:
        step = statistics.median(t for s in seeds for t in step_times(results[mode][s]["history"]))
        diffs = [statistics.fmean(results[mode][s]["rewards"]) - base_reward[s] for s in seeds]
        mean, lo, hi = paired_interval(diffs)
        ratios[mode] = sync_step / step
        stale = [h.get("async/partial_fraction", 0.0) for s in seeds for h in results[mode][s]["history"]]
        report.add(
            "steps per second",
            mode=mode,
            **{"step s (median)": step, "steps/s": 1 / step},
            **{"vs sync": f"{ratios[mode]:.2f}x", "limit": f"{1.0 if mode == 'sync' else limit:.2f}x"},
            **{"% of limit": f"{100 * ratios[mode] / (1.0 if mode == 'sync' else limit):.0f}%"},
            **{"rows mixing versions": f"{statistics.fmean(stale):.2f}" if mode == "partial" else ""},
        )
        report.add(
            "reward (mean over the steps), paired by seed",
            mode=mode,
            **{f"seed {s}": statistics.fmean(results[mode][s]["rewards"]) for s in seeds},
            **{"minus sync (mean)": mean, "95% interval": "" if mode == "sync" else f"[{lo:+.3f}, {hi:+.3f}]"},
            **{"worse than sync?": "" if mode == "sync" else ("yes" if hi < 0 else "no")},
        )
    report.add("sync phases (median s)", gen=gen, train=train, sync_weights=sync_s, step=sync_step)
    png = report.path().with_suffix(".png")
    curves_png(png, {m: {s: results[m][s]["rewards"] for s in seeds} for m in a.modes}, "text2sql CPU: reward per step")
    report.note(
        f"Reward curves: [{png.name}]({png.name}) (thin: one seed; thick: the mean over seeds). The interval is "
        f"the two-sided 95% t-interval of the per-seed difference in mean reward (mode minus sync, same seed, "
        f"same prompts at every step); 'worse than sync' means the whole interval is below zero."
    )
    report.note(
        "Limit = (gen + train + sync) / (max(gen, train) + sync) from the sync runs' median phases. The sampler "
        "and the trainer each compute on their own core (backend.cpu.split), so the sync mode leaves one core idle "
        "in every phase, as a sync run leaves the sampling GPUs idle while the trainer computes."
    )
    report.write()
    summary = " | ".join(f"{m} {ratios[m]:.2f}x" for m in a.modes)
    print(f"steps/s vs sync: {summary} | limit {limit:.2f}x | reward curves {png}")


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))  # recipes/ is imported by the loop
    main()
