"""Paired differences at equal budget: how each variant's held-out accuracy differs from a reference
run of the same seed and regime, on every budget axis, with a 95% confidence interval over seeds.

For one axis (say cumulative generated samples) and one seed, the common budget is the smaller of
the two runs' final values; each run's accuracy there is read off its eval curve by linear
interpolation between evaluations, and the difference is variant - reference. Over seeds the
mean difference gets a t-interval (mean +- t_{0.975, s-1} * sd / sqrt(s)); one seed gives no interval.
Pairing by seed removes what the seed shares across variants (the held-out split, the prompt order,
the start model), which is why these intervals are much tighter than the raw seed spread.

A seed whose difference cannot be read (either run has no evaluation up to the common budget) is
left out of the mean, the interval and the seed count, and the table says how many were excluded.
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


def paired_differences(runs: list[RunCurves], reference: str, axes: dict[str, str]) -> list[dict]:
    """One row per (variant, axis): mean paired difference from its regime's reference, CI, seeds."""
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
            diffs, budgets, counted, excluded = [], [], [], []
            for seed in seeds:
                run, ref = by_key[(label, seed)], by_key[(ref_label, seed)]
                x = min(final_budget(run, x_key), final_budget(ref, x_key))
                diff = value_at(run, x_key, x) - value_at(ref, x_key, x) if not math.isnan(x) else math.nan
                if math.isnan(diff):  # a run with no evaluation at the common budget: no difference to count
                    excluded.append(seed)
                    continue
                counted.append(seed)
                budgets.append(x)
                diffs.append(diff)
            mean, half = mean_ci(diffs)
            rows.append({"variant": label, "reference": ref_label, "axis": axis, "seeds": len(counted),
                         "mean_diff": mean, "ci95": half, "budget": float(np.mean(budgets)) if budgets else math.nan,
                         "diffs": diffs, "counted_seeds": counted, "excluded_seeds": excluded})
    return rows


def paired_table(rows: list[dict]) -> str:
    """Markdown: | variant | vs | at equal | seeds | accuracy difference (95% CI) | common budget |

    `seeds` counts the seeds whose difference could be read; excluded ones are named next to it."""
    lines = ["| variant | vs | at equal | seeds | avg@k difference (95% CI) | common budget (mean) |",
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
