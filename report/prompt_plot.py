"""The prompt-ledger plot of the comparison report: how each prompt's pass rate moves over training,
and which prompts never resolve (no draw ever held both a positive and a negative).

One panel per variant (its first seed with a ledger): rows are prompts, columns are step bins, each
cell the prompt's pass rate over its samples in that bin (grey: not sampled there). Resolved prompts
are on top, sorted by their pass rate; the never-resolved ones sit below the white line.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ada_core.run.ledger import LedgerNotFound, prompt_totals, read_rows
from report.curves import RunCurves

MAX_ROWS = 400  # prompts shown per panel (an even subsample of the sorted rows beyond that)


def pass_rate_matrix(rows: list[dict], bins: int = 12) -> tuple[np.ndarray, int, int, np.ndarray]:
    """(matrix prompts x bins, number of resolved prompts, total prompts, bin edges)."""
    totals = {t["prompt_id"]: t for t in prompt_totals(rows)}
    last = max(r["step"] for r in rows)
    edges = np.linspace(0.5, last + 0.5, min(bins, last) + 1)
    pos = {pid: np.zeros(len(edges) - 1) for pid in totals}
    cnt = {pid: np.zeros(len(edges) - 1) for pid in totals}
    for r in rows:
        b = min(int(np.searchsorted(edges, r["step"]) - 1), len(edges) - 2)
        pos[r["prompt_id"]][b] += r["positives"]
        cnt[r["prompt_id"]][b] += r["samples"]
    key = lambda pid: (not totals[pid]["resolved"], totals[pid]["pass_rate"] if totals[pid]["pass_rate"] is not None else -1)
    order = sorted(totals, key=key)
    with np.errstate(invalid="ignore", divide="ignore"):
        matrix = np.array([np.where(cnt[p] > 0, pos[p] / np.maximum(cnt[p], 1), np.nan) for p in order])
    resolved = sum(totals[p]["resolved"] for p in order)
    if len(order) > MAX_ROWS:
        keep = np.linspace(0, len(order) - 1, MAX_ROWS).round().astype(int)
        resolved = int(np.searchsorted(keep, resolved))
        matrix = matrix[keep]
    return matrix, resolved, len(order), edges


def plot_prompt_ledger(runs: list[RunCurves], out: Path) -> Path | None:
    """`prompt_pass_rates.png`, or None when no run has a ledger."""
    import matplotlib.pyplot as plt

    panels = {}
    for run in runs:
        if run.label in panels:
            continue
        try:
            rows = read_rows(run.run_dir)
        except (LedgerNotFound, ValueError):
            continue
        if rows:
            panels[run.label] = (run.seed, rows)
    if not panels:
        return None
    cols = min(3, len(panels))
    nrows = -(-len(panels) // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(4.8 * cols + 1, 4.0 * nrows), squeeze=False, layout="constrained")
    cmap = plt.get_cmap("viridis").with_extremes(bad="#d9d9d9")
    image = None
    for ax, (label, (seed, rows)) in zip(axes.flat, panels.items()):
        matrix, resolved, total, edges = pass_rate_matrix(rows)
        image = ax.imshow(matrix, aspect="auto", interpolation="nearest", cmap=cmap, vmin=0, vmax=1,
                          extent=(edges[0], edges[-1], len(matrix), 0))
        ax.axhline(resolved, color="white", linewidth=1.2)
        ax.set_title(f"{label} (seed {seed})\n{total - resolved} of {total} prompts never resolved", fontsize=9)
        ax.set_xlabel("training step")
        ax.set_ylabel("prompts (resolved above the line)", fontsize=8)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    if image is not None:
        fig.colorbar(image, ax=axes, shrink=0.8, label="pass rate in the step bin")
    path = out / "prompt_pass_rates.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
