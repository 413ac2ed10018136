"""What a run logs: its params, metrics, generation tables and checkpoints (`RunLogger`).

ada_core returns plain metric dicts and writes run directories; this module turns them into the
rows of an MLflow run.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mlflow import MlflowClient
from mlflow.entities import Metric, Param

from ada_core import metrics as K
from ada_core.config import TrainConfig, flat_params
from ada_core.config.applies import not_applicable
from ada_core.run.checkpoints import checkpoint_dirs, verify_checkpoint
from ada_core.training import Callbacks

_MAX_PARAMS_PER_BATCH = 100  # MLflow's log_batch limit
_MAX_METRICS_PER_BATCH = 1000


def dataset_hash(dataset: str) -> str:
    """sha256 (first 16 hex) of a dataset file's bytes, or of the generator name (`ada_core.data.data_digest`)."""
    from ada_core.data import data_digest

    return data_digest(dataset)


NOT_APPLICABLE = "n/a"


def run_facts(curate: bool) -> dict[str, object]:
    """What a run's applicability depends on besides its config (ada_core/config/applies.py)."""
    from ada_core.config.applies import run_facts as facts_of

    return facts_of(curate)


def unused_fields(config: TrainConfig, facts: dict[str, object]) -> set[str]:
    """Dotted config fields a run of `config` never reads: each field's declared applicability (the schema).
    `facts` (`run_facts`) must decide every rule: an undecided one raises, it is never logged as read."""
    return not_applicable(config, facts)


def run_params(config: TrainConfig, variant: str, dataset_digest: str, extra: dict[str, Any] | None = None, *,
               facts: dict[str, object]) -> dict[str, Any]:
    """The headline params (N, M, n, variant, sampler, advantage, model, dataset_hash, seed) + the flat config.

    Params the run does not read are logged as `n/a`, headline and dotted alike, as each field declares
    (`json_schema_extra` in ada_core/config/schema.py): N and M for GRPO's `fixed`, the `budgeted` fields for
    Ada, `rollout.vllm.*` for the transformers engine. `facts` (`run_facts`) says what the config cannot: whether
    the flow curates, which device runs it; it is required: a field whose rule it cannot decide is an error, not
    a value logged as read.
    """
    params: dict[str, Any] = flat_params(config)
    unused = unused_fields(config, facts)
    params.update({name: NOT_APPLICABLE for name in unused if name in params})
    params.update({
        "N": NOT_APPLICABLE if "sampler.N" in unused else config.sampler.N,
        "M": NOT_APPLICABLE if "sampler.M" in unused else config.sampler.M,
        "n": config.sampler.n,
        "variant": variant,
        "sampler": config.sampler.name,
        "advantage": config.advantage.name,
        "model": config.model,
        "dataset_hash": dataset_digest,
        "seed": config.seed,
    })
    params.update(extra or {})
    return params


def log_params(client: MlflowClient, run_id: str, params: dict[str, Any]) -> None:
    items = [Param(str(k), str(v)) for k, v in params.items()]
    for i in range(0, len(items), _MAX_PARAMS_PER_BATCH):
        client.log_batch(run_id, params=items[i : i + _MAX_PARAMS_PER_BATCH])


def log_metrics(client: MlflowClient, run_id: str, metrics: dict[str, float], step: int) -> None:
    now = int(time.time() * 1000)
    items = [Metric(k, float(v), now, step) for k, v in metrics.items()]
    for i in range(0, len(items), _MAX_METRICS_PER_BATCH):
        client.log_batch(run_id, metrics=items[i : i + _MAX_METRICS_PER_BATCH])


def log_generations(client: MlflowClient, run_id: str, step: int, rows: list[dict[str, Any]]) -> None:
    """Sampled eval generations as an MLflow table (one JSON artifact per evaluation)."""
    if not rows:
        return
    columns = {key: [row.get(key) for row in rows] for key in rows[0]}
    client.log_table(run_id, data=columns, artifact_file=f"generations/step_{step:06d}.json")


def log_accuracy_table(client: MlflowClient, run_id: str, markdown: str, metrics: dict[str, float],
                       step: int = 0) -> None:
    """A suite's accuracy table as `suite/accuracy_step_N.md` and as an MLflow table (`suite/accuracy_step_N.json`:
    one row per benchmark, then the weighted average)."""
    from ada_core.data.suites import PREFIX, WEIGHTED_KEY

    client.log_text(run_id, markdown, f"suite/accuracy_step_{step:06d}.md")
    benches = sorted({key.split("/")[1] for key in metrics if key.startswith(PREFIX + "/")} - {"weighted"})
    rows = [{"benchmark": b, "prompts": int(metrics[f"{PREFIX}/{b}/prompts"]), "avg_at_k": metrics[f"{PREFIX}/{b}/avg_at_k"],
             "pass_at_k": metrics[f"{PREFIX}/{b}/pass_at_k"]} for b in benches]
    rows.append({"benchmark": "weighted_average", "prompts": sum(r["prompts"] for r in rows),
                 "avg_at_k": metrics[WEIGHTED_KEY], "pass_at_k": None})
    client.log_table(run_id, data={key: [r[key] for r in rows] for key in rows[0]},
                     artifact_file=f"suite/accuracy_step_{step:06d}.json")


def checkpoint_artifact_path(checkpoint: Path) -> str:
    return f"checkpoints/{checkpoint.name}"


