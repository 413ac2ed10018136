"""A team `make ui` (infra/TEAM.md): bound beyond loopback it refuses to start without credentials;
with them, both servers refuse a request without them and serve one with them, and the
platform's clients (Prefect's client, MlflowClient) get in from their environment alone.

The servers run on 127.0.0.1 (the credentials switch the same auth on there); only the two
servers start, not the workers or the deployments (tests/stack/test_deploy.py has those).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

pytestmark = pytest.mark.slow

USER, PASSWORD = "ada-team", "s3cret-team-pass"


def status_of(url: str, header: str | None = None) -> int:
    request = urllib.request.Request(url)
    if header:
        request.add_header("Authorization", header)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status
    except urllib.error.HTTPError as err:
        return err.code


def test_make_ui_beyond_loopback_refuses_to_start_without_credentials(infra_ui, tmp_path, monkeypatch):
    for key in ("ADA_UI_USER", "ADA_UI_PASSWORD", "ADA_UI_PASSWORD_FILE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("ADA_UI_HOST", "0.0.0.0")
    with pytest.raises(SystemExit, match="ADA_UI_HOST=0.0.0.0 would expose .* without credentials"):
        infra_ui.start(tmp_path)
    assert not (tmp_path / "ui").exists()  # refused before anything started
    monkeypatch.setenv("ADA_UI_USER", USER)
    with pytest.raises(SystemExit, match="both ADA_UI_USER and ADA_UI_PASSWORD"):
        infra_ui.credentials()
    (tmp_path / "password").write_text(PASSWORD + "\n")
    monkeypatch.setenv("ADA_UI_PASSWORD_FILE", str(tmp_path / "password"))
    creds = infra_ui.credentials()
    assert (creds.user, creds.password) == (USER, PASSWORD) and PASSWORD not in repr(creds)


@pytest.fixture(scope="module")
def team_servers(infra_ui, tmp_path_factory, free_port):
    home = tmp_path_factory.mktemp("team_ui")
    creds = infra_ui.Credentials(USER, PASSWORD)
    started = []
    try:
        prefect, prefect_url = infra_ui.start_prefect_server(home, free_port(), home / "ui", creds=creds)
        started.append(prefect.pid)
        mlflow, mlflow_url = infra_ui.start_mlflow_server(home, free_port(), home / "ui", creds=creds)
        started.append(mlflow.pid)
        yield home, creds, prefect_url, mlflow_url
    finally:
        for pid in started:
            infra_ui.stop_pid(pid)


def test_both_servers_refuse_requests_without_credentials_and_serve_them_with(team_servers, infra_ui, monkeypatch,
                                                                              prefect_api):
    home, creds, prefect_url, mlflow_url = team_servers
    wrong = infra_ui.Credentials(USER, "not-the-password").header
    for url in (f"{prefect_url}/api/flows/filter", f"{mlflow_url}/api/2.0/mlflow/experiments/search?max_results=5"):
        assert status_of(url) == 401 and status_of(url, wrong) == 401, url
    # Prefect's filter endpoints are POSTs; a GET with credentials gets past auth (405), one without does not
    assert status_of(f"{prefect_url}/api/flows/filter", creds.header) == 405
    assert status_of(f"{prefect_url}/api/admin/version", creds.header) == 200
    assert status_of(f"{mlflow_url}/api/2.0/mlflow/experiments/search?max_results=5", creds.header) == 200
    assert status_of(f"{prefect_url}/api/health") == 200  # health checks stay open (make ui-status, probes)

    # The platform's clients send them from their environment: what `make ui` gives workers and flow runs.
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    monkeypatch.delenv("MLFLOW_TRACKING_USERNAME", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_PASSWORD", raising=False)
    with pytest.raises(MlflowException, match="(?i)401|credentials|unauthori"):
        MlflowClient(mlflow_url).search_experiments()
    env = creds.client_env()
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", env["MLFLOW_TRACKING_USERNAME"])
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", env["MLFLOW_TRACKING_PASSWORD"])
    assert MlflowClient(mlflow_url).create_experiment("team-auth")

    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_AUTH_STRING, temporary_settings

    with prefect_api(f"{prefect_url}/api"):
        with get_client(sync_client=True) as client:
            with pytest.raises(Exception, match="401"):
                client.read_flows()
        with temporary_settings({PREFECT_API_AUTH_STRING: env["PREFECT_API_AUTH_STRING"]}):
            with get_client(sync_client=True) as client:
                assert client.read_flows() == []

    # `make ui-status` gets in with them, and the password is in no file make ui wrote.
    state = {"prefect_url": prefect_url, "mlflow_url": mlflow_url, "pids": {}, "auth": True}
    results = {what: ok for what, ok, _ in infra_ui.check(state, creds)}
    assert results["Prefect API"] and results["Prefect UI"] and results["MLflow"], infra_ui.check(state, creds)
    for path in home.rglob("*"):
        if path.is_file() and path.suffix in (".log", ".ini", ".json"):
            assert PASSWORD not in path.read_text(errors="replace"), path
    assert json.dumps(state).count(PASSWORD) == 0


def test_a_worker_gets_in_with_the_credentials_make_ui_gives_it_and_not_without(team_servers, infra_ui, prefect_api):
    """What `make ui` does for a team setup: the work pool is created, and a worker started with the
    credentials (infra/ui.py start_worker) polls it, ONLINE on the server; one started without them
    is refused (401) and never shows up. The password is in neither worker's log nor command line."""
    import time

    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_AUTH_STRING, temporary_settings

    home, creds, prefect_url, _ = team_servers
    logs = home / "workers"
    logs.mkdir()
    infra_ui.prefect_cli(["work-pool", "create", infra_ui.WORK_POOL, "--type", "process", "--overwrite"],
                         infra_ui.api_env(home, prefect_url, creds))
    with_creds = infra_ui.start_worker(home, prefect_url, logs, name="team-worker", creds=creds)
    without = infra_ui.start_worker(home, prefect_url, logs, name="no-credentials-worker")
    try:
        online: list[str] = []
        with prefect_api(f"{prefect_url}/api"), temporary_settings({PREFECT_API_AUTH_STRING: creds.client_env()[
                "PREFECT_API_AUTH_STRING"]}):
            with get_client(sync_client=True) as client:
                deadline = time.monotonic() + 180
                while "team-worker" not in online and time.monotonic() < deadline:
                    online = [w.name for w in client.read_workers_for_work_pool(infra_ui.WORK_POOL)
                              if w.status.value == "ONLINE"]
                    time.sleep(1)
        assert "team-worker" in online, (logs / "team-worker.log").read_text()[-3000:]
        assert "no-credentials-worker" not in online
        assert without.wait(timeout=120) != 0  # it gave up, refused
        refused = (logs / "no-credentials-worker.log").read_text()
        assert "401" in refused, refused[-3000:]
        assert with_creds.poll() is None
    finally:
        for worker in (with_creds, without):
            infra_ui.stop_pid(worker.pid)
    for log in logs.glob("*.log"):
        assert PASSWORD not in log.read_text(errors="replace"), log
    assert PASSWORD not in " ".join(with_creds.args)


