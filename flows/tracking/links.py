"""Links between the two UIs: MLflow runs point at their Prefect flow run, Prefect points at MLflow.

A link exists only where its server is known: the Prefect UI from PREFECT_UI_URL (derived from
PREFECT_API_URL: `make ui`'s worker, a user's server, the test harness; None in ephemeral mode)
and the MLflow UI from an http(s) tracking URI (the `make ui` server or the user's). An embedded
SQLite store has no UI to link to, so a run there gets its Prefect link but Prefect gets ids only.

URLs are always followed by whitespace or the end of a line, never by punctuation: the Prefect
UI's log linkifier took `http://127.0.0.1:5310;` for the URL, `;` included.
"""

from __future__ import annotations

from urllib.parse import quote, urlencode
from uuid import UUID

PREFECT_RUN_URL_TAG = "ada.prefect_flow_run_url"
PREFECT_RUN_ID_TAG = "prefect.flow_run_id"
NOTE_TAG = "mlflow.note.content"  # the run's (or experiment's) Description in the MLflow UI


def prefect_flow_run() -> tuple[str | None, str | None, str | None]:
    """(flow run id, flow run name, UI URL of the flow run) of the current Prefect flow run; Nones outside one."""
    from prefect.runtime import flow_run
    from prefect.settings import PREFECT_UI_URL

    run_id = flow_run.get_id()
    if not run_id:
        return None, None, None
    base = PREFECT_UI_URL.value()
    url = f"{base.rstrip('/')}/runs/flow-run/{run_id}" if base else None
    return str(run_id), flow_run.get_name(), url


def flow_run_url(flow_run_id: str | UUID | None) -> str | None:
    """The Prefect UI page of a flow run; None without a UI (ephemeral mode) or an id."""
    from prefect.utilities.urls import url_for

    return url_for("flow-run", obj_id=str(flow_run_id)) if flow_run_id else None


def mlflow_base_url(tracking_uri: str) -> str | None:
    """The MLflow UI behind a tracking URI, when it is a server."""
    if tracking_uri.startswith(("http://", "https://")):
        return tracking_uri.rstrip("/")
    return None


# MLflow 3's UI opens in its GenAI mode (traces, latency) unless the URL or the browser's saved
# choice says otherwise; every link here asks for the model-training mode.
MLFLOW_TRAINING_VIEW = "workflowType=machine_learning"


def mlflow_experiment_url(tracking_uri: str, experiment_id: str) -> str | None:
    """The experiment's runs table."""
    base = mlflow_base_url(tracking_uri)
    return f"{base}/#/experiments/{experiment_id}/runs?{MLFLOW_TRAINING_VIEW}" if base else None


def mlflow_run_url(tracking_uri: str, experiment_id: str, run_id: str) -> str | None:
    base = mlflow_base_url(tracking_uri)
    return f"{base}/#/experiments/{experiment_id}/runs/{run_id}?{MLFLOW_TRAINING_VIEW}" if base else None


def mlflow_artifact_url(tracking_uri: str, run_id: str, path: str) -> str | None:
    """A URL that serves one artifact file of a run (the server's `get-artifact` route), e.g. a PNG for an
    `<img>`. The server sends every file as an attachment (against XSS on its domain), so a browser that
    follows it to an HTML page downloads the page: link pages with `mlflow_artifact_page_url`."""
    base = mlflow_base_url(tracking_uri)
    return f"{base}/get-artifact?{urlencode({'path': path, 'run_uuid': run_id}, quote_via=quote)}" if base else None


def mlflow_artifact_page_url(tracking_uri: str, experiment_id: str, run_id: str, path: str) -> str | None:
    """The run's Artifacts tab with one file open: MLflow's UI shows an HTML page there, in a sandboxed frame
    that runs its scripts (an interactive plotly page works), and an image, a table or text as such."""
    run = mlflow_run_url(tracking_uri, experiment_id, run_id)
    if run is None:
        return None
    page, query = run.split("?", 1)
    return f"{page}/artifacts/{quote(path)}?{query}"


def run_link_tags(description: str) -> dict[str, str]:
    """Tags for an MLflow run started inside a flow run: its Prefect id and URL, and a Description.

    The Description (`mlflow.note.content`, markdown in the MLflow UI) is `description` followed
    by a link to the Prefect flow run when the Prefect UI is known.
    """
    run_id, name, url = prefect_flow_run()
    tags = {NOTE_TAG: description}
    if run_id:
        tags[PREFECT_RUN_ID_TAG] = run_id
    if url:
        tags[PREFECT_RUN_URL_TAG] = url
        tags[NOTE_TAG] = f"{description}\n\nPrefect flow run: [{name or run_id}]({url})"
    return tags


def markdown_link(text: str, url: str | None) -> str:
    """`[text](url)`, or `text` in code style when there is no URL."""
    return f"[{text}]({url})" if url else f"`{text}`"


def announce_run(tracking_uri: str, experiment_id: str, run_id: str, run_name: str, kind: str) -> str | None:
    """Log the MLflow run's and experiment's URLs (or ids) to Prefect, with a markdown artifact of both; returns the run URL."""
    from prefect import get_run_logger
    from prefect.artifacts import create_markdown_artifact

    logger = get_run_logger()
    run_url = mlflow_run_url(tracking_uri, experiment_id, run_id)
    experiment_url = mlflow_experiment_url(tracking_uri, experiment_id)
    if run_url:
        logger.info("MLflow %s run %s: %s", kind, run_name, run_url)
        logger.info("MLflow experiment: %s", experiment_url)
        create_markdown_artifact(
            markdown=f"MLflow {kind} run {markdown_link(run_name, run_url)} in experiment "
                     f"{markdown_link(experiment_id, experiment_url)}\n",
            description="Where this flow run is tracked in MLflow",
        )
    else:
        logger.info("MLflow %s run %s: id %s in experiment %s at %s", kind, run_name, run_id, experiment_id,
                    tracking_uri)
    return run_url
