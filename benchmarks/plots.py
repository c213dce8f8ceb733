"""Speedup plots for the op benchmarks: measured ratio as a bar, the theoretical limit as a marker."""

from __future__ import annotations

from pathlib import Path

from arctic_rl import tracking


def speedup_png(path: Path, panels: dict[str, list[tuple[str, float, float]]], title: str) -> Path:
    """panels: {panel title: [(x label, measured ratio, limit), ...]}; one subplot per panel."""
    import matplotlib

    matplotlib.use("Agg")  # no display on clusters and CI
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    fig, axes = plt.subplots(1, len(panels), figsize=(4.5 * len(panels), 3.8), squeeze=False)
    for ax, (name, points) in zip(axes[0], panels.items()):
        xs = range(len(points))
        ax.bar(xs, [r for _, r, _ in points], 0.6, label="measured")
        ax.scatter(xs, [lim for _, _, lim in points], marker="_", s=900, color="black", label="limit", zorder=3)
        for x, (_, r, _lim) in zip(xs, points):
            ax.annotate(f"{r:.1f}x", (x, r), ha="center", va="bottom", fontsize=8)
        ax.set_xticks(list(xs), [label for label, _, _ in points])
        ax.set_ylabel("speedup over the baseline")
        ax.set_title(name, fontsize=10)
        ax.set_ylim(0, 1.25 * max(max(r, lim) for _, r, lim in points))  # headroom for the legend
        ax.legend(fontsize=8, loc="upper left", ncol=2)
    fig.suptitle(title)
    return tracking.save_figure(fig, path)
