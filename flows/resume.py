"""Resuming flows: the Prefect side of marking dead runs, and `make ui`'s reaper.

A `train` flow tags its MLflow run with the process that runs it (`ada.pid`, `ada.pid_start`,
`ada.host`) and its Prefect flow run id. A process killed outright (SIGKILL, OOM killer, a lost
node) leaves both runs RUNNING for ever; a resume, and the next `make ui` start (`reap_dead_runs`),
find such runs by those tags, check the process is gone, and mark the MLflow run KILLED and the
Prefect flow run Crashed. The MLflow side (which run, is its owner alive, KILLED) is
`flows.tracking.runs`; this module adds the Prefect side, `crash_flow_run`.

`train(TrainParams(resume=...))` continues a run from a run folder or an MLflow run id; the same
flow run retried by Prefect (flow `retries`, or Retry in the UI) finds its own MLflow run by the
`prefect.flow_run_id` tag and resumes it by itself.

    python -m flows.resume reap      # what `make ui` runs once its servers answer
"""

from __future__ import annotations

import logging
import sys

from flows import tracking

log = logging.getLogger(__name__)


def crash_flow_run(flow_run_id: str, reason: str) -> bool:
    """Set a Prefect flow run left Running (or Pending) by a dead process to Crashed; False if it is not."""
    from prefect.client.orchestration import get_client
    from prefect.states import Crashed

    try:
        with get_client(sync_client=True) as client:
            flow_run = client.read_flow_run(flow_run_id)
            if flow_run.state is None or flow_run.state.is_final() or flow_run.state.is_paused():
                return False
            client.set_flow_run_state(flow_run_id, Crashed(message=reason), force=True)
            for task_run in client.read_task_runs(flow_run_filter=_flow_run_filter(flow_run_id)):
                if task_run.state is not None and task_run.state.is_running():
                    client.set_task_run_state(task_run.id, Crashed(message=reason), force=True)
    except Exception as err:  # noqa: BLE001 - another server, a deleted run: the MLflow side is done anyway
        log.warning("could not mark Prefect flow run %s Crashed: %s", flow_run_id, err)
        return False
    return True


def _flow_run_filter(flow_run_id: str):
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    return FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id]))


def resume_target(tracking_uri: str, experiment: str, resume: str | None = None,
                  flow_run_id: str | None = None) -> tracking.ResumeTarget | None:
    """`tracking.resume_target`, a dead previous attempt's flow run marked Crashed."""
    return tracking.resume_target(tracking_uri, experiment, resume, flow_run_id, on_killed=crash_flow_run)


def reap_dead_runs(client: tracking.MlflowClient) -> list[str]:
    """Mark every RUNNING run whose owner process is gone KILLED (and its flow run Crashed)."""
    return tracking.reap_dead_runs(client, on_killed=crash_flow_run)


def main(argv: list[str]) -> int:
    if argv[:1] != ["reap"]:
        print(__doc__)
        return 2
    client = tracking.open_client(tracking.resolve_tracking_uri())
    reaped = reap_dead_runs(client)
    print(f"marked {len(reaped)} dead run(s) KILLED" + (f": {', '.join(reaped)}" if reaped else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
