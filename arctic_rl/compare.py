"""`arctic-rl compare`: per recipe, each backend's median phase times and arctic-rl's speedup over native.

    arctic-rl compare --experiment text2sql [--experiment longqa] [--out runs/compare] [--skip-steps 1]

Reads MLflow runs of the arctic-rl reference loop, verl / SkyRL driving arctic-rl, and native verl / SkyRL,
including runs logged by verl's and SkyRL's own MLflow loggers (their metric names, no tags of ours).
Runs are grouped by recipe and by (framework, backend); a phase's value is the median over all steps of
all runs in the group, after dropping each run's first `--skip-steps` steps (warm-up: compilation, caches).
Speedup = native median / arctic-rl median (above 1: arctic-rl is faster), per phase and end to end
(`step`). The baseline of `verl + arctic-rl` is native verl, of `skyrl + arctic-rl` native SkyRL, and of
the arctic-rl reference loop native verl (else native SkyRL). Writes compare.csv and compare.png to --out.

Phase names are verl's (`timing_s/<phase>`). SkyRL's trainer logs `timing/<Timer name>` and times the
policy and reference forward passes as one (`fwd_logprobs_values_reward`), so the table also has
`log_probs` = old_log_prob + ref, the phase on which all frameworks line up.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from arctic_rl.tracking import (
    BACKEND_ARCTIC, BACKEND_NATIVE, FRAMEWORK_ARCTIC, FRAMEWORK_SKYRL, FRAMEWORK_VERL, PHASES, TAG_BACKEND,
    TAG_FRAMEWORK, TAG_GPUS, TAG_MODEL, TAG_NODES, TAG_RECIPE, TIMING_PREFIX, default_tracking_uri, save_figure,
)

# The order phases are shown in; log_probs is derived (see the module docstring).
SHOWN_PHASES = ("gen", "reward", "old_log_prob", "ref", "log_probs", "adv", "update_actor", "update_weights", "step")
# SkyRL (skyrl-train, skyrl_train/trainer.py) logs `"timing/" + Timer name` once per step. Several SkyRL
# names may map to one phase; the first one present in a run wins (newer trainers time `policy_train`
# alone, older ones only `train_critic_and_policy`).
SKYRL_TIMING: dict[str, tuple[str, ...]] = {
    "gen": ("timing/generate",),
    "reward": ("timing/postprocess_generator_output",),
    "log_probs": ("timing/fwd_logprobs_values_reward",),
    "adv": ("timing/compute_advantages_and_returns",),
    "update_actor": ("timing/policy_train", "timing/train_critic_and_policy"),
    "update_weights": ("timing/sync_weights",),
    "step": ("timing/step",),
}
# Where verl's and SkyRL's own loggers keep model and topology (their configs, flattened with '/').
PARAM_FALLBACKS = {
    TAG_MODEL: ("actor_rollout_ref/model/path", "trainer/policy/model/path"),
    TAG_NODES: ("trainer/nnodes", "trainer/placement/policy_num_nodes"),
}
GPU_PARAMS = (("trainer/nnodes", "trainer/n_gpus_per_node"),
              ("trainer/placement/policy_num_nodes", "trainer/placement/policy_num_gpus_per_node"))


@dataclass
class RunTimings:
    """One MLflow run, reduced to what the comparison needs."""

    run_id: str
    recipe: str
    framework: str
    backend: str
    model: str
    nodes: str
    gpus: str
    phases: dict[str, list[float]] = field(default_factory=dict)  # phase -> per-step seconds, by step


@dataclass
class GroupRow:
    recipe: str
    framework: str
    backend: str
    num_runs: int
    medians: dict[str, float]
    num_steps: int
    models: str
    topology: str

    @property
    def label(self) -> str:
        if self.framework == FRAMEWORK_ARCTIC:
            return "arctic-rl loop"
        return f"{self.framework} + arctic-rl" if self.backend == BACKEND_ARCTIC else f"{self.framework} (native)"


def infer_framework(tags: dict[str, str], params: dict[str, str], metric_keys: set[str]) -> str:
    if tags.get(TAG_FRAMEWORK):
        return tags[TAG_FRAMEWORK]
    if any(k.startswith("actor_rollout_ref/") for k in params) or any(k.startswith(TIMING_PREFIX) for k in metric_keys):
        return FRAMEWORK_VERL
    if any(k.startswith("generator/") for k in params) or any(k.startswith("timing/") for k in metric_keys):
        return FRAMEWORK_SKYRL
    return "unknown"


def first_param(params: dict[str, str], keys: Sequence[str], default: str = "?") -> str:
    return next((params[k] for k in keys if k in params), default)


def infer_gpus(params: dict[str, str]) -> str:
    for nodes_key, per_node_key in GPU_PARAMS:
        if nodes_key in params and per_node_key in params:
            try:
                return str(int(params[nodes_key]) * int(params[per_node_key]))
            except ValueError:
                continue
    return "?"


def history(client: Any, run_id: str, key: str) -> list[float]:
    """The metric's values ordered by step (last value wins when a step was logged twice, e.g. on resume)."""
    by_step = {m.step: m.value for m in sorted(client.get_metric_history(run_id, key), key=lambda m: m.timestamp)}
    return [by_step[s] for s in sorted(by_step)]


