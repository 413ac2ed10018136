"""flows/tracking/ (the MLflow gateway) against real backends: SQLite, an MLflow server over HTTP, and PostgreSQL.

The training flows' own logging is checked in test_flows.py; here each backend gets the same
round trip (params, per-step metrics, a generations table, a checkpoint artifact, a registered
version with an alias, and the download back) without training anything.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from mlflow import MlflowClient

from ada_core.config import build_config
from flows import tracking



@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory, free_port, infra_ui):
    """A real `mlflow server` (SQLite + proxied artifacts) on a free loopback port, as `make ui` runs it."""
    ui = infra_ui
    home = tmp_path_factory.mktemp("ui_home")
    proc, url = ui.start_mlflow_server(home, free_port(), home / "ui")
    try:
        yield home, url
    finally:
        ui.stop_pid(proc.pid)
        proc.wait(timeout=30)


def _checkpoint(tmp_path: Path) -> Path:
    """A checkpoint-shaped folder: what log_checkpoint uploads and the registry points at."""
    folder = tmp_path / "checkpoints" / "step_000002"
    (folder / "hf").mkdir(parents=True)
    (folder / "hf" / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (folder / "trainer_state.json").write_text(json.dumps({"step": 2}))
    (folder / "COMPLETE").write_text("ok\n")
    return folder


def _round_trip(uri: str, tmp_path: Path, model_name: str) -> None:
    """Log one run the way the train flow does, then read everything back through MlflowClient."""
    config = build_config("ada-balance", "tiny", overrides={"seed": 3})
    params = tracking.run_params(config, variant="ada-balance", dataset_digest="abc123", extra={"num_params": 402000},
                                 facts=tracking.run_facts(curate=False))
    checkpoint = _checkpoint(tmp_path)
    with tracking.tracked_run(uri, "tracking-test", run_name="parent") as (client, parent_id):
        with tracking.tracked_run(uri, "tracking-test", run_name="child", parent_run_id=parent_id) as (_, run_id):
            tracking.log_params(client, run_id, params)
            run_logger = tracking.RunLogger(client, run_id)
            callbacks = run_logger.callbacks()
            callbacks.on_step(1, {"reward/mean": 0.25, "budget/generated_samples_cum": 64.0})
            callbacks.on_step(2, {"reward/mean": 0.5, "budget/generated_samples_cum": 130.0})
            callbacks.on_eval(2, {"eval/avg_at_k": 0.4}, [
                {"step": 2, "prompt": "1+2=", "completion": "3", "reward": 1.0},
                {"step": 2, "prompt": "5+5=", "completion": "11", "reward": 0.0},
            ])
            callbacks.on_checkpoint(2, checkpoint)
            run_logger.flush()
            version = tracking.register_policy(
                client, run_id, "checkpoints/step_000002/hf", name=model_name, tags={"variant": "ada-balance"}
            )

    client = MlflowClient(tracking.resolve_tracking_uri(uri))
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert run.data.tags["mlflow.parentRunId"] == parent_id
    for key, value in {"N": "4", "M": "4", "n": "4", "variant": "ada-balance", "sampler": "ada",
                       "advantage": "global_mean", "model": "tiny", "dataset_hash": "abc123", "seed": "3",
                       "sampler.exit_rule": "balance", "optim.lr": "0.0003", "num_params": "402000"}.items():
        assert run.data.params[key] == value, key
    history = client.get_metric_history(run_id, "reward/mean")
    assert [(m.step, m.value) for m in history] == [(1, 0.25), (2, 0.5)]
    assert client.get_metric_history(run_id, "eval/avg_at_k")[0].step == 2

    artifacts = {a.path for a in client.list_artifacts(run_id, "checkpoints/step_000002")}
    assert {"checkpoints/step_000002/hf", "checkpoints/step_000002/trainer_state.json"} <= artifacts
    table = client.download_artifacts(run_id, "generations/step_000002.json", str(tmp_path / "dl"))
    logged = json.loads(Path(table).read_text())
    assert logged["columns"] == ["step", "prompt", "completion", "reward"]
    assert logged["data"][1] == [2, "5+5=", "11", 0.0]

    champion = client.get_model_version_by_alias(model_name, "champion")
    assert champion.version == version and champion.tags["variant"] == "ada-balance"
    assert champion.run_id == run_id
    local = tracking.download_model(f"models:/{model_name}@champion", uri, tmp_path / "model")
    assert json.loads((local / "config.json").read_text()) == {"model_type": "llama"}


def test_resolution_prefers_explicit_then_env_then_ui_server(mlflow_server, tmp_path, monkeypatch):
    home, url = mlflow_server
    monkeypatch.setenv("ADA_HOME", str(home))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)

    # No servers.json yet: the embedded SQLite store under ADA_HOME.
    assert tracking.resolve_tracking_uri() == f"sqlite:///{home.resolve()}/mlflow.db"
    (home / "ui").mkdir(exist_ok=True)
    (home / "ui" / "servers.json").write_text(json.dumps({"mlflow_url": url}))
    assert tracking.resolve_tracking_uri() == url  # the `make ui` server is up
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:///elsewhere.db")
    assert tracking.resolve_tracking_uri() == "sqlite:///elsewhere.db"
    assert tracking.resolve_tracking_uri("http://127.0.0.1:1") == "http://127.0.0.1:1"


def test_logging_a_run_does_not_export_its_uri(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    with tracking.tracked_run(f"sqlite:///{tmp_path}/other.db", "export-test", "r"):
        pass
    assert "MLFLOW_TRACKING_URI" not in os.environ  # the next flow still resolves on its own


def test_a_dead_ui_server_falls_back_to_sqlite(tmp_path, monkeypatch, free_port):
    monkeypatch.setenv("ADA_HOME", str(tmp_path))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    (tmp_path / "ui").mkdir()
    (tmp_path / "ui" / "servers.json").write_text(json.dumps({"mlflow_url": f"http://127.0.0.1:{free_port()}"}))
    assert tracking.resolve_tracking_uri() == f"sqlite:///{tmp_path.resolve()}/mlflow.db"


def test_sqlite_round_trip_keeps_artifacts_under_ada_home(ada_home, tmp_path):
    uri = tracking.default_tracking_uri()
    _round_trip(uri, tmp_path, "tracking-sqlite")
    experiment = MlflowClient(uri).get_experiment_by_name("tracking-test")
    assert experiment.artifact_location == (ada_home / "mlartifacts" / "tracking-test").as_uri()
    assert any((ada_home / "mlartifacts" / "tracking-test").rglob("trainer_state.json"))


def test_http_server_round_trip_proxies_artifacts(mlflow_server, tmp_path):
    home, url = mlflow_server
    _round_trip(url, tmp_path, "tracking-http")
    # The server stores the proxied artifacts in its own artifact destination.
    assert any((home / "mlartifacts").rglob("trainer_state.json"))


def test_postgresql_round_trip(postgres_uri, tmp_path):
    assert postgres_uri.startswith("postgresql://")  # the plain form users write
    _round_trip(postgres_uri, tmp_path, "tracking-postgres")
    client = MlflowClient(tracking.resolve_tracking_uri(postgres_uri))
    runs = client.search_runs([client.get_experiment_by_name("tracking-test").experiment_id])
    assert sorted(r.info.run_name for r in runs) == ["child", "parent"]


def test_dataset_hash_follows_file_contents(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text('{"id": "a", "text": "1+1=", "answer": "2"}\n')
    first = tracking.dataset_hash(str(path))
    assert first == tracking.dataset_hash(str(path)) and len(first) == 16
    path.write_text('{"id": "a", "text": "1+1=", "answer": "3"}\n')
    assert tracking.dataset_hash(str(path)) != first
    assert tracking.dataset_hash("arithmetic") != tracking.dataset_hash("chain_sum")


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_run_lookups_survive_quotes_in_paths_and_ids(backend, request, tmp_path):
    """Run folders and flow run ids with `'`, `"` (and both) are found exactly; a near miss is not."""
    from flows.tracking import runs

    # The session's stores (already migrated by the other tests here).
    uri = tracking.default_tracking_uri() if backend == "sqlite" else request.getfixturevalue("postgres_uri")
    client = MlflowClient(tracking.resolve_tracking_uri(uri))
    experiment = f"quotes-{backend}"
    exp_id = client.create_experiment(experiment)
    paths = [tmp_path / "it's", tmp_path / 'say "hi"', tmp_path / "both ' and \"", tmp_path / "both _ and _"]
    made = {}
    for path in paths:
        path.mkdir()
        run = client.create_run(exp_id, run_name=path.name)
        client.log_param(run.info.run_id, "run_dir", str(path))
        client.set_tag(run.info.run_id, runs.FLOW_RUN, f"flow '{path.name}'")
        made[path] = run.info.run_id
    for path, run_id in made.items():
        assert runs.run_of_folder(path, client, experiment) == run_id, path.name
        found = runs.run_of_flow_run(client, experiment, f"flow '{path.name}'")
        assert found is not None and found.run_id == run_id and found.run_dir == path, path.name
    assert runs.run_of_folder(tmp_path / "it''s", client, experiment) is None


def test_runs_logging_one_dataset_at_once_all_get_it(postgres_uri):
    """A compare's children on two workers log the same training set at the same moment. MLflow's store
    looks the dataset row up and then inserts it: runs racing there collided on its unique key (3 of 5
    rounds of six here; how a parallel compare lost a child in CI). Every run gets its input."""
    import threading

    from ada_core.records import Prompt
    from flows.tracking.lineage import log_dataset_inputs

    uri = tracking.resolve_tracking_uri(postgres_uri)
    client = MlflowClient(uri)
    prompts = [Prompt(id=f"p{i}", text=f"{i}+1=", answer=str(i + 1)) for i in range(8)]
    for round_ in range(5):
        experiment = client.create_experiment(f"dataset-race-{round_}")
        runs = [client.create_run(experiment).info.run_id for _ in range(6)]
        barrier, errors = threading.Barrier(len(runs)), []

        def log(run_id):
            barrier.wait()
            try:
                log_dataset_inputs(MlflowClient(uri), run_id, "arithmetic", {"training": prompts})
            except Exception as err:  # noqa: BLE001 - the assertion names it
                errors.append(repr(err)[:300])

        threads = [threading.Thread(target=log, args=(run_id,)) for run_id in runs]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        assert errors == [], errors
        for run_id in runs:
            [dataset] = client.get_run(run_id).inputs.dataset_inputs
            assert dataset.dataset.name == "arithmetic:training"


def test_a_run_cancelled_in_prefect_is_killed_not_failed(tmp_path):
    """Prefect's cancel reaches the run as SIGTERM, which its flow engine raises as TerminationSignal through
    the body: the MLflow run ends KILLED (and a parent still running stays RUNNING); an error ends it FAILED."""
    import signal

    from prefect.exceptions import TerminationSignal

    uri = f"sqlite:///{tmp_path}/cancel.db"
    client = MlflowClient(tracking.resolve_tracking_uri(uri))
    with tracking.tracked_run(uri, "cancel-test", run_name="parent") as (_, parent_id):
        with pytest.raises(TerminationSignal):
            with tracking.tracked_run(uri, "cancel-test", run_name="cancelled", parent_run_id=parent_id) as (_, run_id):
                raise TerminationSignal(signal.SIGTERM)
        assert client.get_run(run_id).info.status == "KILLED"
        assert client.get_run(parent_id).info.status == "RUNNING"
    with pytest.raises(RuntimeError):
        with tracking.tracked_run(uri, "cancel-test", run_name="failed") as (_, failed_id):
            raise RuntimeError("a real failure")
    assert client.get_run(failed_id).info.status == "FAILED" and client.get_run(parent_id).info.status == "FINISHED"
