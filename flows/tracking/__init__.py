"""The MLflow gateway: the only package of the platform that imports MLflow.

ada_core returns plain metric dicts and writes run folders; flows/ turn them into MLflow runs
through this package alone. By concern:

- `store`: where runs go (tracking URI resolution, the `make ui` server), experiments, `tracked_run`.
- `logger`: what a run logs: params, metrics, generation tables, checkpoints (`RunLogger`).
- `budget`: accuracy and reward as MLflow series whose step is the budget, on a grid every run shares
  (`BudgetAxes`, `BudgetGrid`, `grid_points`).
- `lineage`: the training and evaluation sets as MLflow dataset inputs.
- `registry`: registering a policy, downloading a registered model.
- `runs`: run lookups (of a run folder, of a flow run, a deployed child's result), process
  ownership tags, marking dead runs KILLED, taking a run over for a resume.
- `links`: the one builder of URLs between the MLflow and Prefect UIs.

`from flows import tracking; tracking.X` works for every name below.
"""

from flows.tracking import links
from flows.tracking.budget import BUDGET_SERIES, BudgetAxes, BudgetGrid, grid_points
from flows.tracking.lineage import log_dataset_inputs
from flows.tracking.logger import (
    NOT_APPLICABLE,
    RunLogger,
    checkpoint_artifact_path,
    dataset_hash,
    log_accuracy_table,
    log_checkpoint,
    log_generations,
    log_metrics,
    log_params,
    missing_files,
    run_facts,
    run_params,
    unused_fields,
)
from flows.tracking.registry import CHAMPION_ALIAS, REGISTERED_MODEL, download_model, register_policy, run_of_model
from flows.tracking.runs import (
    FLOW_RUN,
    HOST,
    PID,
    PID_START,
    STUDY,
    ResumeTarget,
    child_result,
    experiment_of,
    mark_dead,
    owner_alive,
    process_tags,
    reap_dead_runs,
    resolve,
    resume_target,
    run_of_flow_run,
    run_of_folder,
    study_of,
    take_over,
)
from flows.tracking.store import (
    EXPERIMENT_KIND,
    EXPERIMENT_KIND_TAG,
    EXPERIMENT_NOTE,
    SERVERS_FILE,
    MlflowClient,
    artifact_root,
    default_tracking_uri,
    ensure_experiment,
    open_client,
    resolve_tracking_uri,
    tracked_run,
    ui_server_uri,
    use_tracking_uri,
    with_postgres_driver,
)

__all__ = [
    "BUDGET_SERIES", "CHAMPION_ALIAS", "EXPERIMENT_KIND", "EXPERIMENT_KIND_TAG", "EXPERIMENT_NOTE", "FLOW_RUN", "HOST",
    "NOT_APPLICABLE", "PID", "PID_START", "REGISTERED_MODEL", "SERVERS_FILE", "STUDY", "BudgetAxes", "BudgetGrid",
    "MlflowClient", "ResumeTarget", "RunLogger", "artifact_root", "checkpoint_artifact_path", "child_result",
    "dataset_hash", "default_tracking_uri", "download_model", "ensure_experiment", "experiment_of", "grid_points", "links",
    "log_accuracy_table", "log_checkpoint", "log_dataset_inputs", "log_generations", "log_metrics", "log_params", "mark_dead", "missing_files",
    "open_client", "owner_alive", "process_tags", "reap_dead_runs", "register_policy", "resolve",
    "resolve_tracking_uri", "resume_target", "run_facts", "run_of_flow_run", "run_of_folder", "run_of_model",
    "run_params", "study_of", "take_over", "tracked_run", "ui_server_uri", "unused_fields", "use_tracking_uri",
    "with_postgres_driver",
]
