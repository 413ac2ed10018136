"""MLflow at the flow boundary: where runs go, what each run logs, and the model registry.

ada_core returns plain metric dicts and writes run directories; this module is the only place that
turns them into MLflow runs. Tracking URI resolution, first match wins:

    explicit parameter > $MLFLOW_TRACKING_URI > the `make ui` MLflow server, if it answers
    > sqlite:///$ADA_HOME/mlflow.db (artifacts under $ADA_HOME/mlartifacts)

Preferring the running server means the UI worker, the demo and a notebook never write one SQLite
file from several processes at once.
"""

from __future__ import annotations

import importlib.util
import json
import os
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import mlflow
from mlflow import MlflowClient
from mlflow.entities import Metric, Param
from mlflow.exceptions import MlflowException

from ada_core import metrics as K
from ada_core.config import SamplerConfig, TrainConfig, flat_params
from ada_core.paths import ada_home
from ada_core.training import Callbacks
from flows import links

REGISTERED_MODEL = "ada-policy"
CHAMPION_ALIAS = "champion"
SERVERS_FILE = "ui/servers.json"  # written by infra/ui.py while the UI servers run
_MAX_PARAMS_PER_BATCH = 100  # MLflow's log_batch limit
_MAX_METRICS_PER_BATCH = 1000


# ---------------------------------------------------------------------------------------------
# Where runs go


def default_tracking_uri(home: Path | None = None) -> str:
    return f"sqlite:///{(home or ada_home()) / 'mlflow.db'}"


def artifact_root(home: Path | None = None) -> Path:
    return (home or ada_home()) / "mlartifacts"


def ui_server_uri(home: Path | None = None, timeout_s: float = 1.0) -> str | None:
    """The MLflow server `make ui` started under this ADA_HOME, when its /health answers; else None."""
    state = (home or ada_home()) / SERVERS_FILE
    try:
        url = json.loads(state.read_text())["mlflow_url"]
    except (OSError, ValueError, KeyError):
        return None
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=timeout_s) as response:
            return url if response.status == 200 else None
    except OSError:
        return None


def resolve_tracking_uri(explicit: str | None = None) -> str:
    """explicit > $MLFLOW_TRACKING_URI > the `make ui` server if it is up > embedded SQLite."""
    if explicit:
        return with_postgres_driver(explicit)
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return with_postgres_driver(os.environ["MLFLOW_TRACKING_URI"])
    return ui_server_uri() or default_tracking_uri()


def with_postgres_driver(uri: str) -> str:
    """`postgresql://...` -> `postgresql+psycopg2://...` unless psycopg 3 is installed.

    SQLAlchemy 2.1 maps a bare `postgresql://` to psycopg 3; we ship psycopg2-binary.
    """
    if uri.startswith("postgresql://") and importlib.util.find_spec("psycopg") is None:
        return "postgresql+psycopg2://" + uri.removeprefix("postgresql://")
    return uri


def use_tracking_uri(uri: str) -> None:
    """Point MLflow's fluent API at `uri` without exporting it.

    `mlflow.set_tracking_uri` also sets $MLFLOW_TRACKING_URI for child processes; left there, the
    next flow in this process (or a worker it starts) would take it for the user's choice and skip
    the `make ui` server or an explicit default.
    """
    before = os.environ.get("MLFLOW_TRACKING_URI")
    mlflow.set_tracking_uri(uri)
    if before is None:
        os.environ.pop("MLFLOW_TRACKING_URI", None)
    else:
        os.environ["MLFLOW_TRACKING_URI"] = before


EXPERIMENT_KIND_TAG = "mlflow.experimentKind"  # the MLflow 3 UI's switch between its GenAI and training views
EXPERIMENT_KIND = "custom_model_development"
EXPERIMENT_NOTE = (
    "Reinforce-Ada RL post-training runs. Compare held-out accuracy against the budget: chart "
    "`vs_samples/eval_avg_at_k` (x = cumulative generated samples) or `vs_mflops/eval_avg_at_k` "
    "(x = estimated compute in MFLOPs), one line per run. compare and sweep runs hold their children."
)


