"""Where runs go, and opening one: tracking URI resolution, experiments, `tracked_run`.

Tracking URI resolution, first match wins:

    explicit parameter > $MLFLOW_TRACKING_URI > the `make ui` MLflow server, if it answers
    > sqlite:///$ADA_HOME/mlflow.db (artifacts under $ADA_HOME/mlartifacts)

Preferring the running server means the UI worker, the demo and a notebook never write one SQLite
file from several processes at once.
"""

from __future__ import annotations

import importlib.util
import json
import os
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import mlflow
from mlflow import MlflowClient
from mlflow.exceptions import MlflowException

from ada_core import metrics as K
from ada_core.paths import ada_home, exclusive_lock
from flows.tracking import links

SERVERS_FILE = "ui/servers.json"  # written by infra/ui.py while the UI servers run


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
    return ui_server_uri() or created_store(default_tracking_uri())


_CREATED: set[str] = set()  # the SQLite stores this process has made sure of


def created_store(uri: str) -> str:
    """`uri`, its SQLite database created (MLflow's tables and migrations) by one process at a time.

    MLflow creates a store's tables the first time a process opens a database that lacks them. Four
    `train` flows started together on a fresh ADA_HOME all found none and all migrated: one failed
    with "duplicate column name: step" (tests/stack/test_prefect_servers.py). Under an exclusive
    `flock` on `<database>.migrate.lock` the others wait, then find the tables there. Once per process.
    """
    if not uri.startswith("sqlite:///") or uri in _CREATED:
        return uri
    database = Path(uri.removeprefix("sqlite:///"))
    database.parent.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(f"{database}.migrate.lock"):
        MlflowClient(uri).search_experiments(max_results=1)
    _CREATED.add(uri)
    return uri


def with_postgres_driver(uri: str) -> str:
    """`postgresql://...` -> `postgresql+psycopg2://...` unless psycopg 3 is installed.

    SQLAlchemy 2.1 maps a bare `postgresql://` to psycopg 3; we ship psycopg2-binary.
    """
    if uri.startswith("postgresql://") and importlib.util.find_spec("psycopg") is None:
        return "postgresql+psycopg2://" + uri.removeprefix("postgresql://")
    return uri


def open_client(tracking_uri: str) -> MlflowClient:
    """A client for `tracking_uri` (already resolved: `resolve_tracking_uri`)."""
    return MlflowClient(tracking_uri)


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
    "Reinforce-Ada RL post-training runs. Held-out accuracy leads each run's charts "
    f"(`{K.EVAL_AVG_AT_K}`); against the budget, chart `{K.budget_axis_key(K.VS_SAMPLES, K.EVAL_AVG_AT_K)}` "
    f"(step = cumulative generated samples) or `{K.budget_axis_key(K.VS_MFLOPS, K.EVAL_AVG_AT_K)}` (step = "
    "estimated compute in MFLOPs), and group a study's runs by `ada.variant` for a line and a band over seeds. "
    "compare and sweep runs hold their children; their report/bands.html has the curves with labelled axes."
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
    body raises, or KILLED when it was stopped from outside (a flow run cancelled in Prefect, which reaches the
    process as SIGTERM: Prefect raises `TerminationSignal` through the body; Ctrl-C). Logging goes through the returned client with an explicit run id, so it does not
    depend on which thread holds MLflow's active-run stack. Inside a Prefect flow run, the run is
    tagged with the flow run's id and UI URL (a resumed run with the flow run that resumed it), and
    its Description (`description`, default the run name) links to it; Prefect's log and artifacts
    get the run's MLflow URL in turn (flows/tracking/links.py).
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
        try:
            yield client, run.info.run_id
        except BaseException as err:
            if stopped_from_outside(err):  # MLflow's own exit would say FAILED
                mlflow.end_run("KILLED")
            raise


def stopped_from_outside(err: BaseException) -> bool:
    """Whether `err` is a stop, not a failure: Prefect's cancel (a SIGTERM the flow engine raises as
    `TerminationSignal`) or Ctrl-C."""
    from prefect.exceptions import TerminationSignal

    return isinstance(err, (TerminationSignal, KeyboardInterrupt))