def phase_histories(client: Any, run_id: str, framework: str, metric_keys: set[str]) -> dict[str, list[float]]:
    phases: dict[str, list[float]] = {}
    if framework == FRAMEWORK_SKYRL:
        for phase, names in SKYRL_TIMING.items():
            name = next((n for n in names if n in metric_keys), None)
            if name:
                phases[phase] = history(client, run_id, name)
        return phases
    for phase in PHASES:
        if TIMING_PREFIX + phase in metric_keys:
            phases[phase] = history(client, run_id, TIMING_PREFIX + phase)
    parts = [phases[p] for p in ("old_log_prob", "ref") if p in phases]
    if parts:  # summed step by step; a run with only one of the two counts that one
        phases["log_probs"] = [sum(vals) for vals in zip(*parts)]
    return phases


def load_runs(experiments: Sequence[str], tracking_uri: str | None = None) -> list[RunTimings]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri or default_tracking_uri())
    runs: list[RunTimings] = []
    for name in experiments:
        exp = client.get_experiment_by_name(name)
        if exp is None:
            known = sorted(e.name for e in client.search_experiments())
            raise ValueError(f"--experiment {name!r} not found at {client.tracking_uri}; experiments there: {known}")
        for run in client.search_runs([exp.experiment_id], max_results=10_000):
            tags, params = run.data.tags, run.data.params
            keys = set(run.data.metrics)
            framework = infer_framework(tags, params, keys)
            runs.append(RunTimings(
                run_id=run.info.run_id, recipe=tags.get(TAG_RECIPE, name), framework=framework,
                backend=tags.get(TAG_BACKEND, BACKEND_NATIVE),
                model=tags.get(TAG_MODEL) or first_param(params, PARAM_FALLBACKS[TAG_MODEL]),
                nodes=tags.get(TAG_NODES) or first_param(params, PARAM_FALLBACKS[TAG_NODES]),
                gpus=tags.get(TAG_GPUS) or infer_gpus(params),
                phases=phase_histories(client, run.info.run_id, framework, keys),
            ))
    return runs


def summarize(runs: Sequence[RunTimings], skip_steps: int = 1) -> list[GroupRow]:
    groups: dict[tuple[str, str, str], list[RunTimings]] = defaultdict(list)
    for run in runs:
        if run.phases:
            groups[(run.recipe, run.framework, run.backend)].append(run)
    rows = []
    for (recipe, framework, backend), members in sorted(groups.items()):
        pooled: dict[str, list[float]] = defaultdict(list)
        for run in members:
            for phase, values in run.phases.items():
                # Drop warm-up steps only when something is left to measure.
                pooled[phase] += values[skip_steps:] if len(values) > skip_steps else values
        rows.append(GroupRow(
            recipe=recipe, framework=framework, backend=backend, num_runs=len(members),
            medians={p: statistics.median(v) for p, v in pooled.items() if v},
            num_steps=max((len(v) for v in pooled.values()), default=0),
            models=",".join(sorted({r.model for r in members})),
            topology=",".join(sorted({f"{r.nodes}n/{r.gpus}g" for r in members})),
        ))
    return rows


def baseline_for(row: GroupRow, rows: Sequence[GroupRow]) -> GroupRow | None:
    """The native run an arctic-rl row is measured against (see the module docstring)."""
    if row.backend != BACKEND_ARCTIC:
        return None
    natives = {r.framework: r for r in rows if r.recipe == row.recipe and r.backend == BACKEND_NATIVE}
    if row.framework in natives:
        return natives[row.framework]
    if row.framework == FRAMEWORK_ARCTIC:
        return natives.get(FRAMEWORK_VERL) or natives.get(FRAMEWORK_SKYRL)
    return None


def speedups(row: GroupRow, base: GroupRow) -> dict[str, float]:
    return {p: base.medians[p] / row.medians[p] for p in row.medians if p in base.medians and row.medians[p] > 0}


def shown_phases(rows: Sequence[GroupRow]) -> list[str]:
    present = {p for r in rows for p in r.medians}
    return [p for p in SHOWN_PHASES if p in present]


