"""The report's plots: accuracy and reward against every budget axis, per-step curves, the time split."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # before pyplot: no display on servers and workers
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from ada_core import metrics as K  # noqa: E402
from report.curves import TIME_SPLIT, X_AXES, Y_AXES, RunCurves  # noqa: E402
from report.tables import _mean  # noqa: E402


def _colors(runs: list[RunCurves]) -> dict[str, Any]:
    labels = list(dict.fromkeys(r.label for r in runs))
    cmap = plt.get_cmap("tab10")
    return {label: cmap(i % 10) for i, label in enumerate(labels)}


def _plot_lines(ax, runs: list[RunCurves], x_key: str, y_key: str, colors: dict[str, Any], marker: str | None) -> None:
    labelled: set[str] = set()
    alpha = 0.9 if len({r.seed for r in runs}) == 1 else 0.6
    for run in runs:
        x, y = run.series(x_key, y_key)
        if x.size == 0:
            continue
        ax.plot(x, y, color=colors[run.label], marker=marker, markersize=3, alpha=alpha, linewidth=1.4,
                label=None if run.label in labelled else run.label)
        labelled.add(run.label)


def plot_against(runs: list[RunCurves], axis: str, out: Path) -> Path:
    """Accuracy (left) and reward (right) against one x axis, one line per run, coloured by variant."""
    x_key, x_label = X_AXES[axis]
    colors = _colors(runs)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, (y_key, y_label) in zip(axes, Y_AXES.items()):
        _plot_lines(ax, runs, x_key, y_key, colors, marker="o" if y_key == K.EVAL_AVG_AT_K else None)
        ax.set_xlabel(x_label)
        ax.set_ylabel(y_label)
        ax.grid(alpha=0.3)
        if axis in ("compute", "trained_tokens", "generated_samples"):
            ax.ticklabel_format(axis="x", style="sci", scilimits=(0, 3))
    axes[0].legend(fontsize=8)
    fig.suptitle(f"accuracy and reward vs {x_label}")
    fig.tight_layout()
    path = out / f"accuracy_reward_vs_{axis}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_per_step(runs: list[RunCurves], key: str, y_label: str, out: Path, name: str) -> Path:
    colors = _colors(runs)
    fig, ax = plt.subplots(figsize=(6, 4))
    _plot_lines(ax, runs, "step", key, colors, marker=None)
    ax.set_xlabel("training step")
    ax.set_ylabel(y_label)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = out / f"{name}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_time_split(runs: list[RunCurves], out: Path) -> Path:
    """Stacked bars: mean seconds per step in generate / reward / update / sync, per variant."""
    labels = list(dict.fromkeys(r.label for r in runs))
    fig, ax = plt.subplots(figsize=(1.6 * len(labels) + 3, 4))
    bottom = np.zeros(len(labels))
    for key in TIME_SPLIT:
        heights = np.array([
            _mean(np.concatenate([r.step_values(key) for r in runs if r.label == label])) for label in labels
        ])
        heights = np.nan_to_num(heights)
        ax.bar(labels, heights, bottom=bottom, label=key.removeprefix("time/"))
        bottom += heights
    ax.set_ylabel("seconds per step (mean over steps and seeds)")
    ax.legend(fontsize=8)
    ax.set_title("step-time split")
    fig.tight_layout()
    path = out / "time_split.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