def ensure_experiment(client: MlflowClient, name: str) -> str:
    """The experiment's id, creating it when missing; tagged as a model-training experiment.

    A database store (SQLite, PostgreSQL) keeps artifacts in $ADA_HOME/mlartifacts/<name>; an HTTP
    server decides for itself (the `make ui` server proxies the same directory). Without the kind
    tag MLflow 3 opens an experiment in its GenAI view (traces, latency, a "Detect Issues" pop-up).
    """
    experiment = client.get_experiment_by_name(name)
    if experiment is None:
        location = None
        if not client.tracking_uri.startswith(("http://", "https://")):
            location = (artifact_root() / name).as_uri()
        try:
            client.create_experiment(name, artifact_location=location)
        except MlflowException:  # another process created it between our two calls
            pass
        experiment = client.get_experiment_by_name(name)
    if experiment.tags.get(EXPERIMENT_KIND_TAG) != EXPERIMENT_KIND:
        client.set_experiment_tag(experiment.experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)
    if links.NOTE_TAG not in experiment.tags:
        client.set_experiment_tag(experiment.experiment_id, links.NOTE_TAG, EXPERIMENT_NOTE)
    return experiment.experiment_id


@contextmanager
def tracked_run(
    tracking_uri: str,
    experiment: str,
    run_name: str,
    parent_run_id: str | None = None,
    tags: dict[str, str] | None = None,
    run_id: str | None = None,
    description: str | None = None,
) -> Iterator[tuple[MlflowClient, str]]:
    """Start an MLflow run (child of `parent_run_id` if given) with system metrics; yield (client, run_id).

    With `run_id`, reopen that run instead (a resume): same id, experiment and name, status RUNNING
    again, system metrics continue after their last step. The run ends FINISHED, or FAILED when the
    body raises. Logging goes through the returned client with an explicit run id, so it does not
    depend on which thread holds MLflow's active-run stack. Inside a Prefect flow run, the run is
    tagged with the flow run's id and UI URL (a resumed run with the flow run that resumed it), and
    its Description (`description`, default the run name) links to it; Prefect's log and artifacts
    get the run's MLflow URL in turn (flows/links.py).
    """
    tracking_uri = with_postgres_driver(tracking_uri)
    use_tracking_uri(tracking_uri)
    client = MlflowClient(tracking_uri)
    experiment_id = ensure_experiment(client, experiment)
    if run_id is not None:  # a resume: the run keeps its own experiment and name
        info = client.get_run(run_id).info
        experiment_id, run_name = info.experiment_id, info.run_name
    flow = (tags or {}).get("ada.flow", "run")
    tags = {**links.run_link_tags(description or run_name),
            "mlflow.source.name": f"flows/{flow}.py", "mlflow.source.type": "JOB", **(tags or {})}
    with mlflow.start_run(
        run_id=run_id,
        experiment_id=experiment_id,
        run_name=run_name,
        parent_run_id=parent_run_id,
        nested=mlflow.active_run() is not None,
        tags=tags,
        log_system_metrics=True,
    ) as run:
        if links.prefect_flow_run()[0]:
            links.announce_run(tracking_uri, experiment_id, run.info.run_id, run_name,
                               "child" if parent_run_id else flow)
        yield client, run.info.run_id


# ---------------------------------------------------------------------------------------------
# What a run logs


def dataset_hash(dataset: str) -> str:
    """sha256 (first 16 hex) of a dataset file's bytes, or of the generator name (`ada_core.data.data_digest`)."""
    from ada_core.data import data_digest

    return data_digest(dataset)


NOT_APPLICABLE = "n/a"


def unused_sampler_fields(sampler: str) -> set[str]:
    """SamplerConfig fields the named sampler ignores.

    SamplerConfig documents each sampler-specific field with a prefix, `ada:` or `dapo:` (the
    `dynamic_filter` sampler); the rest apply to every sampler.
    """
    owner = {"ada": "ada:", "dynamic_filter": "dapo:"}
    mine = owner.get(sampler)
    return {name for name, field in SamplerConfig.model_fields.items()
            if any((field.description or "").startswith(prefix) for prefix in owner.values() if prefix != mine)}


