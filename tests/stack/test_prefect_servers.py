"""One pytest process, two Prefect servers: each flow's task runs reach the server it ran against.

Task runs reach Prefect's API only as events, through one process-wide events worker that stays
on the first server it sent to (see `on_prefect_server`, stack/conftest.py). test_fanout.py and
test_browser.py run flows against servers of their own in the same process as the harness's flows
(test_flows.py), in whatever order pytest runs them: this test checks both ways, on two small flows.
"""

from __future__ import annotations

import time

import pytest
from prefect import flow, task

pytestmark = pytest.mark.slow


@task
def one_step(i: int) -> int:
    return i


@flow(name="two-servers")
def two_steps() -> str:
    from prefect.runtime import flow_run

    one_step(1)
    one_step(2)
    return flow_run.id


def task_run_names(flow_run_id: str, timeout_s: float = 60) -> list[str]:
    """The flow run's task runs on the current server, once both are recorded (bounded wait)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    deadline = time.monotonic() + timeout_s
    with get_client(sync_client=True) as client:
        while True:
            runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
            if len(runs) >= 2 or time.monotonic() > deadline:
                return sorted(r.name.rsplit("-", 1)[0] for r in runs)
            time.sleep(0.5)


def test_task_runs_reach_the_server_their_flow_ran_on(prefect_harness, prefect_api, ui_stack):
    """The harness, then the `make ui` stack's Prefect server (a server of its own, as test_fanout's
    and test_browser's are), then the harness again, all in this process."""
    from prefect.settings import PREFECT_API_URL

    harness = PREFECT_API_URL.value()
    url = ui_stack[1]["prefect_url"]
    before = two_steps()  # the harness first: its events worker exists when the switch comes
    with prefect_api(f"{url}/api"):
        other = two_steps()
    after = two_steps()
    assert task_run_names(before) == task_run_names(after) == ["one_step", "one_step"]
    with prefect_api(f"{url}/api"):
        assert task_run_names(other) == ["one_step", "one_step"]
        assert task_run_names(after, timeout_s=0) == []  # nothing of the harness's went there
    assert PREFECT_API_URL.value() == harness
