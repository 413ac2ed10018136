"""Fixtures of the flow tier: Prefect's test harness (a temporary server and database), started once."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def prefect_harness(ada_home):
    """Flows run against a temporary Prefect server; task results persist under the session's ADA_HOME."""
    from prefect.settings import PREFECT_RESULTS_LOCAL_STORAGE_PATH, temporary_settings
    from prefect.testing.utilities import prefect_test_harness

    with temporary_settings({PREFECT_RESULTS_LOCAL_STORAGE_PATH: ada_home / "prefect" / "storage"}):
        with prefect_test_harness(server_startup_timeout=180):
            yield
