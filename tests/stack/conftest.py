"""Fixtures of the stack tier, whose tests run flows against Prefect servers of their own.

- `prefect_api`: `with prefect_api(url):` talks to (and runs flows against) another Prefect server,
  Prefect's event stream included (`on_prefect_server` says why that needs more than a setting).
- `ui_stack`: `make ui` (infra/ui.py start) on free, non-default ports with its own ADA_HOME, once.
"""

from __future__ import annotations

from contextlib import contextmanager

import pytest


@contextmanager
def on_prefect_server(api_url: str, drain_timeout_s: float = 60):
    """PREFECT_API_URL=api_url inside the block, Prefect's event stream included.

    Prefect 3 records task runs from the events a flow's process emits (prefect.task-run.*), sent
    by one process-wide `prefect.events.worker.EventsWorker`. For a self-hosted server that worker's
    key is (PrefectEventsClient, ()), without the URL (`EventsWorker.instance`), and its client reads
    PREFECT_API_URL once, when the worker starts. So the first server a process emits events to kept
    receiving all of them: after a flow ran here against another server, the task runs of the
    harness's later flows went there and never reached the harness. Draining the workers when
    switching, both ways (what `prefect_test_harness` does on exit), sends each pending event to the
    server it was made for and stops the worker; the next event starts one on the current URL.
    (`drain_all` flushes and stops every Prefect queue service here, the API log workers too.)
    """
    from prefect.events.worker import EventsWorker
    from prefect.settings import PREFECT_API_URL, temporary_settings

    EventsWorker.drain_all(timeout=drain_timeout_s)
    with temporary_settings({PREFECT_API_URL: api_url}):
        try:
            yield
        finally:
            EventsWorker.drain_all(timeout=drain_timeout_s)


@pytest.fixture(scope="session")
def prefect_api():
    """`with prefect_api(url):` : `on_prefect_server`, for tests that use a Prefect server of their own."""
    return on_prefect_server


@pytest.fixture(scope="session")
def ui_stack(tmp_path_factory, free_port, infra_ui):
    """`infra/ui.py start` with its own ADA_HOME (so its own PREFECT_HOME); stopped whatever happens.

    Yields (home, state): state is servers.json (prefect_url, mlflow_url, pids).
    """
    ui = infra_ui
    home = tmp_path_factory.mktemp("ui_stack")
    patch = pytest.MonkeyPatch()
    patch.setenv("ADA_PREFECT_PORT", str(free_port()))
    patch.setenv("ADA_MLFLOW_PORT", str(free_port()))
    patch.setenv("PREFECT_WORKER_QUERY_SECONDS", "2")  # the worker polls often: keeps the tests short
    patch.setenv("TQDM_DISABLE", "1")
    patch.delenv("PREFECT_API_URL", raising=False)
    try:
        state = ui.start(home)
        yield home, state
    finally:
        ui.stop(home)
        patch.undo()
