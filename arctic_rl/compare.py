"""`arctic-rl compare`: per recipe and setup, each backend's phase times and arctic-rl's speedup over native.

    arctic-rl compare --experiment text2sql [--experiment longqa] [--out runs/compare] [--skip-steps 1]

Reads MLflow runs of the arctic-rl reference loop, verl / SkyRL driving arctic-rl, and native verl / SkyRL,
including runs logged by verl's and SkyRL's own MLflow loggers (their metric names, no tags of ours).
Runs are grouped by recipe, by setup (SETUP_FIELDS: model, nodes, GPUs, prompts per step, n, max prompt and
response lengths; from our tags, else from verl's or SkyRL's own config params) and by (framework,
backend). A phase's median and IQR pool all steps of all runs in the group, after dropping each run's
first `--skip-steps` steps (warm-up: compilation, caches). Tokens/s of a phase = the step's tokens
(`perf/total_num_tokens`, else verl's `perf/throughput` x step seconds x GPUs) / the phase's seconds.
Speedup = native median / arctic-rl median (above 1: arctic-rl is faster), per phase and end to end
(`step`), only between groups of the same recipe and setup: a baseline with another setup is refused
with a line naming each field that differs and both values. The baseline of `verl + arctic-rl` is
native verl, of `skyrl + arctic-rl` native SkyRL, and of the arctic-rl reference loop native verl (else
native SkyRL, else TRL's own GRPOTrainer: benchmarks/vs_trl.py). Writes compare.csv and compare.png to --out.

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
    BACKEND_ARCTIC,
    BACKEND_NATIVE,
    FRAMEWORK_ARCTIC,
    FRAMEWORK_SKYRL,
    FRAMEWORK_TRL,
    FRAMEWORK_VERL,
    PERF_THROUGHPUT,
    PERF_TOTAL_NUM_TOKENS,
    PHASES,
    SETUP_TAGS,
    TAG_BACKEND,
    TAG_FRAMEWORK,
    TAG_GPUS,
    TAG_MODEL,
    TAG_RECIPE,
    TIMING_PREFIX,
    default_tracking_uri,
    save_figure,
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
# The setup of a run: our tags (arctic_rl.tracking.SETUP_TAGS), else where verl's and SkyRL's own loggers
# keep them (their configs, flattened with '/'): verl's first, then SkyRL's.
SETUP_FIELDS = SETUP_TAGS
PARAM_FALLBACKS: dict[str, tuple[str, ...]] = {
    "model": ("actor_rollout_ref/model/path", "trainer/policy/model/path"),
    "nodes": ("trainer/nnodes", "trainer/placement/policy_num_nodes"),
    "prompts_per_step": ("data/train_batch_size", "trainer/train_batch_size"),
    "n": ("actor_rollout_ref/rollout/n", "generator/n_samples_per_prompt"),
    "max_prompt_length": ("data/max_prompt_length", "trainer/max_prompt_length"),
    "max_response_length": ("data/max_response_length", "generator/sampling_params/max_generate_length"),
}
GPU_PARAMS = (
    ("trainer/nnodes", "trainer/n_gpus_per_node"),
    ("trainer/placement/policy_num_nodes", "trainer/placement/policy_num_gpus_per_node"),
)
UNKNOWN = "?"

Series = dict[int, float]  # step -> value


@dataclass
class RunTimings:
    """One MLflow run, reduced to what the comparison needs."""

    run_id: str
    recipe: str
    framework: str
    backend: str
    setup: dict[str, str]  # SETUP_FIELDS -> value (UNKNOWN when the run logged none)
    phases: dict[str, Series] = field(default_factory=dict)  # phase -> seconds per step
    tokens: Series = field(default_factory=dict)  # tokens of each step (prompts + responses)


@dataclass
class Spread:
    median: float
    q1: float
    q3: float

    @property
    def iqr(self) -> float:
        return self.q3 - self.q1

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        if len(values) < 2:
            return cls(values[0], values[0], values[0])
        q1, median, q3 = statistics.quantiles(values, n=4, method="inclusive")
        return cls(median, q1, q3)


@dataclass
class GroupRow:
    recipe: str
    setup: tuple[tuple[str, str], ...]  # (field, value) in SETUP_FIELDS order
    framework: str
    backend: str
    num_runs: int
    seconds: dict[str, Spread]  # phase -> seconds per step
    tokens_per_s: dict[str, Spread]  # phase -> the step's tokens / the phase's seconds
    num_steps: int

    @property
    def label(self) -> str:
        if self.framework == FRAMEWORK_ARCTIC:
            return "arctic-rl loop"
        return f"{self.framework} + arctic-rl" if self.backend == BACKEND_ARCTIC else f"{self.framework} (native)"

    @property
    def medians(self) -> dict[str, float]:
        return {p: s.median for p, s in self.seconds.items()}


def setup_label(setup: tuple[tuple[str, str], ...]) -> str:
    return " ".join(f"{k}={v}" for k, v in setup)


def setup_differences(a: GroupRow, b: GroupRow) -> list[str]:
    """`field: A vs B` for each setup field on which two groups differ (a value nobody logged differs too:
    an unknown setup is not known to be the same)."""
    other = dict(b.setup)
    shown = lambda v: f"{v} (not logged)" if v == UNKNOWN else v  # noqa: E731
    return [f"{k}: {shown(v)} vs {shown(other[k])}" for k, v in a.setup if v != other[k] or v == UNKNOWN]


def infer_framework(tags: dict[str, str], params: dict[str, str], metric_keys: set[str]) -> str:
    if tags.get(TAG_FRAMEWORK):
        return tags[TAG_FRAMEWORK]
    if any(k.startswith("actor_rollout_ref/") for k in params) or any(k.startswith(TIMING_PREFIX) for k in metric_keys):
        return FRAMEWORK_VERL
    if any(k.startswith("generator/") for k in params) or any(k.startswith("timing/") for k in metric_keys):
        return FRAMEWORK_SKYRL
    return "unknown"


def first_param(params: dict[str, str], keys: Sequence[str], default: str = UNKNOWN) -> str:
    return next((params[k] for k in keys if k in params), default)


def infer_gpus(params: dict[str, str]) -> str:
    for nodes_key, per_node_key in GPU_PARAMS:
        if nodes_key in params and per_node_key in params:
            try:
                return str(int(params[nodes_key]) * int(params[per_node_key]))
            except ValueError:
                continue
    return UNKNOWN


def normalize_model(value: str) -> str:
    """A model is named by its last path component: `Qwen/Qwen3-4B` and `/models/Qwen3-4B` are one model."""
    return Path(value.rstrip("/")).name or value


def infer_setup(tags: dict[str, str], params: dict[str, str]) -> dict[str, str]:
    setup = {}
    for name in SETUP_FIELDS:
        logged = infer_gpus(params) if name == TAG_GPUS else first_param(params, PARAM_FALLBACKS[name])
        value = tags.get(name) or logged
        setup[name] = normalize_model(value) if name == TAG_MODEL and value != UNKNOWN else value
    return setup


def history(client: Any, run_id: str, key: str) -> Series:
    """The metric's values by step (last value wins when a step was logged twice, e.g. on resume)."""
    return {m.step: m.value for m in sorted(client.get_metric_history(run_id, key), key=lambda m: m.timestamp)}


