"""The paper's two tables, the equal-budget one it lacks and its convergence claim, from run folders
(arXiv 2510.04996v3).

Every pool is read at one step, the last evaluation of its longest runs; a run that stops before it is
left out of all four tables and named in every row it would have entered (report/pools.py says why
that and not the shortest run's step). Each row says the step or budget it is read at.

- Table A (the paper's accuracy table): held-out avg@k and pass@k at the pool's read step, per method
  and pool, mean ± the half-width of a 95% t-interval over seeds, with the mean cumulative generated
  samples and trained tokens the method had spent by that step.
- Table B (the paper's step-time table): seconds per step split into generation, reward, update and
  other (the step's wall time minus those three: the weight sync, the sampler's bookkeeping, logging),
  and generated samples and tokens per step, over steps 1 to the read step; each cell also as a ratio
  to the reference (GRPO n = 4) of the same pool.
- Table C (what the paper lacks): each method's held-out avg@k minus the reference's at equal cumulative
  generated samples and at equal trained tokens, paired by seed (report/paired.py), with 95% intervals;
  every seed of a row is read at one budget per axis, printed beside the difference.
- Table D (the paper's "up to 2x faster convergence"): the steps and generated samples each method needs
  to reach the reference's final accuracy, and its speed-up (report/convergence.py defines both).

`runs_by_pool` maps a pool name ("standard", "hard") to its runs; a run's label is its method. Table C
alone also serves any group: `write_report` adds it whenever it is given a reference.
"""

from __future__ import annotations

import math

import numpy as np

from ada_core import metrics as K
from report.convergence import table_d
from report.curves import RunCurves
from report.paired import ci_cell, mean_ci, paired_differences, reference_for, shared_budget, value_at
from report.pools import PoolRuns, read_pools

TABLE_C_AXES = {"generated samples": K.BUDGET_GENERATED_SAMPLES_CUM, "trained tokens": K.BUDGET_TRAINED_TOKENS_CUM}
STEP_PARTS = {"gen": K.TIME_GENERATE_S, "reward": K.TIME_REWARD_S, "update": K.TIME_UPDATE_S}


def diff_cell(mean: float, half: float) -> str:
    if math.isnan(mean):
        return "n/a"
    if math.isnan(half):
        return f"{mean:+.3f} (one seed)"
    lo, hi = mean - half, mean + half
    bold = "**" if lo > 0 or hi < 0 else ""  # the interval excludes zero
    return f"{bold}{mean:+.3f} [{lo:+.3f}, {hi:+.3f}]{bold}"


def budget_cell(values: list[float]) -> str:
    """A budget as a whole number with thousands separators (`7,680`), the mean of `values`; `n/a` if none."""
    mean, _ = mean_ci(values)
    return "n/a" if math.isnan(mean) else f"{mean:,.0f}"


def order_runs(runs: list[RunCurves], methods: list[str]) -> list[RunCurves]:
    """`runs` in the tables' order: by method (those in `methods` first, in its order), then seed."""
    rank = {m: i for i, m in enumerate(methods)}
    return sorted(runs, key=lambda r: (rank.get(r.label, len(rank)), r.label, r.seed))


def method_order(labels: list[str], order: list[str] | None = None) -> list[str]:
    """`labels`: those in `order` first, in its order, then the rest as they come."""
    rank = {m: i for i, m in enumerate(order or [])}
    return sorted(labels, key=lambda m: (rank.get(m, len(rank)), labels.index(m)))


