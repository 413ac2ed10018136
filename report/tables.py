"""The report's final-metrics table: one row per variant, `mean ± std` over its seeds."""

from __future__ import annotations

import math

import numpy as np

from ada_core import metrics as K
from report.curves import FLOPS_CUM, RunCurves


def mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample std (ddof=1; 0 for a single seed), NaNs ignored."""
    clean = [v for v in values if not math.isnan(v)]
    if not clean:
        return math.nan, math.nan
    return float(np.mean(clean)), float(np.std(clean, ddof=1)) if len(clean) > 1 else 0.0


def final_metrics(run: RunCurves) -> dict[str, float]:
    """The numbers a comparison table reports for one run."""
    reward = run.step_values(K.REWARD_MEAN)
    return {  # readable column names; docs/METRICS.md has the keys behind them
        "held-out accuracy (avg@k)": run.last(K.EVAL_AVG_AT_K),
        "held-out pass@k": run.last(K.EVAL_PASS_AT_K),
        "reward, last 5 steps": float(reward[-5:].mean()) if reward.size else math.nan,
        "effective ratio": _mean(run.step_values(K.SAMPLER_EFFECTIVE_RATIO)),
        "samples per step": _mean(run.step_values(K.BUDGET_GENERATED_SAMPLES)),
        "generated samples": run.last(K.BUDGET_GENERATED_SAMPLES_CUM),
        "trained tokens": run.last(K.BUDGET_TRAINED_TOKENS_CUM),
        "FLOPs": run.last(FLOPS_CUM),
        "wall time (s)": run.last(K.TIME_ELAPSED_S),
    }


def summary_table(runs: list[RunCurves]) -> str:
    """Markdown: one row per label, each cell `mean ± std` over its seeds.

    | variant | seeds | held-out accuracy (avg@k) | ...
    | grpo    | 2     | 0.412 ± 0.013             | ...
    """
    labels = list(dict.fromkeys(r.label for r in runs))
    per_run = {id(r): final_metrics(r) for r in runs}
    columns = list(next(iter(per_run.values())).keys()) if per_run else []
    lines = ["| variant | seeds | " + " | ".join(columns) + " |", "|" + "---|" * (len(columns) + 2)]
    for label in labels:
        group = [r for r in runs if r.label == label]
        cells = []
        for col in columns:
            mean, std = mean_std([per_run[id(r)][col] for r in group])
            cells.append(_fmt(mean, std))
        seeds = ",".join(str(r.seed) for r in group)
        lines.append(f"| {label} | {len(group)} ({seeds}) | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _fmt(mean: float, std: float) -> str:
    if math.isnan(mean):
        return "n/a"
    if abs(mean) >= 1e4:
        return f"{mean:.3g} ± {std:.2g}"
    return f"{mean:.3f} ± {std:.3f}"


def _mean(values: np.ndarray) -> float:
    return float(values.mean()) if values.size else math.nan
