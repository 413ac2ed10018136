"""Paired differences at equal budget: how each variant's held-out accuracy differs from a reference
run of the same seed and regime, on every budget axis, with a 95% confidence interval over seeds.

For one variant and one axis (say cumulative generated samples) every seed is read at ONE budget,
shared by the row: the smallest final value any of its pairs reached on that axis (the variant's or
the reference's, over the seeds), so no seed is read further along than another. Each run's accuracy
there is read off its eval curve by linear interpolation between evaluations, and the difference is
variant - reference. Over seeds the mean difference gets a t-interval (mean +- t_{0.975, s-1} * sd /
sqrt(s)); one seed gives no interval. Pairing by seed removes what the seed shares across variants
(the prompt order, and where the seeds do not share them, the held-out split and the start model),
which is why these intervals are tighter than the raw seed spread. The row carries its budget, so a
table can say where it was read: one short run pulls its whole row back, visibly.

A seed whose difference cannot be read (either run has no evaluation) is left out of the shared
budget, the mean, the interval and the seed count, and the table says how many were excluded.
"""

from __future__ import annotations

import math

import numpy as np

from ada_core import metrics as K
from report.curves import RunCurves

REGIME_PREFIXES = ("pool-", "fresh-")


def regime_of(label: str) -> str:
    return next((p[:-1] for p in REGIME_PREFIXES if label.startswith(p)), "")


def reference_for(label: str, reference: str) -> str:
    regime = regime_of(label)
    return f"{regime}-{reference}" if regime else reference


def value_at(run: RunCurves, x_key: str, x: float, y_key: str = K.EVAL_AVG_AT_K) -> float:
    """The run's `y_key` at budget `x`, interpolated between its evaluations; NaN past its last one."""
    xs, ys = run.series(x_key, y_key)
    if xs.size == 0 or x > xs.max() + 1e-9:
        return math.nan
    order = np.argsort(xs)
    return float(np.interp(x, xs[order], ys[order]))


def final_budget(run: RunCurves, x_key: str) -> float:
    xs, _ = run.series(x_key, K.EVAL_AVG_AT_K)
    return float(xs.max()) if xs.size else math.nan


def mean_ci(diffs: list[float]) -> tuple[float, float]:
    """Mean and the half-width of a 95% t-interval (NaN for fewer than 2 values)."""
    clean = [d for d in diffs if not math.isnan(d)]
    if not clean:
        return math.nan, math.nan
    if len(clean) < 2:
        return float(np.mean(clean)), math.nan
    from scipy import stats

    sd = float(np.std(clean, ddof=1))
    return float(np.mean(clean)), float(stats.t.ppf(0.975, len(clean) - 1) * sd / math.sqrt(len(clean)))


def shared_budget(pairs: list[tuple[RunCurves, RunCurves]], x_key: str) -> float:
    """The budget on `x_key` that every pair reached: the smallest final budget of any run in them."""
    finals = [final_budget(run, x_key) for pair in pairs for run in pair]
    return min(finals) if finals else math.nan


def ci_cell(values: list[float], digits: int = 3) -> str:
    """`0.412 ± 0.013` (95% t-interval over the values), `0.412 (one seed)`, or `n/a`; NaNs ignored."""
    mean, half = mean_ci(values)
    if math.isnan(mean):
        return "n/a"
    if math.isnan(half):
        return f"{mean:,.{digits}f} (one seed)"
    return f"{mean:,.{digits}f} ± {half:,.{digits}f}"


def paired_differences(runs: list[RunCurves], reference: str, axes: dict[str, str]) -> list[dict]:
    """One row per (variant, axis): mean paired difference from its regime's reference, CI, seeds, and
    `budget`, the one budget every counted seed was read at."""
    by_key = {(r.label, r.seed): r for r in runs}
    rows = []
    for label in dict.fromkeys(r.label for r in runs):
        ref_label = reference_for(label, reference)
        if label == ref_label:
            continue
        seeds = sorted(s for (lab, s) in by_key if lab == label and (ref_label, s) in by_key)
        if not seeds:
            continue
        for axis, x_key in axes.items():
            pairs = {seed: (by_key[(label, seed)], by_key[(ref_label, seed)]) for seed in seeds}
            counted = [s for s in seeds if not any(math.isnan(final_budget(r, x_key)) for r in pairs[s])]
            excluded = [s for s in seeds if s not in counted]  # a run with no evaluation: nothing to read
            x = shared_budget([pairs[s] for s in counted], x_key)
            diffs = [value_at(pairs[s][0], x_key, x) - value_at(pairs[s][1], x_key, x) for s in counted]
            mean, half = mean_ci(diffs)
            rows.append({"variant": label, "reference": ref_label, "axis": axis, "seeds": len(counted),
                         "mean_diff": mean, "ci95": half, "budget": x, "diffs": diffs, "counted_seeds": counted,
                         "excluded_seeds": excluded})
    return rows


def paired_table(rows: list[dict]) -> str:
    """Markdown: | variant | vs | at equal | seeds | avg@k diff (95% CI) | read at |

    `seeds` counts the seeds whose difference could be read; excluded ones are named next to it. Short
    headers, so the table fits a report's column (the report's caption says what a cell is)."""
    lines = ["| variant | vs | at equal | seeds | avg@k diff (95% CI) | read at |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        if math.isnan(r["mean_diff"]):
            cell = "n/a"
        elif math.isnan(r["ci95"]):
            cell = f"{r['mean_diff']:+.3f} (one seed)"
        else:
            lo, hi = r["mean_diff"] - r["ci95"], r["mean_diff"] + r["ci95"]
            cell = f"{r['mean_diff']:+.3f} [{lo:+.3f}, {hi:+.3f}]"
        budget = f"{r['budget']:.3g}" if not math.isnan(r["budget"]) else "n/a"
        excluded = r.get("excluded_seeds") or []
        seeds = f"{r['seeds']}" + (f" ({len(excluded)} excluded: seed {', '.join(map(str, excluded))}, no value)"
                                   if excluded else "")
        lines.append(f"| {r['variant']} | {r['reference']} | {r['axis']} | {seeds} | {cell} | {budget} |")
    return "\n".join(lines)