def table_a(runs_by_pool: dict[str, list[RunCurves]], order: list[str] | None = None) -> str:
    """| pool | method | step | generated samples | trained tokens | avg@k | pass@k | seeds |: each pool at its
    read step; accuracy mean ± 95% CI over the seeds that reach it, the budgets their mean at that step."""
    lines = ["| pool | method | step | generated samples (mean) | trained tokens (mean) | avg@k | pass@k | seeds |",
             "|" + "---|" * 8]
    for pool in read_pools(runs_by_pool).values():
        for method in method_order(pool.labels, order):
            runs = pool.of(method)
            samples, tokens, avg, passed = ([value_at(r, "step", pool.step, key) for r in runs] for key in (
                K.BUDGET_GENERATED_SAMPLES_CUM, K.BUDGET_TRAINED_TOKENS_CUM, K.EVAL_AVG_AT_K, K.EVAL_PASS_AT_K))
            cells = [budget_cell(samples), budget_cell(tokens), ci_cell(avg), ci_cell(passed)]
            lines.append(f"| {pool.name} | {method} | {pool.step:g} | " + " | ".join(cells)
                         + f" | {pool.seeds_cell(method, [r.seed for r in runs])} |")
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
    """| pool | method | steps | s/step | gen | reward | update | other | samples/step | tokens/step | seeds |: each
    the mean over seeds of the per-step mean over steps 1 to the pool's read step, then `(x ratio)` to the
    reference of the same pool."""
    columns = ["step", "gen", "reward", "update", "other", "samples", "tokens"]
    names = ["s/step", "gen s", "reward s", "update s", "other s", "samples/step", "tokens/step"]
    lines = ["| pool | method | steps | " + " | ".join(names) + " | seeds |", "|" + "---|" * (len(names) + 4)]
    for pool in read_pools(runs_by_pool).values():
        means = {}
        for method in pool.labels:
            profiles = [step_profile(r) for r in pool.of(method)]
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
            seeds = pool.seeds_cell(method, [r.seed for r in pool.of(method)])
            lines.append(f"| {pool.name} | {method} | 1-{pool.step:g} | " + " | ".join(cells) + f" | {seeds} |")
    return "\n".join(lines)


def table_c_rows(pool: PoolRuns, reference: str = "grpo") -> list[list[str]]:
    """One row of cells per method of the pool but the reference (Table C's columns after `pool`)."""
    rows = paired_differences(pool.runs, reference, TABLE_C_AXES)
    out = []
    for method in pool.labels:
        ref = reference_for(method, reference)
        if method == ref:
            continue
        by_axis = {r["axis"]: r for r in rows if r["variant"] == method}
        cells = []
        for axis in TABLE_C_AXES:
            row = by_axis.get(axis)
            cells += [budget_cell([row["budget"]]) if row else "n/a",
                      diff_cell(row["mean_diff"], row["ci95"]) if row else "n/a"]
            if axis == "generated samples":  # the updates each side had made there: equal samples are not equal updates
                x = row["budget"] if row else math.nan
                m_u = _mean(np.array([updates_at(r, x) for r in pool.of(method) if r.seed in row["counted_seeds"]])) \
                    if row else math.nan
                r_u = _mean(np.array([updates_at(r, x) for r in pool.of(ref) if r.seed in row["counted_seeds"]])) \
                    if row else math.nan
                cells.append("n/a" if math.isnan(m_u) else f"{m_u:.0f} / {r_u:.0f}")
        counted = by_axis[next(iter(TABLE_C_AXES))]["counted_seeds"] if by_axis else []
        out.append([method, ref, pool.seeds_cell(method, counted, ref), *cells])
    return out


GRPO_BY_N = {4: "grpo", 8: "grpo-n8", 16: "grpo-n16"}  # the GRPO presets a control of n may coincide with
CONTROL_KINDS = {"b": "GRPO n = 4 over as many prompts a step as match the samples",
                 "n": "GRPO at n = the method's samples a prompt"}


def updates_at(run: RunCurves, samples: float) -> float:
    """The updates (training steps) `run` had made when its cumulative generated samples reached `samples`."""
    return value_at(run, K.BUDGET_GENERATED_SAMPLES_CUM, samples, "step")


def control_pairs(pool: PoolRuns, method: str, kind: str) -> dict[int, tuple[RunCurves, RunCurves]]:
    """seed -> (the method's run, its budget-matched control of `kind`) in `pool`: the control's own run
    (`grpo-b.<method>`, `grpo-n.<method>`), or for kind n the group's GRPO preset of that n where the control
    coincided with it and was not run twice (flows/compare.py)."""
    own = {r.seed: r for r in pool.of(f"grpo-{kind}.{method}")}
    out = {}
    for run in pool.of(method):
        control = own.get(run.seed)
        if control is None and kind == "n":
            per_prompt = _mean(run.step_values(K.BUDGET_GENERATED_SAMPLES)) / float(run.config.get("prompts_per_step") or 1)
            preset = GRPO_BY_N.get(max(2, int(math.floor(per_prompt + 0.5)))) if not math.isnan(per_prompt) else None
            if preset != method:  # GRPO is no control of itself
                control = next((r for r in pool.of(preset or "") if r.seed == run.seed), None)
        if control is not None:
            out[run.seed] = (run, control)
    return out


