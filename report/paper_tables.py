"""The paper's two tables and the equal-budget one it lacks, from run folders (arXiv 2510.04996v3).

- Table A (the paper's accuracy table): held-out avg@k and pass@k at the last evaluation, per method and
  pool, mean ± the half-width of a 95% t-interval over seeds.
- Table B (the paper's step-time table): seconds per step split into generation, reward, update and
  other (the step's wall time minus those three: the weight sync, the sampler's bookkeeping, logging),
  and generated samples and tokens per step; each cell also as a ratio to the reference (GRPO n = 4) of
  the same pool.
- Table C (what the paper lacks): each method's held-out avg@k minus the reference's at equal cumulative
  generated samples and at equal trained tokens, paired by seed (report/paired.py), with 95% intervals.

`runs_by_pool` maps a pool name ("standard", "hard") to its runs; a run's label is its method. Table C
alone also serves any group: `write_report` adds it whenever it is given a reference.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import yaml

from ada_core import metrics as K
from ada_core.run.files import CONFIG
from report.curves import RunCurves
from report.paired import mean_ci, paired_differences

TABLE_C_AXES = {"generated samples": K.BUDGET_GENERATED_SAMPLES_CUM, "trained tokens": K.BUDGET_TRAINED_TOKENS_CUM}
STEP_PARTS = {"gen": K.TIME_GENERATE_S, "reward": K.TIME_REWARD_S, "update": K.TIME_UPDATE_S}


def labels_of(runs: list[RunCurves]) -> list[str]:
    return list(dict.fromkeys(r.label for r in runs))


def ci_cell(values: list[float], digits: int = 3) -> str:
    """`0.412 ± 0.013` (95% t-interval over the values), `0.412 (one seed)`, or `n/a`."""
    mean, half = mean_ci(values)
    if math.isnan(mean):
        return "n/a"
    if math.isnan(half):
        return f"{mean:.{digits}f} (one seed)"
    return f"{mean:.{digits}f} ± {half:.{digits}f}"


def diff_cell(mean: float, half: float) -> str:
    if math.isnan(mean):
        return "n/a"
    if math.isnan(half):
        return f"{mean:+.3f} (one seed)"
    lo, hi = mean - half, mean + half
    bold = "**" if lo > 0 or hi < 0 else ""  # the interval excludes zero
    return f"{bold}{mean:+.3f} [{lo:+.3f}, {hi:+.3f}]{bold}"


def method_order(runs_by_pool: dict[str, list[RunCurves]], order: list[str] | None = None) -> list[str]:
    """Every method of any pool: those in `order` first, in its order, then the rest as they come."""
    seen = list(dict.fromkeys(label for runs in runs_by_pool.values() for label in labels_of(runs)))
    rank = {m: i for i, m in enumerate(order or [])}
    return sorted(seen, key=lambda m: (rank.get(m, len(rank)), seen.index(m)))


def table_a(runs_by_pool: dict[str, list[RunCurves]], order: list[str] | None = None) -> str:
    """| method | <pool> avg@k | <pool> pass@k | ... | seeds |, mean ± 95% CI over seeds."""
    pools = list(runs_by_pool)
    methods = method_order(runs_by_pool, order)
    head = "| method | " + " | ".join(f"{p} avg@k | {p} pass@k" for p in pools) + " | seeds |"
    lines = [head, "|" + "---|" * (2 * len(pools) + 2)]
    for method in methods:
        cells, seeds = [], set()
        for pool in pools:
            group = [r for r in runs_by_pool[pool] if r.label == method]
            seeds.update(r.seed for r in group)
            cells.append(ci_cell([r.last(K.EVAL_AVG_AT_K) for r in group]))
            cells.append(ci_cell([r.last(K.EVAL_PASS_AT_K) for r in group]))
        lines.append(f"| {method} | " + " | ".join(cells) + f" | {','.join(str(s) for s in sorted(seeds))} |")
    return "\n".join(lines)


def step_profile(run: RunCurves) -> dict[str, float]:
    """One run's per-step means: seconds of gen, reward, update and other; samples and tokens generated."""
    out = {name: _mean(run.step_values(key)) for name, key in STEP_PARTS.items()}
    out["other"] = _mean(run.step_values(K.TIME_STEP_S)) - sum(out[name] for name in STEP_PARTS)
    out["step"] = _mean(run.step_values(K.TIME_STEP_S))
    out["samples"] = _mean(run.step_values(K.BUDGET_GENERATED_SAMPLES))
    out["tokens"] = _mean(run.step_values(K.BUDGET_GENERATED_TOKENS))
    return out


