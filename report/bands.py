"""Seed bands: each variant's mean over its seeds with a band of ±1 std, against a budget axis.

Seeds of one variant do not share x values on a budget axis (an adaptive sampler draws a
different number of samples each step), so each seed's curve is read at every x value any seed of
the variant has, inside the range all of them cover, by linear interpolation; the mean and the
sample std are taken there. On the step axis every seed evaluates at the same steps, so nothing is
interpolated. A variant with one seed is drawn as its line alone: there is no spread to show.

`plot_bands_html` writes one self-contained interactive page (plotly, its script inlined, so it
opens offline and as an MLflow artifact); `plot_bands_png` draws the same bands for the markdown
report and the Prefect artifact.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ada_core import metrics as K
from report.curves import X_AXES, Y_AXES, RunCurves

BAND_AXES = ["generated_samples", "step"]  # the x axes the band plots use (keys of X_AXES)
BANDS_HTML = "bands.html"
BANDS_PNG = "accuracy_reward_bands.png"


@dataclass
class Band:
    """One variant's curve over seeds: `mean` at `x`, `low`/`high` = mean ∓ std (= mean for one seed)."""

    label: str
    seeds: int
    x: np.ndarray
    mean: np.ndarray
    low: np.ndarray
    high: np.ndarray


def variant_bands(runs: list[RunCurves], x_key: str, y_key: str) -> list[Band]:
    """Per label (in first-seen order), the mean over seeds of `y_key` against `x_key` and its ±1 std band.

    Two seeds with x = [0, 10, 20] and [0, 14, 26], y = [0, 1, 2] and [0, 1, 2]: the grid is the x
    values both cover, [0, 10, 14, 20]; the second seed is read there by interpolation.
    """
    bands = []
    for label in dict.fromkeys(r.label for r in runs):
        curves = [run.series(x_key, y_key) for run in runs if run.label == label]
        curves = [(x, y) for x, y in curves if x.size]
        if not curves:
            continue
        if len(curves) == 1:
            x, y = curves[0]
            bands.append(Band(label, 1, x, y, y, y))
            continue
        start, end = max(x[0] for x, _ in curves), min(x[-1] for x, _ in curves)
        grid = np.unique(np.concatenate([x[(x >= start) & (x <= end)] for x, _ in curves]))
        values = np.stack([np.interp(grid, x, y) for x, y in curves])
        mean, std = values.mean(axis=0), values.std(axis=0, ddof=1)
        bands.append(Band(label, len(curves), grid, mean, mean - std, mean + std))
    return bands


def _seeds_note(runs: list[RunCurves]) -> str:
    counts = {label: sum(r.label == label for r in runs) for label in dict.fromkeys(r.label for r in runs)}
    return ", ".join(f"{label}: {n} seed{'s' if n != 1 else ''}" for label, n in counts.items())


def plot_bands_html(runs: list[RunCurves], out: Path) -> Path:
    """`bands.html`: held-out accuracy and reward (rows) against generated samples and step (columns)."""
    import plotly.graph_objects as go
    from plotly.colors import qualitative
    from plotly.subplots import make_subplots

    labels = list(dict.fromkeys(r.label for r in runs))
    colors = {label: qualitative.Plotly[i % len(qualitative.Plotly)] for i, label in enumerate(labels)}
    y_items = list(Y_AXES.items())
    # Panel titles short and the legend above the plots: the page also opens in MLflow's artifact view, a
    # frame about 600 px wide, where long titles ran into each other and a side legend took a third of it.
    fig = make_subplots(rows=len(y_items), cols=len(BAND_AXES), horizontal_spacing=0.1, vertical_spacing=0.14,
                        subplot_titles=[f"vs {X_AXES[axis][1]}" for _ in y_items for axis in BAND_AXES])
    shown: set[str] = set()
    for row, (y_key, y_label) in enumerate(y_items, start=1):
        for col, axis in enumerate(BAND_AXES, start=1):
            x_key, x_label = X_AXES[axis]
            for band in variant_bands(runs, x_key, y_key):
                color = colors[band.label]
                if band.seeds > 1:
                    fig.add_trace(go.Scatter(  # plain lists: readable in the page, not base64 typed arrays
                        x=np.concatenate([band.x, band.x[::-1]]).tolist(),
                        y=np.concatenate([band.high, band.low[::-1]]).tolist(), mode="lines",
                        fill="toself", fillcolor=color, opacity=0.2, line={"width": 0}, hoverinfo="skip",
                        name=f"{band.label} ±1 std", legendgroup=band.label, showlegend=False,
                    ), row=row, col=col)
                fig.add_trace(go.Scatter(
                    x=band.x.tolist(), y=band.mean.tolist(), mode="lines+markers" if y_key == K.EVAL_AVG_AT_K else "lines",
                    line={"color": color}, marker={"size": 5}, legendgroup=band.label,
                    name=f"{band.label} (mean of {band.seeds} seeds)" if band.seeds > 1 else f"{band.label} (1 seed)",
                    showlegend=band.label not in shown,
                    hovertemplate=f"{band.label}<br>{x_label}: %{{x:.4g}}<br>{y_label}: %{{y:.4f}}<extra></extra>",
                ), row=row, col=col)
                shown.add(band.label)
            fig.update_xaxes(title_text=x_label, row=row, col=col)
            fig.update_yaxes(title_text=y_label, row=row, col=col)
    fig.update_layout(
        title={"text": f"Mean over seeds with a ±1 std band ({_seeds_note(runs)})<br>"
                       "<sup>click a legend entry to hide a variant</sup>", "font": {"size": 14}},
        legend={"orientation": "h", "yanchor": "bottom", "y": 1.04, "xanchor": "left", "x": 0},
        height=420 * len(y_items), margin={"t": 130, "l": 60, "r": 20}, template="plotly_white", hovermode="closest",
    )
    fig.update_annotations(font_size=12)
    path = out / BANDS_HTML
    fig.write_html(path, include_plotlyjs=True, full_html=True, config={"responsive": True})
    return path


def plot_bands_png(runs: list[RunCurves], out: Path) -> Path:
    """The same bands as a static figure (matplotlib), for report.md and the Prefect artifact."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = list(dict.fromkeys(r.label for r in runs))
    cmap = plt.get_cmap("tab10")
    colors = {label: cmap(i % 10) for i, label in enumerate(labels)}
    y_items = list(Y_AXES.items())
    fig, axes = plt.subplots(len(y_items), len(BAND_AXES), figsize=(11, 3.8 * len(y_items)), squeeze=False)
    for row, (y_key, y_label) in enumerate(y_items):
        for col, axis in enumerate(BAND_AXES):
            ax = axes[row][col]
            x_key, x_label = X_AXES[axis]
            for band in variant_bands(runs, x_key, y_key):
                color = colors[band.label]
                ax.plot(band.x, band.mean, color=color, linewidth=1.6,
                        marker="o" if y_key == K.EVAL_AVG_AT_K else None, markersize=3,
                        label=f"{band.label} ({band.seeds} seed{'s' if band.seeds != 1 else ''})")
                if band.seeds > 1:
                    ax.fill_between(band.x, band.low, band.high, color=color, alpha=0.2, linewidth=0)
            ax.set_xlabel(x_label)
            ax.set_ylabel(y_label)
            ax.grid(alpha=0.3)
            if axis == "generated_samples":
                ax.ticklabel_format(axis="x", style="sci", scilimits=(0, 3))
    axes[0][0].legend(fontsize=8)
    fig.suptitle("mean over seeds, band = ±1 std over seeds")
    fig.tight_layout()
    path = out / BANDS_PNG
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