def format_table(rows: Sequence[GroupRow]) -> str:
    lines = []
    for recipe in sorted({r.recipe for r in rows}):
        group = [r for r in rows if r.recipe == recipe]
        phases = shown_phases(group)
        pairs = [(r, baseline_for(r, group)) for r in group]
        speedup_rows = [(f"speedup {r.label} vs {b.label}", r, b) for r, b in pairs if b is not None]
        width = max([len(r.label) for r in group] + [len(label) for label, _, _ in speedup_rows]) + 2
        lines.append(f"\n== recipe {recipe}: median seconds per step ==")
        lines.append("".ljust(width) + "".join(p.rjust(13) for p in phases) + "   runs  steps  model / nodes,gpus")
        for r in group:
            cells = "".join((f"{r.medians[p]:.3f}" if p in r.medians else "-").rjust(13) for p in phases)
            lines.append(r.label.ljust(width) + cells + f"{r.num_runs:7d}{r.num_steps:7d}  {r.models} / {r.topology}")
        for label, r, base in speedup_rows:
            ups = speedups(r, base)
            cells = "".join((f"{ups[p]:.2f}x" if p in ups else "-").rjust(13) for p in phases)
            lines.append(label.ljust(width) + cells)
    return "\n".join(lines)


def write_csv(rows: Sequence[GroupRow], path: Path) -> None:
    with open(path, "w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(["recipe", "framework", "backend", "phase", "median_s", "num_runs", "num_steps",
                         "baseline", "speedup"])
        for r in rows:
            base = baseline_for(r, [x for x in rows if x.recipe == r.recipe])
            ups = speedups(r, base) if base else {}
            for phase in SHOWN_PHASES:
                if phase in r.medians:
                    writer.writerow([r.recipe, r.framework, r.backend, phase, f"{r.medians[phase]:.6g}", r.num_runs,
                                     r.num_steps, base.label if base else "", f"{ups[phase]:.4g}" if phase in ups else ""])


def write_png(rows: Sequence[GroupRow], path: Path) -> None:
    """One panel per recipe: grouped bars (median s) per phase, one colour per framework/backend."""
    import matplotlib

    matplotlib.use("Agg")  # no display on clusters and CI
    import matplotlib.pyplot as plt

    recipes = sorted({r.recipe for r in rows})
    fig, axes = plt.subplots(len(recipes), 1, figsize=(11, 4 * len(recipes)), squeeze=False)
    for ax, recipe in zip(axes[:, 0], recipes):
        group = [r for r in rows if r.recipe == recipe]
        phases = shown_phases(group)
        bar_w = 0.8 / len(group)
        for i, r in enumerate(group):
            xs = [j + i * bar_w for j in range(len(phases))]
            bars = ax.bar(xs, [r.medians.get(p, 0.0) for p in phases], bar_w, label=r.label)
            base = baseline_for(r, group)
            ups = speedups(r, base) if base else {}
            for bar, phase in zip(bars, phases):
                if phase in ups:
                    ax.annotate(f"{ups[phase]:.2f}x", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                                ha="center", va="bottom", fontsize=7)
        ax.set_xticks([j + 0.4 - bar_w / 2 for j in range(len(phases))], phases, rotation=20)
        ax.set_ylabel("median s / step")
        ax.set_title(f"{recipe}: phase times (labels: arctic-rl speedup over native)")
        ax.legend(fontsize=8)
    save_figure(fig, path, dpi=110)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="arctic-rl compare", description=__doc__.split("\n")[0])
    p.add_argument("--experiment", action="append", required=True, help="MLflow experiment (one per recipe); repeatable")
    p.add_argument("--tracking-uri", help="default: MLFLOW_TRACKING_URI, else sqlite runs/mlflow.db here")
    p.add_argument("--out", help="folder for compare.csv and compare.png (default runs/compare/<experiments>)")
    p.add_argument("--skip-steps", type=int, default=1, help="warm-up steps dropped from each run (default 1)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.skip_steps < 0:
        parser.error(f"--skip-steps={args.skip_steps}: must be 0 or more")
    try:
        runs = load_runs(args.experiment, args.tracking_uri)
    except ValueError as err:
        parser.error(str(err))
    rows = summarize(runs, args.skip_steps)
    if not rows:
        print(f"no runs with timing metrics (timing_s/* or timing/*) in {args.experiment}", file=sys.stderr)
        return 1
    out = Path(args.out or Path("runs") / "compare" / "+".join(args.experiment))
    out.mkdir(parents=True, exist_ok=True)
    print(format_table(rows))
    write_csv(rows, out / "compare.csv")
    write_png(rows, out / "compare.png")
    num_speedups = sum(1 for r in rows if baseline_for(r, [x for x in rows if x.recipe == r.recipe]))
    print(f"\ncompared {len(runs)} run(s) in {len(rows)} group(s), {num_speedups} with a native baseline; "
          f"wrote {out / 'compare.csv'} and {out / 'compare.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