def table_b(runs_by_pool: dict[str, list[RunCurves]], reference: str = "grpo") -> str:
    """| pool | method | s/step | gen | reward | update | other | samples/step | tokens/step |: each the mean
    over seeds of the per-step mean, then `(x ratio)` to the reference of the same pool."""
    columns = ["step", "gen", "reward", "update", "other", "samples", "tokens"]
    names = ["s/step", "gen s", "reward s", "update s", "other s", "samples/step", "tokens/step"]
    lines = ["| pool | method | " + " | ".join(names) + " |", "|" + "---|" * (len(names) + 2)]
    for pool, runs in runs_by_pool.items():
        means = {}
        for method in labels_of(runs):
            profiles = [step_profile(r) for r in runs if r.label == method]
            means[method] = {c: _mean(np.array([p[c] for p in profiles])) for c in columns}
        ref = means.get(reference)
        for method, row in means.items():
            cells = []
            for c in columns:
                value = row[c]
                text = f"{value:.3g}" if c in ("samples", "tokens") else f"{value:.3f}"
                if ref is not None and ref[c] > 0 and not math.isnan(value):
                    text += f" (×{value / ref[c]:.2f})"
                cells.append(text)
            lines.append(f"| {pool} | {method} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def table_c_rows(runs: list[RunCurves], reference: str = "grpo") -> list[dict]:
    return paired_differences(runs, reference, TABLE_C_AXES)


def table_c(runs_by_pool: dict[str, list[RunCurves]], reference: str = "grpo") -> str:
    """| pool | method | vs | seeds | at equal generated samples | at equal trained tokens |"""
    lines = ["| pool | method | vs | seeds | avg@k diff at equal generated samples (95% CI) | "
             "avg@k diff at equal trained tokens (95% CI) |", "|---|---|---|---|---|---|"]
    for pool, runs in runs_by_pool.items():
        rows = table_c_rows(runs, reference)
        for method in dict.fromkeys(r["variant"] for r in rows):
            by_axis = {r["axis"]: r for r in rows if r["variant"] == method}
            cells = [diff_cell(by_axis[a]["mean_diff"], by_axis[a]["ci95"]) if a in by_axis else "n/a"
                     for a in TABLE_C_AXES]
            first = next(iter(by_axis.values()))
            lines.append(f"| {pool} | {method} | {first['reference']} | {first['seeds']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def paper_tables_markdown(runs_by_pool: dict[str, list[RunCurves]], reference: str = "grpo",
                          order: list[str] | None = None) -> str:
    """All three tables with their captions, as one markdown document's body."""
    ks = sorted({_eval_k(r) for runs in runs_by_pool.values() for r in runs} - {None})
    k_text = f"k = {', '.join(str(k) for k in ks)}" if ks else "k"
    return "\n".join([
        f"### Table A: held-out accuracy ({k_text}; mean ± 95% t-interval over seeds, last evaluation)",
        "",
        table_a(runs_by_pool, order),
        "",
        f"### Table B: seconds per step and generation per step (mean over seeds; ratio to `{reference}` of "
        "the same pool)",
        "",
        "`other` = the step's wall time minus generation, reward and update (weight sync, sampler bookkeeping, "
        "logging).",
        "",
        table_b(runs_by_pool, reference),
        "",
        f"### Table C: avg@k minus `{reference}`'s at equal budget (paired by seed, 95% t-interval; bold: the "
        "interval excludes 0)",
        "",
        "Each pair is read at the budget both runs reached, by linear interpolation of the eval curves "
        "(report/paired.py).",
        "",
        table_c(runs_by_pool, reference),
        "",
    ])


def _eval_k(run: RunCurves) -> int | None:
    path = Path(run.run_dir) / CONFIG
    if not path.is_file():
        return None
    value = (yaml.safe_load(path.read_text()) or {}).get("eval_k")
    return int(value) if value is not None else None


def _mean(values: np.ndarray) -> float:
    clean = values[~np.isnan(values)] if values.size else values
    return float(clean.mean()) if clean.size else math.nan
