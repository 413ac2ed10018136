"""Held-out accuracy and reward against the budget, as MLflow series whose `step` is the budget.

MLflow's line chart plots a metric against its step. Logging `eval/avg_at_k` again under
`vs_samples/eval_avg_at_k` with step = cumulative generated samples (and `vs_mflops/...` with step
= estimated compute) makes MLflow's own chart show the budget comparison live: one line per run,
one point per evaluation. docs/METRICS.md lists the keys.
"""

from __future__ import annotations

import time
from typing import Any

from mlflow.entities import Metric

from ada_core import metrics as K
from ada_core.sampling.budget import compute_flops
from ada_core.training import Callbacks
from flows.tracking.logger import RunLogger

VS_SAMPLES = "vs_samples"  # step = cumulative generated samples
VS_MFLOPS = "vs_mflops"  # step = estimated compute in MFLOPs (1e6 FLOPs: int64 steps hold 9e24 FLOPs)
BUDGET_SERIES = {K.EVAL_AVG_AT_K: "eval_avg_at_k", K.EVAL_PASS_AT_K: "eval_pass_at_k", K.REWARD_MEAN: "reward_mean"}
CUMULATIVE_KEYS = (K.BUDGET_GENERATED_SAMPLES_CUM, K.BUDGET_GENERATED_TOKENS_CUM, K.BUDGET_TRAINED_TOKENS_CUM,
                   K.BUDGET_LOGPROB_TOKENS_CUM)


class BudgetAxes:
    """Callbacks that add `vs_samples/<metric>` and `vs_mflops/<metric>` for accuracy and reward.

    `totals` is the run's live cumulative counters (`RunState.totals`), read when a metric arrives,
    so the step-0 evaluation sits at 0 samples and a resumed run continues from its checkpoint. The
    points go out with the run's other metrics (`RunLogger.hold`): at the checkpoint that covers
    their training step, so a resume never leaves two points for one evaluation.
    """

    def __init__(self, run_logger: RunLogger, totals: dict[str, float], num_params: int):
        self.run_logger, self.totals, self.num_params = run_logger, totals, num_params

    def steps(self, totals: dict[str, float] | None = None) -> dict[str, int]:
        """The budget steps of each axis at `totals` (default the live counters)."""
        totals = self.totals if totals is None else totals
        samples = int(totals.get(K.BUDGET_GENERATED_SAMPLES_CUM, 0.0))
        flops = compute_flops(self.num_params, totals.get(K.BUDGET_GENERATED_TOKENS_CUM, 0.0),
                              totals.get(K.BUDGET_TRAINED_TOKENS_CUM, 0.0), totals.get(K.BUDGET_LOGPROB_TOKENS_CUM, 0.0))
        return {VS_SAMPLES: samples, VS_MFLOPS: int(round(flops / 1e6))}

    def _points(self, metrics: dict[str, float], totals: dict[str, float] | None = None) -> list[Metric]:
        now = int(time.time() * 1000)
        return [Metric(f"{axis}/{name}", float(metrics[key]), now, budget_step)
                for axis, budget_step in self.steps(totals).items() for key, name in BUDGET_SERIES.items()
                if key in metrics]

    def _log(self, step: int, metrics: dict[str, float]) -> None:
        items = self._points(metrics)
        if items:
            self.run_logger.hold(step, items)

    def send_missing(self, rows: list[dict[str, Any]]) -> int:
        """Send the points of metrics.jsonl's rows that MLflow lacks (a crash between a checkpoint and its
        send): each row's points rebuilt as they were made live, at the run totals of its step (a step row
        carries them; an evaluation sits at its step's). Returns how many points went out."""
        totals = {key: 0.0 for key in CUMULATIVE_KEYS}
        wanted: list[Metric] = []
        for row in rows:
            totals.update({k: row[k] for k in CUMULATIVE_KEYS if k in row})
            if K.TIME_STEP_S in row:  # a step row: on_step sends its reward only
                wanted += self._points({K.REWARD_MEAN: row[K.REWARD_MEAN]} if K.REWARD_MEAN in row else {}, totals)
            else:
                wanted += self._points(row, totals)
        client, run_id = self.run_logger.client, self.run_logger.run_id
        seen = {key: {m.step for m in client.get_metric_history(run_id, key)} for key in {m.key for m in wanted}}
        missing = [m for m in wanted if m.step not in seen[m.key]]
        if missing:
            self.run_logger.send([missing])
        return len(missing)

    def on_step(self, step: int, metrics: dict[str, float]) -> None:
        self._log(step, {K.REWARD_MEAN: metrics[K.REWARD_MEAN]} if K.REWARD_MEAN in metrics else {})

    def on_eval(self, step: int, metrics: dict[str, float], generations: list[dict[str, Any]]) -> None:
        self._log(step, metrics)

    def callbacks(self) -> Callbacks:
        return Callbacks(on_step=self.on_step, on_eval=self.on_eval)
