"""The report's final-metrics table: one row per variant, `mean ± std` over its seeds.

`summary_table` is the markdown of report.md; `summary_rows` the same numbers as plain columns
(a mean and a std column per metric, std empty for one seed), for a sortable table (the compare
and sweep parents log it as an MLflow table artifact).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ada_core import metrics as K
from report.curves import FLOPS_CUM, RunCurves


def mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample std (ddof=1), NaNs ignored; the std of a single value is NaN (undefined), not 0."""
    clean = [v for v in values if not math.isnan(v)]
    if not clean:
        return math.nan, math.nan
    return float(np.mean(clean)), float(np.std(clean, ddof=1)) if len(clean) > 1 else math.nan


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


# The table comes in three, what the runs reached, what their sampler drew and what they cost, so that each fits
# a report's column (the Prefect artifact page cuts a wider table off at its right edge).
PARTS = (("held-out accuracy (avg@k)", "held-out pass@k", "reward, last 5 steps"),
         ("effective ratio", "samples per step", "generated samples"),
         ("trained tokens", "FLOPs", "wall time (s)"))


def summary_table(runs: list[RunCurves]) -> str:
    """Markdown: three tables (`PARTS`), one row per label in each, each cell `mean ± std` over its seeds; the
    first also gives the seeds.

    | variant | seeds | held-out accuracy (avg@k) | ...
    | grpo    | 2     | 0.412 ± 0.013             | ...
    """
    labels = list(dict.fromkeys(r.label for r in runs))
    per_run = {id(r): final_metrics(r) for r in runs}
    tables = []
    for n, part in enumerate(PARTS):
        seeds_column = n == 0
        lines = ["| variant | " + ("seeds | " if seeds_column else "") + " | ".join(part) + " |",
                 "|" + "---|" * (len(part) + 1 + seeds_column)]
        for label in labels:
            group = [r for r in runs if r.label == label]
            cells = []
            for col in part:
                values = [per_run[id(r)][col] for r in group]
                mean, std = mean_std(values)
                cells.append(_fmt(mean, std, sum(not math.isnan(v) for v in values)))
            seeds = f"{len(group)} ({','.join(str(r.seed) for r in group)}) | " if seeds_column else ""
            lines.append(f"| {label} | {seeds}" + " | ".join(cells) + " |")
        tables.append("\n".join(lines))
    return "\n\n".join(tables)


def summary_rows(runs: list[RunCurves]) -> list[dict[str, Any]]:
    """One dict per label: variant, seeds, n_seeds, then `<metric>` (mean) and `<metric> std` (None for one seed).

    NaN means are None too, so the rows serialise as JSON nulls."""
    labels = list(dict.fromkeys(r.label for r in runs))
    per_run = {id(r): final_metrics(r) for r in runs}
    rows = []
    for label in labels:
        group = [r for r in runs if r.label == label]
        row: dict[str, Any] = {"variant": label, "seeds": ",".join(str(r.seed) for r in group), "n_seeds": len(group)}
        for col in per_run[id(group[0])]:
            mean, std = mean_std([per_run[id(r)][col] for r in group])
            row[col] = None if math.isnan(mean) else mean
            row[f"{col} std"] = None if math.isnan(std) else std
        rows.append(row)
    return rows


def _fmt(mean: float, std: float, count: int = 2) -> str:
    """`0.412 ± 0.013`; one seed: `0.412 ± n/a (1 seed)`, since one value has no spread to report."""
    if math.isnan(mean):
        return "n/a"
    spread = "n/a (1 seed)" if count == 1 or math.isnan(std) else None
    if abs(mean) >= 1e4:
        return f"{mean:.3g} ± {spread or f'{std:.2g}'}"
    if abs(mean) >= 100:  # counts and seconds: whole units (`1,420 ± 21`), narrow enough for a report's column
        return f"{mean:,.0f} ± {spread or f'{std:,.0f}'}"
    return f"{mean:.3f} ± {spread or f'{std:.3f}'}"


def _mean(values: np.ndarray) -> float:
    return float(values.mean()) if values.size else math.nan
