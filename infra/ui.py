"""`make ui`: a local Prefect server + MLflow server + process workers, all on 127.0.0.1.

    python infra/ui.py start    # servers, work pool, `prefect deploy --all`, worker; prints the URLs
    python infra/ui.py status
    python infra/ui.py stop     # `make ui-stop`
    python infra/ui.py worker   # `make ui-worker`: training workers here for a team `make ui` elsewhere

State lives under $ADA_HOME (default ./.ada): the Prefect home and its SQLite database in
prefect/, the MLflow store in mlflow.db with artifacts in mlartifacts/ (the same store the embedded
default writes, so earlier runs show up), and ui/servers.json with the URLs and process ids. While
the MLflow server answers, flows log to it over HTTP (flows/tracking/store.py reads servers.json), so
several processes never write one SQLite file. Ports: ADA_PREFECT_PORT (4200), ADA_MLFLOW_PORT (5000).

The Prefect UI is a page that calls the API from the browser at the URL its /ui-settings names.
Prefect derives that URL from PREFECT_SERVER_API_PORT, not from `--port`, so a server started on
another port would serve a UI that calls 4200; the server here gets PREFECT_UI_API_URL (and the
host/port settings) for its own port. `status` checks each piece answers and says what is wrong, and
that the credentials `start` hands to workers get past both servers' auth.

Workers (flows/fanout.py runs a group's children on them): $ADA_WORKERS process workers (default 1;
with $ADA_WORKER_GPUS="0,1,..." one per listed GPU, each with that CUDA_VISIBLE_DEVICES) on the
`default` queue of the `ada-process` pool, each `--limit 1`: they run train, evaluate, curate and paper-tables.
One more worker on the `groups` queue runs compare and sweep parents, which mostly wait for their
children, so a parent never takes the slot its children need. The global concurrency limit
$ADA_CONCURRENCY_LIMIT (`ada-train`) gets $ADA_TRAIN_SLOTS slots (default: the number of workers, at least 1;
with workers joining from other machines, set it to the training workers of the whole team).

`make ui-worker` (infra/TEAM.md) joins a team `make ui` on another machine: $ADA_WORKERS training workers
on its pool (PREFECT_API_URL, MLFLOW_TRACKING_URI and the team's credentials from the environment, checked
against both servers before any worker starts), in the foreground until stopped. ADA_WORKERS=0 on the
servers' machine starts no training worker there (a server without GPUs), only the group worker.

The weekly sweep's schedule ships paused (prefect.yaml); `start` prints the one command that resumes it.

A team setup (infra/TEAM.md): ADA_UI_HOST binds both servers to another address than 127.0.0.1, which
`start` refuses without credentials: ADA_UI_USER and ADA_UI_PASSWORD (or ADA_UI_PASSWORD_FILE, a file
holding the password). With them (on any address) the Prefect API requires them
(PREFECT_SERVER_API_AUTH_STRING) and MLflow runs its basic-auth app with that user as its admin;
the workers and `status` get them as PREFECT_API_AUTH_STRING and MLFLOW_TRACKING_USERNAME/PASSWORD in
their environment. The password is never written to servers.json, a command line or a log.

Its parts sit beside it: ui_env.py (state, address, credentials), ui_servers.py (the servers and the
processes it starts), ui_workers.py (work pool, deployments, workers), ui_status.py (`status`). This
file starts and stops the whole and re-exports their names.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
from pathlib import Path

# Its parts are modules beside it, loaded by path and registered under their names (so they import each
# other by those names), whether this file runs as a script or is loaded by path (tests, benchmarks/fanout.py):
# it does not put infra/ on sys.path, where its folders (vllm/, gpu/) would pass for packages of those names.
HERE = Path(__file__).resolve().parent
for _part in ("ui_env", "ui_servers", "ui_workers", "ui_status"):  # each after those it imports
    if _part not in sys.modules:
        _spec = importlib.util.spec_from_file_location(_part, HERE / f"{_part}.py")
        sys.modules[_part] = importlib.util.module_from_spec(_spec)
        _spec.loader.exec_module(sys.modules[_part])

import ui_servers  # noqa: E402 - after the parts are loaded
from ui_env import (  # noqa: E402 - after the parts are loaded
    BIN,
    GROUP_QUEUE,
    LOOPBACK,
    REPO,
    SWEEP,
    TRAIN_QUEUE,
    WORK_POOL,
    Credentials,
    _get_json,
    _open,
    ada_home,
    check_exposure,
    credentials,
    quiet_env,
    state_file,
    ui_host,
)
from ui_servers import (  # noqa: E402 - after the parts are loaded
    RENDEZVOUS_VARS,
    _STARTED,
    flask_secret_key,
    free_port,
    masked,
    mlflow_auth_config,
    mlflow_store,
    port_is_free,
    prefect_server_env,
    record,
    spawn,
    start_mlflow_server,
    start_prefect_server,
    stop_pid,
    wait_http,
)
from ui_workers import (  # noqa: E402 - after the parts are loaded
    api_env,
    deploy,
    ensure_concurrency_limit,
    prefect_cli,
    reap_dead_runs,
    resume_sweep_command,
    start_worker,
    start_workers,
    sweep_schedule,
    worker_count,
    worker_gpus,
)
from ui_status import (  # noqa: E402 - after the parts are loaded
    _pid_alive,
    check,
    check_credentials,
    http_status,
    status,
)

__all__ = [  # every name of its parts, as `infra_ui.<name>` in tests and benchmarks/fanout.py
    "ui_servers",  # where a test patches wait_http
    "BIN",
    "Credentials",
    "GROUP_QUEUE",
    "LOOPBACK",
    "RENDEZVOUS_VARS",
    "REPO",
    "SWEEP",
    "TRAIN_QUEUE",
    "WORK_POOL",
    "_STARTED",
    "_get_json",
    "_open",
    "_pid_alive",
    "ada_home",
    "api_env",
    "check",
    "check_credentials",
    "check_exposure",
    "credentials",
    "deploy",
    "ensure_concurrency_limit",
    "flask_secret_key",
    "free_port",
    "http_status",
    "masked",
    "mlflow_auth_config",
    "mlflow_store",
    "port_is_free",
    "prefect_cli",
    "prefect_server_env",
    "quiet_env",
    "reap_dead_runs",
    "record",
    "resume_sweep_command",
    "spawn",
    "start_mlflow_server",
    "start_prefect_server",
    "start_worker",
    "start_workers",
    "state_file",
    "status",
    "stop_pid",
    "sweep_schedule",
    "ui_host",
    "wait_http",
    "worker_count",
    "worker_gpus",
]


def start(home: Path) -> dict:
    state_path = state_file(home)
    if state_path.exists():
        stop(home)  # a stale state file from a crashed session: clear what it names first
    host, creds = ui_host(), credentials()
    check_exposure(host, creds)  # before anything starts
    log_dir = home / "ui"
    prefect_port = int(os.environ.get("ADA_PREFECT_PORT", 4200))
    mlflow_port = int(os.environ.get("ADA_MLFLOW_PORT", 5000))
    for name, port in (("ADA_PREFECT_PORT", prefect_port), ("ADA_MLFLOW_PORT", mlflow_port)):
        if not port_is_free(port, "127.0.0.1" if host in ("0.0.0.0", "::") else host):
            raise SystemExit(f"port {port} on {host} is taken; set {name} to a free port")
    state: dict = {"pids": {}, "auth": creds is not None, "host": host}  # never the password
    try:
        prefect_proc, prefect_url = start_prefect_server(home, prefect_port, log_dir, host, creds)
        state.update(prefect_url=prefect_url)
        state["pids"]["prefect_server"], = record(state, [prefect_proc])
        _write_state(state_path, state)
        mlflow_proc, mlflow_url = start_mlflow_server(home, mlflow_port, log_dir, host, creds)
        state.update(mlflow_url=mlflow_url)
        state["pids"]["mlflow_server"], = record(state, [mlflow_proc])
        _write_state(state_path, state)
        deploy(home, prefect_url, creds=creds)
        state["sweep_schedule"] = sweep_schedule(prefect_url, creds)
        workers = worker_count()
        limit = os.environ.get("ADA_CONCURRENCY_LIMIT", "ada-train")
        ensure_concurrency_limit(home, prefect_url, limit, int(os.environ.get("ADA_TRAIN_SLOTS") or max(workers, 1)),
                                 creds)
        state["concurrency_limit"] = limit
        state["pids"]["workers"] = record(state, start_workers(home, prefect_url, log_dir, workers, creds))
        _write_state(state_path, state)
        reap_dead_runs(home, prefect_url, mlflow_url, creds)
    except BaseException:
        stop(home)
        for pid in list(_STARTED):  # started, not recorded yet: a server that did not answer in time
            print(f"ui: pid {pid} (not answering yet): {stop_pid(pid)}")
        raise
    return state


def stop(home: Path) -> None:
    path = state_file(home)
    if not path.exists():
        print("ui: nothing running (no servers.json)")
        return
    state = json.loads(path.read_text())
    pids, started = state.get("pids", {}), state.get("started", {})
    for name in ("workers", "worker", "mlflow_server", "prefect_server"):  # workers first: they talk to both
        for pid in (pids.get(name) or []) if name == "workers" else [pids.get(name)]:
            if pid:
                print(f"ui: {name} (pid {pid}): {stop_pid(int(pid), started.get(str(pid)))}")
    path.unlink()


def join(home: Path) -> int:
    """`make ui-worker`: $ADA_WORKERS (default 1) training workers on the team pool of the `make ui` that
    PREFECT_API_URL names, their flow runs logging to MLFLOW_TRACKING_URI, with the credentials of ADA_UI_USER
    and ADA_UI_PASSWORD (or _FILE). Both servers are asked first, with those credentials, on an endpoint their
    auth guards: a missing variable or a refusal is one `error:` line and exit 2, before any worker starts.
    Then it waits on the workers, stopping them all on Ctrl-C or SIGTERM (exit 0) or when one ends (its code)."""
    import signal
    import socket
    import time

    def refuse(message: str) -> int:
        print(f"error: make ui-worker: {message}; see infra/TEAM.md", file=sys.stderr)
        return 2

    api, mlflow_url = os.environ.get("PREFECT_API_URL", ""), os.environ.get("MLFLOW_TRACKING_URI", "")
    missing = [name for name, value in (("PREFECT_API_URL", api), ("MLFLOW_TRACKING_URI", mlflow_url)) if not value]
    if missing:
        return refuse(f"set {' and '.join(missing)} to the team's servers (http://<host>:4200/api, http://<host>:5000)")
    if not api.rstrip("/").endswith("/api"):
        return refuse(f"PREFECT_API_URL={api} does not end in /api")
    try:
        creds = credentials()
        count = int(os.environ.get("ADA_WORKERS") or len(worker_gpus()) or 1)
    except (SystemExit, ValueError) as err:
        return refuse(str(err))
    if count < 1:
        return refuse(f"ADA_WORKERS={count}: a joining machine runs at least one worker")
    prefect_url = api.rstrip("/").removesuffix("/api")
    _, ok, detail = check_credentials({"prefect_url": prefect_url, "mlflow_url": mlflow_url}, creds)
    if not ok:
        return refuse(detail)
    prefix = os.environ.get("ADA_WORKER_NAME") or f"ada-{socket.gethostname()}"
    gpus, log_dir = worker_gpus(), home / "ui"
    workers = [start_worker(home, prefect_url, log_dir, TRAIN_QUEUE, f"{prefix}-{i}", 1,
                            gpus[i % len(gpus)] if gpus else None, creds) for i in range(count)]
    print(f"{count} worker(s) on pool '{WORK_POOL}' of {prefect_url}, logging to {mlflow_url}; logs: {log_dir}",
          flush=True)
    stopping: list[int] = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(0))
    code = 0
    try:
        while not stopping:
            ended = [w for w in workers if w.poll() is not None]
            if ended:
                code = ended[0].returncode or 1
                print(f"error: make ui-worker: worker pid {ended[0].pid} ended ({ended[0].returncode}); its log: "
                      f"{log_dir}", file=sys.stderr)
                break
            time.sleep(1)
    except KeyboardInterrupt:
        pass
    finally:
        for worker in workers:
            stop_pid(worker.pid)
    return code


def _write_state(path: Path, state: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=2) + "\n")
    tmp.replace(path)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("command", choices=["start", "stop", "status", "worker"])
    args = parser.parse_args(argv)
    home = ada_home()
    if args.command == "worker":
        raise SystemExit(join(home))
    if args.command == "stop":
        stop(home)
        return
    if args.command == "status":
        raise SystemExit(status(home))
    state = start(home)
    for what, ok, detail in check(state):
        print(f"{'ok     ' if ok else 'PROBLEM'} {what:<12} {detail}")
    print(f"""