def test_ui_status_checks_the_credentials_it_hands_to_workers(team_servers, infra_ui, monkeypatch, capsys):
    """`make ui-status` under team credentials: the open health checks answer whatever the credentials, so it
    tries the ones of its environment (what `make ui` hands to workers) on an endpoint each server guards; a
    401 is a PROBLEM line, and the right ones are ok."""
    home, creds, prefect_url, mlflow_url = team_servers
    state = {"prefect_url": prefect_url, "mlflow_url": mlflow_url, "pids": {}, "auth": True}
    (home / "ui" / "servers.json").write_text(json.dumps(state))
    monkeypatch.delenv("ADA_UI_PASSWORD_FILE", raising=False)
    monkeypatch.setenv("ADA_UI_USER", USER)
    monkeypatch.setenv("ADA_UI_PASSWORD", "not-the-password")
    assert infra_ui.status(home) == 1
    lines = {line.split()[1]: line for line in capsys.readouterr().out.splitlines()}
    assert lines["credentials"].startswith("PROBLEM") and "401" in lines["credentials"], lines
    assert "Prefect and MLflow refused" in lines["credentials"], lines
    assert lines["MLflow"].startswith("ok")  # the health check alone would have said all is well
    assert "not-the-password" not in "".join(lines.values())

    monkeypatch.setenv("ADA_UI_PASSWORD", PASSWORD)
    infra_ui.status(home)
    lines = {line.split()[1]: line for line in capsys.readouterr().out.splitlines()}
    assert lines["credentials"].startswith("ok"), lines
    results = {what: ok for what, ok, _ in infra_ui.check({**state, "auth": False}, None)}
    assert results["credentials"] is False  # a team's servers, and a shell with none to hand on
