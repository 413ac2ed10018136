"""Held-out accuracy and reward against the budget, as MLflow series whose `step` is the budget.

MLflow's line chart plots a metric against its step. Logging `accuracy/heldout_avg_at_k` again under
`accuracy/vs_samples/heldout_avg_at_k` with step = cumulative generated samples (and
`accuracy/vs_mflops/...` with step = estimated compute) makes MLflow's own chart show the budget
comparison live. docs/METRICS.md lists the keys (`ada_core.metrics.VS_SAMPLES`, `VS_MFLOPS`).

Why a shared grid: an adaptive sampler spends a different number of samples each step, so two seeds
never evaluate at the same budget, and MLflow's group-by (over seeds, by `ada.variant`) averages the
runs that have a point at each step: with every run on its own x values, it draws one run at a time,
a sawtooth. So each run's curve is read off on one grid that every run, seed and method shares
(`grid_points`: 0, then 1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8 times each power of ten; the same for
samples and for MFLOPs, whatever the scale), by linear interpolation between two of the run's own
points, never beyond its last: MLflow's group-by then averages runs that all have each point and
draws one line with a band.
"""

from __future__ import annotations

import time
from typing import Any

from mlflow.entities import Metric

from ada_core import metrics as K
from ada_core.sampling.budget import compute_flops
from ada_core.training import Callbacks
from flows.tracking.logger import RunLogger

BUDGET_SERIES = (K.EVAL_AVG_AT_K, K.EVAL_PASS_AT_K, K.REWARD_MEAN)
CUMULATIVE_KEYS = (K.BUDGET_GENERATED_SAMPLES_CUM, K.BUDGET_GENERATED_TOKENS_CUM, K.BUDGET_TRAINED_TOKENS_CUM,
                   K.BUDGET_LOGPROB_TOKENS_CUM)
MANTISSAS = (10, 12, 15, 20, 25, 30, 40, 50, 60, 80)  # in tenths: ten round numbers a decade, 20-25% apart


def grid_points(low: float, high: float) -> list[int]:
    """The shared grid's points g with low < g <= high (0, then MANTISSAS/10 x 10^k, integers only), ascending.

    grid_points(-1, 130) = [0, 1, 2, 3, 4, 5, 6, 8, 10, 12, 15, 20, ..., 100, 120]."""
    points = [0] if low < 0 <= high else []
    scale = 1
    while scale <= max(high, 0) * 10:
        for tenths in MANTISSAS:
            value, rest = divmod(tenths * scale, 10)
            if not rest and low < value <= high:
                points.append(value)
        scale *= 10
    return points


class BudgetGrid:
    """Each series' points on the shared grid, from the run's own (budget, value) points as they come.

    A run's first point is kept when it lies on the grid (the step-0 evaluation, at budget 0). Between
    two points every grid value in between is read off by linear interpolation, nothing beyond the
    last point: any two runs have points at the same budgets over the range both cover. From budget 0
    to a first evaluation at 1,280 samples that is 29 points on one straight line (1, 2, ..., 1,200),
    what MLflow would draw between the two anyway, and what lets a run whose first evaluation came at
    another budget share them.
    """

    def __init__(self) -> None:
        self.last: dict[str, tuple[float, float]] = {}

    def add(self, series: str, budget: float, value: float) -> list[tuple[int, float]]:
        """The grid points (budget, value) of `series` that its point (budget, value) completes."""
        last = self.last.get(series)
        if last is not None and budget <= last[0]:
            return []  # no budget spent since: nothing new to read off
        self.last[series] = (budget, value)
        if last is None:
            return [(int(budget), value)] if grid_points(budget - 1, budget) == [budget] else []
        x0, y0 = last
        return [(g, y0 + (value - y0) * (g - x0) / (budget - x0)) for g in grid_points(x0, budget)]