def phase_histories(client: Any, run_id: str, framework: str, metric_keys: set[str]) -> dict[str, Series]:
    phases: dict[str, Series] = {}
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
        steps = set.union(*(set(s) for s in parts))
        phases["log_probs"] = {s: sum(part.get(s, 0.0) for part in parts) for s in steps}
    return phases


def step_tokens(client: Any, run_id: str, metric_keys: set[str], phases: dict[str, Series], gpus: str) -> Series:
    """Tokens per step: logged, else recovered from verl's perf/throughput (tokens / step s / GPUs)."""
    if PERF_TOTAL_NUM_TOKENS in metric_keys:
        return history(client, run_id, PERF_TOTAL_NUM_TOKENS)
    if PERF_THROUGHPUT in metric_keys and "step" in phases and gpus.isdigit():
        per_gpu = history(client, run_id, PERF_THROUGHPUT)
        return {s: v * phases["step"][s] * int(gpus) for s, v in per_gpu.items() if s in phases["step"]}
    return {}


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
            setup = infer_setup(tags, params)
            phases = phase_histories(client, run.info.run_id, framework, keys)
            runs.append(
                RunTimings(
                    run_id=run.info.run_id,
                    recipe=tags.get(TAG_RECIPE, name),
                    framework=framework,
                    backend=tags.get(TAG_BACKEND, BACKEND_NATIVE),
                    setup=setup,
                    phases=phases,
                    tokens=step_tokens(client, run.info.run_id, keys, phases, setup[TAG_GPUS]),
                )
            )
    return runs


def _measured(series: Series, skip_steps: int) -> Series:
    """Drops the first `skip_steps` steps (warm-up), only when something is left to measure."""
    steps = sorted(series)
    kept = steps[skip_steps:] if len(steps) > skip_steps else steps
    return {s: series[s] for s in kept}


