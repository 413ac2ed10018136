"""Runs as curves: a run folder's metrics.jsonl merged into one point per step, and the axes the
report plots them against.

A run folder is read through `ada_core.run.files` (metrics.jsonl, run_info.json, config.yaml) and
`ada_core.run.checkpoints`, so this works offline and on runs the CLI made.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from ada_core import metrics as K
from ada_core.run.checkpoints import latest_checkpoint
from ada_core.run.files import CONFIG, read_metrics, read_run_info
from ada_core.sampling.budget import compute_flops

FLOPS_CUM = "compute/flops_cum"  # derived here from the budget counters; not logged by the trainer
STEP_TIME_CUM = "compute/step_time_cum"  # derived here: cumulative generate + reward + update + sync seconds

X_AXES: dict[str, tuple[str, str]] = {
    "step": ("step", "training step"),
    "generated_samples": (K.BUDGET_GENERATED_SAMPLES_CUM, "cumulative generated samples"),
    "trained_tokens": (K.BUDGET_TRAINED_TOKENS_CUM, "cumulative trained tokens"),
    "wall_time": (K.TIME_ELAPSED_S, "wall time (s)"),
    "compute": (FLOPS_CUM, "estimated compute (FLOPs)"),
    "step_time": (STEP_TIME_CUM, "measured compute: cumulative generate + reward + update + sync (s)"),
}
# The budget axes of the paired differences (report/paired.py).
PAIRED_AXES = {
    "generated samples": K.BUDGET_GENERATED_SAMPLES_CUM,
    "trained tokens": K.BUDGET_TRAINED_TOKENS_CUM,
    "FLOPs": FLOPS_CUM,
    "measured step time": STEP_TIME_CUM,
    "step": "step",
}
Y_AXES: dict[str, str] = {K.EVAL_AVG_AT_K: "held-out accuracy (avg@k)", K.REWARD_MEAN: "reward (round-1 mean)"}
TIME_SPLIT = [K.TIME_GENERATE_S, K.TIME_REWARD_S, K.TIME_UPDATE_S, K.TIME_SYNC_S]
CUMULATIVE = [
    K.BUDGET_GENERATED_SAMPLES_CUM, K.BUDGET_GENERATED_TOKENS_CUM, K.BUDGET_TRAINED_SAMPLES_CUM,
    K.BUDGET_TRAINED_TOKENS_CUM, K.BUDGET_LOGPROB_TOKENS_CUM, K.TIME_ELAPSED_S,
]


@dataclass
class RunCurves:
    """One run's metrics on a step timeline: `points[i]` describes the run after step `points[i]['step']`."""

    label: str
    seed: int
    run_dir: Path
    num_params: int | None
    points: list[dict[str, float]]
    config: dict[str, Any] = field(default_factory=dict)
    """The run's config.yaml ({} when it has none): the report lists where the variants' configs differ."""

    def series(self, x_key: str, y_key: str) -> tuple[np.ndarray, np.ndarray]:
        pts = [p for p in self.points if x_key in p and y_key in p]
        return np.array([p[x_key] for p in pts], dtype=float), np.array([p[y_key] for p in pts], dtype=float)

    def step_values(self, key: str) -> np.ndarray:
        """`key` over training steps only (the step-0 evaluation point excluded)."""
        return np.array([p[key] for p in self.points if p["step"] > 0 and key in p], dtype=float)

    def last(self, key: str) -> float:
        values = [p[key] for p in self.points if key in p]
        return float(values[-1]) if values else math.nan


def merge_rows(rows: list[dict[str, float]], num_params: int | None = None) -> list[dict[str, float]]:
    """Merge metrics.jsonl rows into one point per step, cumulative counters starting at 0 at step 0.

    metrics.jsonl holds a step row (the step's metrics) and, on eval steps, an eval row with the
    same step number. Example: rows `{step 0, eval}`, `{step 1, ...}`, `{step 1, eval}` ->
    points `[{step 0, eval, *_cum 0}, {step 1, ..., eval}]`. With `num_params`, each point also
    gets `compute/flops_cum` from `ada_core.sampling.budget.compute_flops`.
    """
    by_step: dict[int, dict[str, float]] = {}
    for row in rows:
        by_step.setdefault(int(row["step"]), {}).update(row)
    points = []
    step_time = 0.0
    for step in sorted(by_step):
        point = dict(by_step[step])
        point["step"] = float(step)
        step_time += sum(point.get(key, 0.0) for key in TIME_SPLIT) if step > 0 else 0.0
        point[STEP_TIME_CUM] = step_time
        if step == 0:
            for key in CUMULATIVE:
                point.setdefault(key, 0.0)
        if num_params is not None and K.BUDGET_GENERATED_TOKENS_CUM in point:
            point[FLOPS_CUM] = compute_flops(
                num_params,
                point[K.BUDGET_GENERATED_TOKENS_CUM],
                point.get(K.BUDGET_TRAINED_TOKENS_CUM, 0.0),
                point.get(K.BUDGET_LOGPROB_TOKENS_CUM, 0.0),
            )
        points.append(point)
    return points


def count_params(run_dir: Path) -> int | None:
    """Parameter count: from run_info.json, else from the newest checkpoint's safetensors headers."""
    value = read_run_info(run_dir).get("num_params")
    if value:
        return int(value)
    checkpoint = latest_checkpoint(run_dir)
    if checkpoint is None:
        return None
    from safetensors import safe_open

    total = 0
    for shard in (checkpoint / "hf").glob("*.safetensors"):
        with safe_open(str(shard), framework="numpy") as fh:
            for name in fh.keys():
                total += int(np.prod(fh.get_slice(name).get_shape()))
    return total or None


def load_run(run_dir: str | Path, label: str | None = None, seed: int | None = None) -> RunCurves:
    """A run directory's curves; label and seed default to run_info.json, then config.yaml."""
    run_dir = Path(run_dir)
    rows = read_metrics(run_dir)
    if not rows:
        raise FileNotFoundError(f"{run_dir}: no metrics.jsonl rows; is this a run directory?")
    info = read_run_info(run_dir)
    config = yaml.safe_load((run_dir / CONFIG).read_text()) if (run_dir / CONFIG).is_file() else {}
    label = label or info.get("label") or config.get("preset") or run_dir.name
    seed = seed if seed is not None else int(info.get("seed", config.get("seed", 0)))
    num_params = count_params(run_dir)
    return RunCurves(label, seed, run_dir, num_params, merge_rows(rows, num_params), config=config or {})