def matched_rows(pool: PoolRuns) -> list[dict]:
    """One row per (method, control kind) with a control in `pool`: the paired difference at equal generated
    samples (every seed read at the row's one budget), the updates each side had made there, and the difference
    at the read step (equal updates)."""
    rows = []
    for method in pool.labels:
        if method in GRPO_BY_N.values() or method.startswith(tuple(f"grpo-{kind}." for kind in CONTROL_KINDS)):
            continue  # GRPO itself and the controls have no controls
        for kind in CONTROL_KINDS:
            pairs = control_pairs(pool, method, kind)
            if not pairs:
                if f"grpo-{kind}.{method}" in pool.labels:  # its control ran, the method is not read: say why
                    rows.append({"method": method, "kind": kind, "control": [f"grpo-{kind}.{method}"], "seeds": [],
                                 "seeds_cell": pool.seeds_cell(method, [], f"grpo-{kind}.{method}")})
                continue
            seeds = sorted(pairs)
            x = shared_budget(list(pairs.values()), K.BUDGET_GENERATED_SAMPLES_CUM)
            diffs = [value_at(m, K.BUDGET_GENERATED_SAMPLES_CUM, x) - value_at(c, K.BUDGET_GENERATED_SAMPLES_CUM, x)
                     for m, c in pairs.values()]
            at_step = [value_at(m, "step", pool.step) - value_at(c, "step", pool.step) for m, c in pairs.values()]
            controls = sorted({c.label for _, c in pairs.values()})
            rows.append({
                "method": method, "kind": kind, "control": controls, "seeds": seeds,
                "seeds_cell": pool.seeds_cell(method, seeds, controls[0] if len(controls) == 1 else None),
                "budget": x, "diffs": diffs, "ci": mean_ci(diffs), "step_ci": mean_ci(at_step),
                "updates": (_mean(np.array([updates_at(m, x) for m, _ in pairs.values()])),
                            _mean(np.array([updates_at(c, x) for _, c in pairs.values()]))),
                "samples_per_step": (_mean(np.array([_mean(m.step_values(K.BUDGET_GENERATED_SAMPLES)) for m, _ in pairs.values()])),
                                     _mean(np.array([_mean(c.step_values(K.BUDGET_GENERATED_SAMPLES)) for _, c in pairs.values()]))),
            })
    return rows


def table_c_matched(runs_by_pool: dict[str, list[RunCurves]]) -> str:
    """| pool | method | control | seeds | samples/step (method / control) | samples | updates (method / control) |
    diff at equal samples | diff at the read step |: each adaptive method against the GRPO that spends what it
    spends a step with as many updates."""
    lines = ["| pool | method | control | seeds | samples/step | read at samples | updates there | diff (equal samples) "
             "| diff (read step) |", "|" + "---|" * 9]
    for pool in read_pools(runs_by_pool).values():
        for row in matched_rows(pool):
            head = f"| {pool.name} | {row['method']} | {', '.join(row['control'])} ({row['kind']}) | {row['seeds_cell']} |"
            if not row["seeds"]:
                lines.append(head + " n/a |" * 5)
                continue
            m_s, c_s = row["samples_per_step"]
            m_u, c_u = row["updates"]
            lines.append(f"{head} {m_s:,.0f} / {c_s:,.0f} | {budget_cell([row['budget']])} | "
                         f"{m_u:.0f} / {c_u:.0f} | {diff_cell(*row['ci'])} | {diff_cell(*row['step_ci'])} |")
    return "\n".join(lines)


def table_c(runs_by_pool: dict[str, list[RunCurves]], reference: str = "grpo", pool_column: bool = True) -> str:
    """| pool | method | vs | seeds | samples read at | diff | tokens read at | diff |: one budget per row and axis.

    `pool_column=False` leaves the pool out, for a report of one group, where it says nothing (and its
    width pushed the table past a report's column)."""
    # short headers, so the table fits a report column; the caption says what a cell is
    header = ["method", "vs", "seeds", "samples", "diff", "updates", "tokens", "diff"]
    header = ["pool", *header] if pool_column else header
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for pool in read_pools(runs_by_pool).values():
        lines += ["| " + " | ".join([pool.name] * pool_column + cells) + " |" for cells in table_c_rows(pool, reference)]
    return "\n".join(lines)