def summarize(runs: Sequence[RunTimings], skip_steps: int = 1) -> list[GroupRow]:
    groups: dict[tuple, list[RunTimings]] = defaultdict(list)
    for run in runs:
        if run.phases:
            setup = tuple((k, run.setup.get(k, UNKNOWN)) for k in SETUP_FIELDS)
            groups[(run.recipe, setup, run.framework, run.backend)].append(run)
    rows = []
    for (recipe, setup, framework, backend), members in sorted(groups.items()):
        seconds: dict[str, list[float]] = defaultdict(list)
        rates: dict[str, list[float]] = defaultdict(list)
        for run in members:
            for phase, series in run.phases.items():
                kept = _measured(series, skip_steps)
                seconds[phase] += kept.values()
                rates[phase] += [run.tokens[s] / v for s, v in kept.items() if s in run.tokens and v > 0]
        rows.append(
            GroupRow(
                recipe=recipe,
                setup=setup,
                framework=framework,
                backend=backend,
                num_runs=len(members),
                seconds={p: Spread.of(v) for p, v in seconds.items() if v},
                tokens_per_s={p: Spread.of(v) for p, v in rates.items() if v},
                num_steps=max((len(v) for v in seconds.values()), default=0),
            )
        )
    return rows


def baseline_frameworks(row: GroupRow) -> tuple[str, ...]:
    """The native frameworks an arctic-rl row is measured against, in order of preference."""
    if row.backend != BACKEND_ARCTIC:
        return ()
    if row.framework == FRAMEWORK_ARCTIC:
        return (FRAMEWORK_VERL, FRAMEWORK_SKYRL, FRAMEWORK_TRL)
    return (row.framework,)


def baseline_for(row: GroupRow, rows: Sequence[GroupRow]) -> GroupRow | None:
    """The native group of the same recipe and setup an arctic-rl row is measured against (none when a
    setup field is unknown)."""
    if any(v == UNKNOWN for _, v in row.setup):
        return None
    for framework in baseline_frameworks(row):
        for r in rows:
            if (r.recipe, r.setup, r.framework, r.backend) == (row.recipe, row.setup, framework, BACKEND_NATIVE):
                return r
    return None


def refusals(rows: Sequence[GroupRow]) -> list[str]:
    """One line per arctic-rl group whose native baseline was only logged with another setup."""
    lines = []
    for row in rows:
        if baseline_for(row, rows) is not None:
            continue
        for framework in baseline_frameworks(row):
            others = [
                r for r in rows if r.recipe == row.recipe and r.framework == framework and r.backend == BACKEND_NATIVE
            ]
            for other in others:
                lines.append(
                    f"not comparing {row.label} with {other.label} on {row.recipe}: setups differ in "
                    + "; ".join(setup_differences(row, other))
                )
            if others:
                break
    return lines


def speedups(row: GroupRow, base: GroupRow) -> dict[str, float]:
    return {p: base.medians[p] / row.medians[p] for p in row.medians if p in base.medians and row.medians[p] > 0}


def shown_phases(rows: Sequence[GroupRow]) -> list[str]:
    present = {p for r in rows for p in r.seconds}
    return [p for p in SHOWN_PHASES if p in present]


def comparable_sets(rows: Sequence[GroupRow]) -> list[list[GroupRow]]:
    """Rows of one recipe and one setup, the unit of every table, CSV baseline and PNG panel."""
    sets: dict[tuple, list[GroupRow]] = defaultdict(list)
    for r in rows:
        sets[(r.recipe, r.setup)].append(r)
    return [sets[k] for k in sorted(sets)]


def _cell(spread: Spread | None, fmt: str) -> str:
    return f"{spread.median:{fmt}} ({spread.iqr:{fmt}})" if spread else "-"


def format_table(rows: Sequence[GroupRow]) -> str:
    lines = []
    for group in comparable_sets(rows):
        phases = shown_phases(group)
        pairs = [(r, baseline_for(r, group)) for r in group]
        speedup_rows = [(f"speedup {r.label} vs {b.label}", r, b) for r, b in pairs if b is not None]
        width = max([len(r.label) for r in group] + [len(label) for label, _, _ in speedup_rows]) + 2
        cw = 19
        lines.append(f"\n== recipe {group[0].recipe} | {setup_label(group[0].setup)} ==")
        for title, attr, fmt in (("seconds per step", "seconds", ".3f"), ("tokens/s", "tokens_per_s", ".0f")):
            lines.append(f"-- {title}: median (IQR) --")
            lines.append("".ljust(width) + "".join(p.rjust(cw) for p in phases) + "   runs  steps")
            for r in group:
                cells = "".join(_cell(getattr(r, attr).get(p), fmt).rjust(cw) for p in phases)
                lines.append(r.label.ljust(width) + cells + f"{r.num_runs:7d}{r.num_steps:7d}")
        for label, r, base in speedup_rows:
            ups = speedups(r, base)
            cells = "".join((f"{ups[p]:.2f}x" if p in ups else "-").rjust(cw) for p in phases)
            lines.append(label.ljust(width) + cells)
    return "\n".join(lines)


