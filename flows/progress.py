"""Progress a user sees in the Prefect UI: a progress artifact (step k of N) and a latest-metrics table.

Both are created once per flow run and updated in place (the table through the artifact API's
PATCH), so the flow run's Artifacts tab holds one bar and one table, not one per step. Updates
are throttled to `min_interval_s` (the last step and every evaluation always go through): each is
an API call, and a tiny-model step takes a few hundred ms.

ada_core reports progress through plain callbacks (`progress(done, total)`); this module turns
them into artifacts, so ada_core never imports Prefect.
"""

from __future__ import annotations

import json
import math
import time
from typing import Any

from ada_core import metrics as K
from ada_core.training import Callbacks
from tasks.progress import ProgressArtifact

# The latest-metrics table: (metric key, readable name), in the order shown.
TABLE_METRICS: list[tuple[str, str]] = [
    (K.EVAL_AVG_AT_K, "held-out accuracy (avg@k)"),
    (K.EVAL_PASS_AT_K, "held-out pass@k"),
    (K.REWARD_MEAN, "reward (round-1 mean)"),
    (K.SAMPLER_EFFECTIVE_RATIO, "effective ratio"),
    (K.BUDGET_GENERATED_SAMPLES, "generated samples this step"),
    (K.BUDGET_GENERATED_SAMPLES_CUM, "generated samples so far"),
    (K.TRAIN_LOSS, "loss"),
    (K.TIME_STEP_S, "step time (s)"),
    (K.TIME_ELAPSED_S, "elapsed (s)"),
]


class MetricsTable:
    """One Prefect table artifact with the latest value of each `TABLE_METRICS` key and its step."""

    def __init__(self, what: str):
        self.what = what
        self._id = None
        self._rows: dict[str, dict[str, Any]] = {}

    def update(self, step: int, metrics: dict[str, float]) -> None:
        from prefect.artifacts import create_table_artifact
        from prefect.client.orchestration import get_client
        from prefect.client.schemas.actions import ArtifactUpdate

        for key, name in TABLE_METRICS:
            if key in metrics and not math.isnan(float(metrics[key])):
                self._rows[key] = {"metric": name, "key": key, "value": round(float(metrics[key]), 4), "step": step}
        table = [self._rows[key] for key, _ in TABLE_METRICS if key in self._rows]
        if not table:
            return
        description = f"{self.what}: latest metrics (after step {step})"
        if self._id is None:
            self._id = create_table_artifact(table=table, description=description)
        else:
            with get_client(sync_client=True) as client:
                client.update_artifact(self._id, ArtifactUpdate(data=json.dumps(table), description=description))


class TrainProgress:
    """Trainer callbacks that keep a run's progress bar and metrics table current."""

    def __init__(self, label: str, total_steps: int, min_interval_s: float = 2.0):
        self.total = total_steps
        self.bar = ProgressArtifact(f"train {label}", "step", min_interval_s)
        self.table = MetricsTable(f"train {label}")
        self.min_interval_s = min_interval_s
        self._last_table = -math.inf

    def start(self, step: int) -> None:
        self.bar.update(step, self.total, force=True)

    def on_step(self, step: int, metrics: dict[str, float]) -> None:
        self.bar.update(step, self.total)
        now = time.monotonic()
        if step == self.total or now - self._last_table >= self.min_interval_s:
            self._last_table = now
            self.table.update(step, metrics)

    def on_eval(self, step: int, metrics: dict[str, float], generations: list[dict[str, Any]]) -> None:
        self.table.update(step, metrics)

    def callbacks(self) -> Callbacks:
        return Callbacks(on_step=self.on_step, on_eval=self.on_eval)


def chain(*callbacks: Callbacks) -> Callbacks:
    """One Callbacks that calls each given one's hooks in order (None hooks skipped)."""

    def fan(name: str):
        hooks = [getattr(c, name) for c in callbacks if getattr(c, name) is not None]
        if not hooks:
            return None

        def call(*args: Any) -> None:
            for hook in hooks:
                hook(*args)

        return call

    return Callbacks(on_step=fan("on_step"), on_eval=fan("on_eval"), on_checkpoint=fan("on_checkpoint"))
