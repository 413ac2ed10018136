"""Table D: the steps and generated samples each method needs to reach GRPO n = 4's final held-out
accuracy (the paper's "up to 2x faster convergence", arXiv 2510.04996v3), with 95% intervals over seeds.

Definitions, for one pool, over the runs that reach the pool's read step (report/pools.py):

- **Target**: the mean over seeds of the reference's (GRPO n = 4, `grpo`) held-out avg@k at the pool's
  read step, which is the final evaluation of every run read. Each row prints it, with that step.
- **Crossing**: the first evaluation at which a run's held-out avg@k is at or above the target. With
  that evaluation at step s1, cumulative generated samples g1, accuracy y1, and the evaluation before
  it at s0, g0, y0 (so y0 < target <= y1), the crossing is interpolated linearly on both axes:
  f = (target - y0) / (y1 - y0), steps = s0 + f * (s1 - s0), samples = g0 + f * (g1 - g0).
  A run whose first evaluation (step 0) already reaches the target crosses at step 0, 0 samples.
- **The reference's own crossing** is its read step (and its samples there), in every seed: its final
  accuracy is what it reaches by the end of its run, as the paper reads "faster convergence" (steps a
  method needs for GRPO's final accuracy against GRPO's whole run). Interpolating the reference onto its
  own mean would leave out its seeds below the mean and pair the speed-up on the rest only.
- **Not reached**: a run with no evaluation at or above the target. It is counted in the row
  (`2 of 3 seeds`, naming the others) and left out of the means: the intervals are over the seeds
  that reached the target only, so read them with that count.
- **Intervals**: mean ± the half-width of a 95% t-interval over the seeds that reached the target.
- **Speed-up**: paired by seed. For each seed where both the method and the reference reached the
  target after step 0, the ratio reference crossing / method crossing, in steps and separately in
  generated samples (above 1: the method gets there sooner). The cell is the geometric mean of the
  ratios with the 95% t-interval of their mean logarithm, exponentiated, and the seeds it used.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ada_core import metrics as K
from report.curves import RunCurves
from report.paired import ci_cell, mean_ci, reference_for, value_at
from report.pools import PoolRuns, read_pools

TOLERANCE = 1e-12  # a run whose final accuracy is the target itself reaches it despite the mean's rounding


@dataclass(frozen=True)
class Crossing:
    """Where a run first reached the target: interpolated step and cumulative generated samples."""

    steps: float
    samples: float


def crossing(run: RunCurves, target: float) -> Crossing | None:
    """The run's first crossing of `target` (see the module docstring); None when it never reaches it."""
    before = None
    for point in (p for p in run.points if K.EVAL_AVG_AT_K in p):
        if point[K.EVAL_AVG_AT_K] >= target - TOLERANCE:
            if before is None:
                return Crossing(point["step"], point.get(K.BUDGET_GENERATED_SAMPLES_CUM, math.nan))
            y0, y1 = before[K.EVAL_AVG_AT_K], point[K.EVAL_AVG_AT_K]  # y0 < target <= y1
            f = min(1.0, (target - y0) / (y1 - y0))
            return Crossing(*(_between(before, point, f, key) for key in ("step", K.BUDGET_GENERATED_SAMPLES_CUM)))
        before = point
    return None


def _between(before: dict[str, float], point: dict[str, float], f: float, key: str) -> float:
    start = before.get(key, math.nan)
    return start + f * (point.get(key, math.nan) - start)


def target_of(pool: PoolRuns, reference: str) -> float:
    """The mean over seeds of the reference's held-out avg@k at the pool's read step (NaN: no reference run)."""
    mean, _ = mean_ci([value_at(r, "step", pool.step) for r in pool.of(reference)])
    return mean


def ratio_ci(ratios: list[float]) -> tuple[float, float, float]:
    """Geometric mean of positive ratios and its 95% interval (the t-interval of the mean log, exponentiated)."""
    mean, half = mean_ci([math.log(r) for r in ratios])
    return math.exp(mean), math.exp(mean - half), math.exp(mean + half)


def speed_up(ours: dict[int, Crossing], theirs: dict[int, Crossing], axis: str) -> tuple[list[int], list[float]]:
    """Per seed where both crossed after the start: reference's crossing / ours on `axis` (`steps`, `samples`)."""
    seeds = [s for s in ours if s in theirs and getattr(ours[s], axis) > 0 and getattr(theirs[s], axis) > 0]
    return seeds, [getattr(theirs[s], axis) / getattr(ours[s], axis) for s in seeds]


