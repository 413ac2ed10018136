"""`make ui-status`: whether each piece of a running `make ui` answers (the Prefect API, the UI's idea of
where the API is, MLflow, the workers) and whether the credentials handed to workers get past both
servers' auth; one line each, saying what is wrong and where to look."""

from __future__ import annotations

import json
import os
import urllib.error
from pathlib import Path

from ui_env import WORK_POOL, Credentials, _get_json, _open, credentials, state_file

def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def http_status(url: str, creds: Credentials | None) -> int | str:
    """The HTTP status of a GET of `url` (with `creds`' header), or why there is none."""
    try:
        with _open(url, creds) as response:
            return response.status
    except urllib.error.HTTPError as err:
        return err.code
    except OSError as err:
        return f"no answer ({err})"


def check_credentials(state: dict, creds: Credentials | None) -> tuple[str, bool, str]:
    """Whether what `make ui` hands to workers and flow runs (the environment's ADA_UI_USER/_PASSWORD, or
    none) gets past both servers' auth: an endpoint of each that the auth guards, not their open health
    checks. A 401 here is a worker that would be refused, and flow runs that would never log."""
    prefect_url, mlflow_url = state.get("prefect_url"), state.get("mlflow_url")
    guarded = {"Prefect": f"{prefect_url}/api/admin/version" if prefect_url else None,
               "MLflow": f"{mlflow_url}/api/2.0/mlflow/experiments/search?max_results=1" if mlflow_url else None}
    codes = {server: http_status(url, creds) for server, url in guarded.items() if url}
    whose = f"user {creds.user!r}" if creds is not None else "no credentials"
    refused = [server for server, code in codes.items() if code in (401, 403)]
    if refused:
        fix = ("ADA_UI_USER and ADA_UI_PASSWORD (or ADA_UI_PASSWORD_FILE) of this shell are not those the servers "
               "were started with" if creds is not None else
               "the servers want credentials: set ADA_UI_USER and ADA_UI_PASSWORD (or ADA_UI_PASSWORD_FILE)")
        return ("credentials", False, f"{' and '.join(refused)} refused {whose} "
                f"({', '.join(f'{s} {codes[s]}' for s in refused)}): workers started now could not log in; {fix}; "
                "infra/TEAM.md")
    wrong = {server: code for server, code in codes.items() if code != 200}
    if wrong:
        return ("credentials", False, "could not check them: " + ", ".join(f"{s} {c}" for s, c in wrong.items()))
    return ("credentials", True, f"{whose}: let in by {' and '.join(codes) or 'no server'}, as workers will be")


def check(state: dict, creds: Credentials | None = None) -> list[tuple[str, bool, str]]:
    """(what, ok, detail) for each server, the credentials handed to workers and the worker of a
    `servers.json` state; `creds` for a team setup (the default: those of the environment, when
    `state` says the servers want them)."""
    half_set = None
    if creds is None and state.get("auth"):
        try:
            creds = credentials()
        except SystemExit as err:  # half of them set: said on its line, the rest checked
            half_set = str(err)
    results: list[tuple[str, bool, str]] = []
    prefect_url, mlflow_url = state.get("prefect_url"), state.get("mlflow_url")
    if prefect_url:
        try:
            _get_json(f"{prefect_url}/api/health")
            results.append(("Prefect API", True, f"{prefect_url}/api/health answers"))
        except (OSError, ValueError) as err:
            results.append(("Prefect API", False, f"{prefect_url}/api/health does not answer ({err}); see "
                                                  "ui/prefect-server.log, restart with make ui"))
        try:
            ui_api = (_get_json(f"{prefect_url}/ui-settings", creds=creds) or {}).get("api_url")
            expected = f"{prefect_url}/api"
            if ui_api == expected:
                results.append(("Prefect UI", True, f"{prefect_url} calls the API at {ui_api}"))
            else:
                results.append(("Prefect UI", False, f"{prefect_url} calls the API at {ui_api}, not {expected}: every "
                                                     "page will say it cannot connect; restart with make ui"))
        except (OSError, ValueError, AttributeError) as err:
            results.append(("Prefect UI", False, f"{prefect_url}/ui-settings does not answer ({err})"))
    else:
        results.append(("Prefect API", False, "servers.json names no Prefect server"))
    if mlflow_url:
        try:
            with _open(f"{mlflow_url}/health", creds) as response:
                ok = response.status == 200
            results.append(("MLflow", ok, f"{mlflow_url}/health answers" if ok else f"{mlflow_url}/health: {response.status}"))
        except OSError as err:
            results.append(("MLflow", False, f"{mlflow_url}/health does not answer ({err}); see ui/mlflow-server.log"))
    else:
        results.append(("MLflow", False, "servers.json names no MLflow server"))
    results.append(("credentials", False, half_set) if half_set else check_credentials(state, creds))
    workers = [int(pid) for pid in state.get("pids", {}).get("workers") or []]
    alive = [pid for pid in workers if _pid_alive(pid)]
    if workers and alive == workers:
        results.append(("worker", True, f"{len(workers)} workers (pids {', '.join(map(str, workers))}) poll work "
                                        f"pool '{WORK_POOL}'"))
    else:
        dead = sorted(set(workers) - set(alive))
        results.append(("worker", False, f"{'workers ' + ', '.join(map(str, dead)) + ' are' if dead else 'no worker is'} "
                                         "not running; deployments will stay Scheduled; see ui/ada-worker-*.log "
                                         "and ui/ada-groups.log, restart with make ui"))
    return results


def status(home: Path) -> int:
    """Print one line per piece; 0 when all answer, 1 otherwise (also when nothing runs)."""
    path = state_file(home)
    if not path.exists():
        print(f"ui: not running (no {path}); start with make ui")
        return 1
    results = check(json.loads(path.read_text()))
    for what, ok, detail in results:
        print(f"{'ok     ' if ok else 'PROBLEM'} {what:<12} {detail}")
    return 0 if all(ok for _, ok, _ in results) else 1