Prefect UI : {state['prefect_url']}     (deployments: train, compare, evaluate, curate, sweep, paper-tables;
                                          work pool '{WORK_POOL}': {len(state['pids']['workers']) - 1} worker(s)
                                          with --limit 1, one for compare/sweep parents;
                                          concurrency limit '{state['concurrency_limit']}')
MLflow UI  : {state['mlflow_url']}     (store {masked(mlflow_store(home))}, artifacts {home / 'mlartifacts'})
Logs       : {home / 'ui'}
Trigger a run from the Prefect UI (Deployments -> compare -> Run), or:
  PREFECT_API_URL={state['prefect_url']}/api {BIN / 'prefect'} deployment run compare/compare
{sweep_note(state)}{auth_note(state)}Stop everything with: make ui-stop
""")


def sweep_note(state: dict) -> str:
    command = resume_sweep_command(state)
    if command is None:
        return ""
    if state["sweep_schedule"]["active"]:
        return f"The weekly sweep ({state['sweep_schedule']['cron']}, UTC) is scheduled.\n"
    return (f"The weekly sweep ({state['sweep_schedule']['cron']}, UTC) ships paused; start its schedule with\n"
            f"  {command}\n  (or Prefect UI -> Deployments -> sweep -> the schedule's toggle)\n")


def auth_note(state: dict) -> str:
    if not state.get("auth"):
        return ""
    return ("Both servers want the team's credentials (ADA_UI_USER / ADA_UI_PASSWORD): clients send them as\n"
            "  PREFECT_API_AUTH_STRING=<user>:<password>, MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD\n"
            "  (the commands above too); see infra/TEAM.md\n")


if __name__ == "__main__":
    main()