def run_params(config: TrainConfig, variant: str, dataset_digest: str, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The headline params (N, M, n, variant, sampler, advantage, model, dataset_hash, seed) + the flat config.

    Params the sampler does not use (N and M for GRPO's `fixed`, for example) are logged as `n/a`,
    headline and `sampler.*` alike, so the runs table does not suggest GRPO ran 4 rounds of 8.
    """
    params: dict[str, Any] = flat_params(config)
    unused = unused_sampler_fields(config.sampler.name)
    params.update({f"sampler.{name}": NOT_APPLICABLE for name in unused if f"sampler.{name}" in params})
    params.update({
        "N": NOT_APPLICABLE if "N" in unused else config.sampler.N,
        "M": NOT_APPLICABLE if "M" in unused else config.sampler.M,
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


def checkpoint_artifact_path(checkpoint: Path) -> str:
    return f"checkpoints/{checkpoint.name}"


def log_checkpoint(client: MlflowClient, run_id: str, checkpoint: Path) -> str:
    """Upload a checkpoint folder; returns its run-relative artifact path."""
    artifact_path = checkpoint_artifact_path(checkpoint)
    client.log_artifacts(run_id, str(checkpoint), artifact_path=artifact_path)
    return artifact_path


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

    def __init__(self, client: MlflowClient, run_id: str):
        self.client = client
        self.run_id = run_id
        self._rows: list[tuple[int, list[Metric]]] = []

    def _add(self, metrics: dict[str, float], step: int) -> None:
        now_ms = int(time.time() * 1000)
        self.hold(step, [Metric(k, float(v), now_ms, step) for k, v in metrics.items()])

    def hold(self, step: int, metrics: list[Metric]) -> None:
        """Queue metrics that belong to training step `step` (whatever their own MLflow steps) until the
        checkpoint that covers it."""
        self._rows.append((step, metrics))

    def _send(self, rows: list[list[Metric]]) -> None:
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

    def on_checkpoint(self, step: int, path: Path) -> None:
        covered = [row for s, row in self._rows if s <= step]
        self._rows = [(s, row) for s, row in self._rows if s > step]
        self._send(covered)
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
        self._send(missing)
        return len(missing)

    def flush(self) -> None:
        """Nothing to wait for: rows go out synchronously at checkpoints. Rows after the last one stay
        in metrics.jsonl only; a resume re-runs those steps."""

    def callbacks(self) -> Callbacks:
        return Callbacks(on_step=self.on_step, on_eval=self.on_eval, on_checkpoint=self.on_checkpoint)


_ROW_MARKERS = (K.TIME_STEP_S, K.EVAL_AVG_AT_K)


# ---------------------------------------------------------------------------------------------
# The model registry


def register_policy(
    client: MlflowClient,
    run_id: str,
    artifact_path: str,
    name: str = REGISTERED_MODEL,
    alias: str | None = CHAMPION_ALIAS,
    tags: dict[str, Any] | None = None,
) -> str:
    """Register a run's logged HF folder as a new version of `name`, point `alias` at it; return the version.

    Plain artifacts, no MLflow flavour: `evaluate` and `ada_core.models.load_policy` read the folder.
    """
    try:
        client.create_registered_model(name, description="Policies trained by the Reinforce-Ada platform.")
    except MlflowException as err:
        if err.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
    source = f"{client.get_run(run_id).info.artifact_uri}/{artifact_path}"
    version = client.create_model_version(
        name, source=source, run_id=run_id, tags={k: str(v) for k, v in (tags or {}).items()}
    )
    if alias:
        client.set_registered_model_alias(name, alias, version.version)
    return version.version


def download_model(model_uri: str, tracking_uri: str, dst: Path) -> Path:
    """A local HF folder for `models:/name@alias`, `models:/name/version` or `runs:/id/path`."""
    use_tracking_uri(with_postgres_driver(tracking_uri))
    dst.mkdir(parents=True, exist_ok=True)
    return Path(mlflow.artifacts.download_artifacts(artifact_uri=model_uri, dst_path=str(dst)))