class BudgetAxes:
    """Callbacks that add `accuracy/vs_samples/<name>` and `accuracy/vs_mflops/<name>` for accuracy and reward.

    `totals` is the run's live cumulative counters (`RunState.totals`), read when a metric arrives,
    so the step-0 evaluation sits at 0 samples and a resumed run continues from its checkpoint. The
    points go out with the run's other metrics (`RunLogger.hold`): at the checkpoint that covers
    their training step, so a resume never leaves two points for one evaluation. A resume first
    replays the run's metrics.jsonl (`send_missing`), which brings the grid to where the checkpoint
    left it, so the points after it are the ones an uninterrupted run sends.
    """

    def __init__(self, run_logger: RunLogger, totals: dict[str, float], num_params: int):
        self.run_logger, self.totals, self.num_params = run_logger, totals, num_params
        self.grid = BudgetGrid()

    def budgets(self, totals: dict[str, float] | None = None) -> dict[str, float]:
        """The budget spent on each axis at `totals` (default the live counters)."""
        totals = self.totals if totals is None else totals
        flops = compute_flops(self.num_params, totals.get(K.BUDGET_GENERATED_TOKENS_CUM, 0.0),
                              totals.get(K.BUDGET_TRAINED_TOKENS_CUM, 0.0), totals.get(K.BUDGET_LOGPROB_TOKENS_CUM, 0.0))
        return {K.VS_SAMPLES: totals.get(K.BUDGET_GENERATED_SAMPLES_CUM, 0.0), K.VS_MFLOPS: flops / 1e6}

    def _points(self, metrics: dict[str, float], totals: dict[str, float] | None = None) -> list[Metric]:
        now = int(time.time() * 1000)
        return [Metric(series, float(value), now, step)
                for axis, budget in self.budgets(totals).items() for key in BUDGET_SERIES if key in metrics
                for series in [K.budget_axis_key(axis, key)]
                for step, value in self.grid.add(series, budget, metrics[key])]

    def _log(self, step: int, metrics: dict[str, float]) -> None:
        items = self._points(metrics)
        if items:
            self.run_logger.hold(step, items)

    def send_missing(self, rows: list[dict[str, Any]]) -> int:
        """Replay metrics.jsonl's rows (a resume's, trimmed to its checkpoint) through the grid and send the
        points MLflow lacks (a crash between a checkpoint and its send): each row's points as they were made
        live, at the run totals of its step (a step row carries them; an evaluation sits at its step's).
        Returns how many points went out; the grid then stands where the checkpoint left it."""
        self.grid = BudgetGrid()
        totals = {key: 0.0 for key in CUMULATIVE_KEYS}
        wanted: list[Metric] = []
        for row in rows:
            totals.update({k: row[k] for k in CUMULATIVE_KEYS if k in row})
            wanted += self._points(_series_of(row), totals)
        client, run_id = self.run_logger.client, self.run_logger.run_id
        seen = {key: {m.step for m in client.get_metric_history(run_id, key)} for key in {m.key for m in wanted}}
        missing = [m for m in wanted if m.step not in seen[m.key]]
        if missing:
            self.run_logger.send([missing])
        return len(missing)

    def on_step(self, step: int, metrics: dict[str, float]) -> None:
        self._log(step, _series_of(metrics))

    def on_eval(self, step: int, metrics: dict[str, float], generations: list[dict[str, Any]]) -> None:
        self._log(step, metrics)

    def callbacks(self) -> Callbacks:
        return Callbacks(on_step=self.on_step, on_eval=self.on_eval)


def _series_of(row: dict[str, Any]) -> dict[str, float]:
    """What a metrics row adds to the budget series: a step row its reward (its other keys are not series),
    an evaluation row its accuracy."""
    if K.TIME_STEP_S in row:
        return {K.REWARD_MEAN: row[K.REWARD_MEAN]} if K.REWARD_MEAN in row else {}
    return {k: v for k, v in row.items() if k in BUDGET_SERIES}