def paper_tables_markdown(runs_by_pool: dict[str, list[RunCurves]], reference: str = "grpo",
                          order: list[str] | None = None) -> str:
    """All four tables with their captions, as one markdown document's body."""
    ks = sorted({_eval_k(r) for runs in runs_by_pool.values() for r in runs} - {None})
    k_text = f"k = {', '.join(str(k) for k in ks)}" if ks else "k"
    return "\n".join([
        "Where each pool is read (report/pools.py): every table reads a pool at the last evaluation of its "
        "longest runs; a run that stops before it is left out of all four and named in its rows.",
        "",
        *(f"- {pool.summary()}" for pool in read_pools(runs_by_pool).values()),
        "",
        f"### Table A: held-out accuracy ({k_text}; mean ± 95% t-interval over seeds, at the pool's read step)",
        "",
        "`generated samples` and `trained tokens`: the cumulative budget spent by that step, mean over the seeds.",
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
        "### Table C: each adaptive method against its budget-matched GRPO controls, at equal generated samples "
        "and equal updates (paired by seed, 95% t-interval; bold: the interval excludes 0)",
        "",
        "Controls (flows/compare.py, started once the method's run of a seed ends, with as many steps): `b` = "
        f"{CONTROL_KINDS['b']} (`grpo-b.<method>`); `n` = {CONTROL_KINDS['n']} over the same prompts a step "
        "(`grpo-n.<method>`, or the grid's GRPO n = 4, 8, 16 run where it coincides). `samples/step`: the mean over "
        "seeds, method / control; `read at samples`: the cumulative generated samples every seed of the row is read "
        "at; `updates there`: the steps each side had made by then (method / control); `diff (equal samples)`: the "
        "method's avg@k minus the control's there; `diff (read step)`: the same at the pool's read step, where both "
        "made the same updates. A `b` control draws more prompts a step, so over a fixed pool it sees each prompt "
        "more often than the method.",
        "",
        table_c_matched(runs_by_pool),
        "",
        f"### Table C': avg@k minus `{reference}`'s at equal budget, at UNEQUAL updates (paired by seed, 95% "
        "t-interval; bold: the interval excludes 0)",
        "",
        "`samples` and `tokens`: the cumulative generated samples and trained tokens every seed of the row is read "
        "at (the smallest final budget any of the row's runs reached on that axis); `diff`: the method's avg@k minus "
        f"the reference's there, by linear interpolation of the eval curves (report/paired.py); `updates`: the "
        f"steps the method and `{reference}` had made at those samples (method / reference). A method that draws "
        f"more samples a step is read here after fewer updates than `{reference}`: this column measures updates as "
        "much as sampling; Table C is the comparison at equal samples and updates.",
        "",
        table_c(runs_by_pool, reference),
        "",
        f"### Table D: steps and generated samples to reach `{reference}`'s final avg@k (mean ± 95% t-interval "
        "over the seeds that reached it; speed-up: geometric mean of paired per-seed ratios)",
        "",
        f"Target: the mean over seeds of `{reference}`'s avg@k at the pool's read step. Crossing: the first "
        "evaluation at or above it, interpolated linearly in steps and in generated samples from the one before; "
        f"a run that never reaches it counts as not reached; `{reference}`'s own crossing is its read step (its "
        f"whole run, as the paper reads faster convergence). Speed-up: `{reference}`'s crossing / the method's, "
        "per seed where the method reached it after step 0 (report/convergence.py). The target cell gives "
        f"`{reference}`'s gain over its last evaluation interval: where it is small, the target is crossed where "
        f"`{reference}`'s curve is flat, and a speed-up says where a flat curve is crossed rather than how fast.",
        "",
        table_d(runs_by_pool, reference),
        "",
    ])


def _eval_k(run: RunCurves) -> int | None:
    """The run's `eval_k`, from its config (config.yaml, as `load_run` read it or a saved run carries it)."""
    value = (run.config or {}).get("eval_k")
    return int(value) if value is not None else None


def _mean(values: np.ndarray) -> float:
    clean = values[~np.isnan(values)] if values.size else values
    return float(clean.mean()) if clean.size else math.nan