def log_checkpoint(client: MlflowClient, run_id: str, checkpoint: Path) -> str:
    """Upload a checkpoint folder; returns its run-relative artifact path."""
    artifact_path = checkpoint_artifact_path(checkpoint)
    client.log_artifacts(run_id, str(checkpoint), artifact_path=artifact_path)
    return artifact_path


def missing_files(client: MlflowClient, run_id: str, checkpoint: Path) -> list[str]:
    """The files of a local checkpoint folder that its MLflow artifact lacks, or holds at another size."""
    held: dict[str, int | None] = {}
    todo = [checkpoint_artifact_path(checkpoint)]
    while todo:
        for info in client.list_artifacts(run_id, todo.pop()):
            if info.is_dir:
                todo.append(info.path)
            else:
                held[info.path] = info.file_size
    root = checkpoint_artifact_path(checkpoint)
    return sorted(rel for path in checkpoint.rglob("*") if path.is_file()
                  if held.get(f"{root}/{(rel := path.relative_to(checkpoint).as_posix())}") != path.stat().st_size)


class RunLogger:
    """The trainer callbacks of one MLflow run: step and eval metrics, generation tables, checkpoints.

    Metric rows are held until the checkpoint that covers them and sent then, each with its step,
    whole rows per `log_batch` (so a crash never leaves half a row). Why not as they come: MLflow's
    metric history is append-only, and a resume re-runs the steps after its checkpoint; rows sent
    for those steps before the crash would stay next to the re-run's, two values for one step (the
    time/* keys differ). Held until the checkpoint, MLflow only ever has rows a resume keeps, and a
    resume sends the covered rows a crash left unsent (`send_missing`). The cost: MLflow's curves
    trail metrics.jsonl by up to `checkpoint_every` steps. One batch of a few hundred metrics costs
    tens of ms, once per checkpoint. Tables and checkpoints are written synchronously.
    """

    def __init__(self, client: MlflowClient, run_id: str, suite_table: Callable[[dict[str, float]], str] | None = None):
        self.client = client
        self.run_id = run_id
        self._rows: list[tuple[int, list[Metric]]] = []
        self.suite_table = suite_table
        """Markdown of an evaluation's suite metrics (`config.eval_suite`), logged with them as a table."""

    def _add(self, metrics: dict[str, float], step: int) -> None:
        now_ms = int(time.time() * 1000)
        self.hold(step, [Metric(k, float(v), now_ms, step) for k, v in metrics.items()])

    def hold(self, step: int, metrics: list[Metric]) -> None:
        """Queue metrics that belong to training step `step` (whatever their own MLflow steps) until the
        checkpoint that covers it."""
        self._rows.append((step, metrics))

    def send(self, rows: list[list[Metric]]) -> None:
        batch: list[Metric] = []
        for row in rows:
            if batch and len(batch) + len(row) > _MAX_METRICS_PER_BATCH:
                self.client.log_batch(self.run_id, metrics=batch)
                batch = []
            batch.extend(row)
        if batch:
            self.client.log_batch(self.run_id, metrics=batch)

    def on_step(self, step: int, metrics: dict[str, float]) -> None:
        self._add(metrics, step)

    def on_eval(self, step: int, metrics: dict[str, float], generations: list[dict[str, Any]]) -> None:
        self._add(metrics, step)
        log_generations(self.client, self.run_id, step, generations)
        if self.suite_table is not None:
            log_accuracy_table(self.client, self.run_id, self.suite_table(metrics), metrics, step)

    def on_checkpoint(self, step: int, path: Path) -> None:
        covered = [row for s, row in self._rows if s <= step]
        self._rows = [(s, row) for s, row in self._rows if s > step]
        self.send(covered)
        log_checkpoint(self.client, self.run_id, path)

    def send_missing(self, rows: list[dict[str, Any]]) -> int:
        """Send the metrics.jsonl rows MLflow lacks (a crash between a checkpoint and its send); returns how many.

        A row is on MLflow when the history of its marker key (time/step_s for a step, the eval
        key for an evaluation) has its step.
        """
        seen: dict[str, set[int]] = {}
        missing = []
        for row in rows:
            values = {k: v for k, v in row.items() if k != "step"}
            if not values:
                continue
            marker = next((k for k in _ROW_MARKERS if k in values), min(values))
            if marker not in seen:
                seen[marker] = {m.step for m in self.client.get_metric_history(self.run_id, marker)}
            if int(row["step"]) not in seen[marker]:
                now_ms = int(time.time() * 1000)
                missing.append([Metric(k, float(v), now_ms, int(row["step"])) for k, v in values.items()])
        self.send(missing)
        return len(missing)

    def upload_missing(self, run_dir: Path) -> list[str]:
        """Upload every checkpoint of `run_dir` whose files MLflow does not hold in full (a crash during its
        upload, or before it); returns their artifact paths. A file is held when its path and size match."""
        uploaded = []
        for checkpoint in checkpoint_dirs(Path(run_dir)):
            if verify_checkpoint(checkpoint) is None and missing_files(self.client, self.run_id, checkpoint):
                uploaded.append(log_checkpoint(self.client, self.run_id, checkpoint))
        return uploaded

    def flush(self) -> None:
        """Nothing to wait for: rows go out synchronously at checkpoints. Rows after the last one stay
        in metrics.jsonl only; a resume re-runs those steps."""

    def callbacks(self) -> Callbacks:
        return Callbacks(on_step=self.on_step, on_eval=self.on_eval, on_checkpoint=self.on_checkpoint)


_ROW_MARKERS = (K.TIME_STEP_S, K.EVAL_AVG_AT_K)