def speed_up_cells(is_reference: bool, ours: dict[int, Crossing], theirs: dict[int, Crossing]) -> list[str]:
    """The two speed-up cells of a row: in steps, then in generated samples."""
    if is_reference:
        return ["×1 (the reference)"] * 2
    return [speed_up_cell(*speed_up(ours, theirs, axis)) for axis in ("steps", "samples")]


def speed_up_cell(seeds: list[int], ratios: list[float]) -> str:
    if not ratios:
        return "n/a (no seed where both reached it after step 0)"
    mean, lo, hi = ratio_ci(ratios)
    if len(ratios) < 2:
        return f"×{mean:.2f} (one seed: {seeds[0]})"
    return f"×{mean:.2f} [{lo:.2f}, {hi:.2f}] (seeds {','.join(map(str, seeds))})"


def crossings_of(pool: PoolRuns, label: str, target: float, reference: bool = False) -> dict[int, Crossing | None]:
    """Each seed's crossing of `target`; the reference's is its read step (the module docstring)."""
    if reference:
        return {r.seed: Crossing(pool.step, value_at(r, "step", pool.step, K.BUDGET_GENERATED_SAMPLES_CUM))
                for r in pool.of(label)}
    return {r.seed: crossing(r, target) for r in pool.of(label)}


def reached_cell(pool: PoolRuns, label: str, crossings: dict[int, Crossing | None]) -> str:
    """`2 of 3 seeds (seed 1: not reached)`; a seed the pool has but this method's row lacks says why."""
    notes = []
    for seed in pool.seeds:
        if seed not in crossings:
            notes.append(f"seed {seed}: {pool.why_not(label, seed)}")
        elif crossings[seed] is None:
            notes.append(f"seed {seed}: not reached")
    reached = sum(c is not None for c in crossings.values())
    return f"{reached} of {len(crossings)} seeds" + (f" ({'; '.join(notes)})" if notes else "")


def table_d_rows(pool: PoolRuns, reference: str = "grpo") -> list[list[str]]:
    """One row of cells per method of the pool (Table D's columns after `pool`)."""
    rows = []
    for label in pool.labels:
        ref = reference_for(label, reference)
        target = target_of(pool, ref)
        if math.isnan(target):
            rows.append([f"n/a (no {ref} run is read)", label, *["n/a"] * 5])
            continue
        ours = crossings_of(pool, label, target, reference=label == ref)
        theirs = crossings_of(pool, ref, target, reference=True)
        mine = {s: c for s, c in ours.items() if c is not None}
        rows.append([
            f"{target:.3f} ({ref} at step {pool.step:g}; {last_gain(pool, ref)})", label, reached_cell(pool, label, ours),
            ci_cell([c.steps for c in mine.values()], 1), ci_cell([c.samples for c in mine.values()], 0),
            *speed_up_cells(label == ref, mine, theirs),
        ])
    return rows


def last_gain(pool: PoolRuns, label: str) -> str:
    """How much `label`'s curve still rose over its last evaluation interval: `+0.008 [+0.005, +0.011] over steps
    80-100` (mean and 95% t-interval over seeds). A target crossed where this is small is crossed where the
    reference's curve is flat: a speed-up read there says where a flat curve is crossed, not how fast."""
    runs = pool.of(label)
    steps = sorted({p["step"] for r in runs for p in r.points if K.EVAL_AVG_AT_K in p and p["step"] < pool.step})
    if not runs or not steps:
        return "no earlier evaluation"
    before = steps[-1]
    mean, half = mean_ci([value_at(r, "step", pool.step) - value_at(r, "step", before) for r in runs])
    spread = "" if math.isnan(half) else f" [{mean - half:+.3f}, {mean + half:+.3f}]"
    return f"its gain over steps {before:g}-{pool.step:g}: {mean:+.3f}{spread}"


def table_d(runs_by_pool: dict[str, list[RunCurves]], reference: str = "grpo") -> str:
    """| pool | target | method | reached | steps to target | generated samples to target | speed-ups |"""
    lines = [f"| pool | target: {reference}'s final avg@k (mean) | method | reached | steps to target (95% CI) | "
             f"generated samples to target (95% CI) | speed-up in steps vs {reference} (95% CI) | "
             f"speed-up in samples vs {reference} (95% CI) |", "|" + "---|" * 8]
    for name, pool in read_pools(runs_by_pool).items():
        lines += [f"| {name} | " + " | ".join(cells) + " |" for cells in table_d_rows(pool, reference)]
    return "\n".join(lines)

