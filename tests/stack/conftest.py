"""Fixtures of the stack tier: `make ui` (infra/ui.py start) on free, non-default ports with its own ADA_HOME."""

from __future__ import annotations

import pytest


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