CSV_COLUMNS = [
    "recipe",
    *SETUP_FIELDS,
    "framework",
    "backend",
    "phase",
    "median_s",
    "iqr_s",
    "median_tokens_per_s",
    "iqr_tokens_per_s",
    "num_runs",
    "num_steps",
    "baseline",
    "speedup",
]


def write_csv(rows: Sequence[GroupRow], path: Path) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(CSV_COLUMNS)
        for group in comparable_sets(rows):
            for r in group:
                base = baseline_for(r, group)
                ups = speedups(r, base) if base else {}
                for phase in SHOWN_PHASES:
                    if phase not in r.seconds:
                        continue
                    s, t = r.seconds[phase], r.tokens_per_s.get(phase)
                    writer.writerow(
                        [
                            r.recipe,
                            *(v for _, v in r.setup),
                            r.framework,
                            r.backend,
                            phase,
                            f"{s.median:.6g}",
                            f"{s.iqr:.6g}",
                            f"{t.median:.6g}" if t else "",
                            f"{t.iqr:.6g}" if t else "",
                            r.num_runs,
                            r.num_steps,
                            base.label if base else "",
                            f"{ups[phase]:.4g}" if phase in ups else "",
                        ]
                    )
    tmp.replace(path)


NO_TOKENS_TEXT = "no tokens per step logged by these runs: no tokens/s"


def write_png(rows: Sequence[GroupRow], path: Path) -> None:
    """One row of panels per recipe and setup: median seconds and median tokens/s per phase, one colour
    per framework/backend, whiskers from the first to the third quartile."""
    import matplotlib

    matplotlib.use("Agg")  # no display on clusters and CI
    import matplotlib.pyplot as plt

    sets = comparable_sets(rows)
    fig, axes = plt.subplots(len(sets), 2, figsize=(16, 4.5 * len(sets)), squeeze=False)
    for (ax_s, ax_t), group in zip(axes, sets):
        phases = shown_phases(group)
        bar_w = 0.8 / len(group)
        panels = [(ax_s, "seconds", "s / step")]
        if any(r.tokens_per_s for r in group):
            panels.append((ax_t, "tokens_per_s", "tokens / s"))
        for ax, attr, unit in panels:
            for i, r in enumerate(group):
                spreads = [getattr(r, attr).get(p) for p in phases]
                xs = [j + i * bar_w for j in range(len(phases))]
                heights = [s.median if s else 0.0 for s in spreads]
                err = [
                    [s.median - s.q1 if s else 0.0 for s in spreads],
                    [s.q3 - s.median if s else 0.0 for s in spreads],
                ]
                bars = ax.bar(xs, heights, bar_w, yerr=err, capsize=2, label=r.label)
                base = baseline_for(r, group)
                ups = speedups(r, base) if base and attr == "seconds" else {}
                for bar, phase, spread in zip(bars, phases, spreads):
                    if phase in ups:  # above the whisker
                        ax.annotate(
                            f"{ups[phase]:.2f}x",
                            (bar.get_x() + bar.get_width() / 2, spread.q3),
                            ha="center",
                            va="bottom",
                            fontsize=7,
                        )
            ax.set_xticks([j + 0.4 - bar_w / 2 for j in range(len(phases))], phases, rotation=20)
            ax.set_ylabel(f"median {unit} (whiskers: IQR)")
            ax.legend(fontsize=8)
        ax_s.set_title(f"{group[0].recipe}: seconds (labels: arctic-rl speedup over native)", fontsize=9)
        ax_t.set_title(setup_label(group[0].setup), fontsize=8)
        if len(panels) == 1:  # e.g. SkyRL logs no tokens per step: say so rather than draw an empty log axis
            ax_t.text(0.5, 0.5, NO_TOKENS_TEXT, ha="center", va="center", transform=ax_t.transAxes)
            ax_t.set_xticks([])
            ax_t.set_yticks([])
        else:
            # Log scale: a phase of near-zero seconds (reward, adv) has tokens/s orders of magnitude above the
            # others, which flattened every other bar to zero on a linear axis.
            ax_t.set_yscale("log")
    save_figure(fig, path, dpi=110)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="arctic-rl compare", description=__doc__.split("\n")[0])
    p.add_argument(
        "--experiment", action="append", required=True, help="MLflow experiment (one per recipe); repeatable"
    )
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
    refused = refusals(rows)
    for line in refused:
        print(f"compare: {line}", file=sys.stderr)
    write_csv(rows, out / "compare.csv")
    write_png(rows, out / "compare.png")
    num_speedups = sum(1 for group in comparable_sets(rows) for r in group if baseline_for(r, group))
    print(
        f"\ncompared {len(runs)} run(s) in {len(rows)} group(s), {num_speedups} with a native baseline of the same "
        f"setup, {len(refused)} refused (setups differ); wrote {out / 'compare.csv'} and {out / 'compare.png'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
