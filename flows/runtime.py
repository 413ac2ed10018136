"""Process-level settings every flow applies before it touches a model."""

from __future__ import annotations

import logging
import os
import time
import uuid
from pathlib import Path
from typing import Any


def torch_threads() -> int:
    """Intra-op threads for model work inside a flow: $ADA_TORCH_THREADS, else every core but one.

    A flow shares its machine with Prefect (the ephemeral server or the worker), MLflow and the
    verifier's process pool. A torch op spread over every core stalls whenever one of them runs:
    on 2 cores, tiny-model steps inside a flow ran 5-20x slower with 2 threads than with 1
    (docs/benchmarks/platform-overhead.md).
    """
    explicit = os.environ.get("ADA_TORCH_THREADS")
    if explicit:
        return max(1, int(explicit))
    return max(1, (os.cpu_count() or 1) - 1)


def set_torch_threads() -> int:
    import torch

    threads = torch_threads()
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    return threads


def run_stamp() -> str:
    """A sortable, collision-free suffix for run directories: 20261130-142501-3fa2."""
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:4]}"


def quiet_task_run_logs() -> None:
    """Per-task INFO lines ("Task run 'rollout-step-7' - Finished in state Completed()") off.

    Two task runs a step would print and ship ~2 log lines each to the API, about 6 ms a task on 2
    cores (a few % of a tiny-model step); the UI shows every task run's state without them. Task
    warnings and errors still log; flow-run INFO lines (run ids, counts) are untouched.
    $ADA_TASK_RUN_LOG_LEVEL overrides (e.g. INFO).
    """
    level = os.environ.get("ADA_TASK_RUN_LOG_LEVEL", "WARNING").upper()
    logging.getLogger("prefect.task_runs").setLevel(level)


# ---------------------------------------------------------------------------------------------
# Prefect's temporary server: its database migrated once, before any server starts

def _temporary_server_settings():
    """Prefect's settings where a flow of this process would start a temporary server; None where none
    would (PREFECT_API_URL names a server, or ephemeral mode is off)."""
    from prefect.settings import get_current_settings

    settings = get_current_settings()
    return None if settings.api.url or not settings.server.ephemeral.enabled else settings


def local_prefect_database() -> Path | None:
    """The SQLite file a temporary Prefect server of this process would use; None when none would start
    (see `_temporary_server_settings`) or the database is not SQLite."""
    settings = _temporary_server_settings()
    if settings is None:
        return None
    url = str(settings.server.database.connection_url.get_secret_value()
              if hasattr(settings.server.database.connection_url, "get_secret_value")
              else settings.server.database.connection_url)
    if not url.startswith("sqlite"):
        return None
    path = url.split(":///", 1)[1] if ":///" in url else ""
    return Path(path) if path and path != ":memory:" else None


MIGRATE = ("import asyncio; from prefect.server.database import provide_database_interface as db; "
           "asyncio.run(db().create_db())")


def prepare_local_prefect(timeout_s: float = 900) -> None:
    """Migrate the temporary server's database once, under a file lock, before a flow starts the server.

    Every process that runs a flow with no PREFECT_API_URL starts a temporary server of its own, which
    migrates the database on start. On a new database, servers started together run the migrations
    at the same time: one wins, the others fail ("table variable already exists"), exit, restart and
    wait, and time out ("Timed out while attempting to connect to ephemeral Prefect API server": 2 of
    4 flows started together on a fresh home here, with a 300 s bound). Done once here, in one
    process at a time, each server finds the schema current. A marker beside the database
    (`<db>.migrated-<prefect version>`) makes later calls a file check.
    """
    import subprocess
    import sys

    import prefect

    from ada_core.paths import exclusive_lock

    database = local_prefect_database()
    if database is None:
        return
    marker = database.with_name(f"{database.name}.migrated-{prefect.__version__}")
    if marker.exists() and database.exists():
        return
    database.parent.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(database.with_name(f"{database.name}.lock")):  # the others wait, then find the marker
        if marker.exists() and database.exists():
            return
        subprocess.run([sys.executable, "-c", MIGRATE], check=True, timeout=timeout_s, capture_output=True)
        marker.touch()


# Starts of the temporary server before one that serves this process is given up.
SERVER_ATTEMPTS = 5


def start_local_server() -> None:
    """Start this process's temporary Prefect server, and make sure the server that answers is its own.

    Prefect picks the server's port at random in 8000-8999, checks that it is free, then starts uvicorn,
    which binds it seconds later (it imports Prefect's server first). A server of another process can
    take the port in between: ours then fails to bind and exits, while the health check that Prefect
    waits on is answered by the other one, and this process's flow runs talk to a server that is not
    its own until that server stops ("Connection refused" in the middle of a run: one of four flows
    started together in CI). So once Prefect says the server is up, the port must be listened on by
    the server process it started; otherwise that server is stopped and another start picks another
    port. Nothing happens where no temporary server would start (`_temporary_server_settings`).
    """
    from prefect.server.api.server import SubprocessASGIServer

    settings = _temporary_server_settings()
    if settings is None:
        return
    bound_s = settings.server.ephemeral.startup_timeout_seconds
    for _ in range(SERVER_ATTEMPTS):
        server = SubprocessASGIServer()  # Prefect's own instance: its flow runs find this one started
        server.start()
        if _listens_on_its_port(server, bound_s):
            return
        logging.getLogger(__name__).warning(
            "Prefect's temporary server on port %d was another process's (it took the port first); "
            "starting one on another port", server.port)
        server.stop()  # forgets the instance: the next start picks a new port
    raise RuntimeError(f"no temporary Prefect server of this process's own started in {SERVER_ATTEMPTS} tries: "
                       "other servers took each port it chose")


def _listens_on_its_port(server, bound_s: float) -> bool:
    """Whether `server`'s process listens on `server.port`: waits while it is alive and not yet listening
    (it may still be importing while another process answers on the port), at most `bound_s`."""
    import psutil

    deadline = time.monotonic() + bound_s
    while True:
        process = server.server_process
        if process is None or process.poll() is not None:
            return False
        try:
            listening = psutil.Process(process.pid).net_connections(kind="tcp")
        except psutil.NoSuchProcess:
            return False
        except psutil.AccessDenied:  # a system that hides even a child's sockets: Prefect's word stands
            return True
        if any(c.status == psutil.CONN_LISTEN and c.laddr.port == server.port for c in listening):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)


def flow(**options: Any):
    """`prefect.flow` for the platform's flows: called at the top level with no Prefect server named,
    a flow first migrates the temporary server's database (`prepare_local_prefect`), then starts the
    server and checks that it is its own (`start_local_server`)."""
    from prefect import Flow

    class LocalFirstFlow(Flow):
        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            prepare_local_prefect()
            start_local_server()
            return super().__call__(*args, **kwargs)

    def decorate(fn):
        return LocalFirstFlow(fn, **options)

    return decorate
