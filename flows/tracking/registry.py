"""The model registry: register a run's policy under an alias, download a registered model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlflow
from mlflow import MlflowClient
from mlflow.exceptions import MlflowException

from flows.tracking.store import use_tracking_uri, with_postgres_driver

REGISTERED_MODEL = "ada-policy"
CHAMPION_ALIAS = "champion"


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


def run_of_model(client: MlflowClient, model_uri: str) -> str | None:
    """The MLflow run that logged `models:/name@alias`, `models:/name/version` or `runs:/id/path`; None for
    any other form (a local folder, a built-in name) or a registered version with no run."""
    if model_uri.startswith("runs:/"):
        return model_uri.removeprefix("runs:/").split("/", 1)[0] or None
    if not model_uri.startswith("models:/"):
        return None
    name, _, ref = model_uri.removeprefix("models:/").partition("@")
    if ref:
        version = client.get_model_version_by_alias(name, ref)
    else:
        name, _, number = name.partition("/")
        version = client.get_model_version(name, number)
    return version.run_id or None


def download_model(model_uri: str, tracking_uri: str, dst: Path) -> Path:
    """A local HF folder for `models:/name@alias`, `models:/name/version` or `runs:/id/path`."""
    use_tracking_uri(with_postgres_driver(tracking_uri))
    dst.mkdir(parents=True, exist_ok=True)
    return Path(mlflow.artifacts.download_artifacts(artifact_uri=model_uri, dst_path=str(dst)))
