"""Resuming flows: which run a resume continues, whether the process that owned it is gone, and
marking dead runs as such in MLflow and Prefect.

A `train` flow tags its MLflow run with the process that runs it (`ada.pid`, `ada.pid_start`,
`ada.host`) and its Prefect flow run id. A process killed outright (SIGKILL, OOM killer, a lost
node) leaves both runs RUNNING for ever; a resume, and the next `make ui` start (`reap_dead_runs`),
find such runs by those tags, check the process is gone, and mark the MLflow run KILLED and the
Prefect flow run Crashed.

`train(TrainParams(resume=...))` continues a run from a run folder or an MLflow run id; the same
flow run retried by Prefect (flow `retries`, or Retry in the UI) finds its own MLflow run by the
`prefect.flow_run_id` tag and resumes it by itself.

    python -m flows.resume reap      # what `make ui` runs once its servers answer
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlflow import MlflowClient
from mlflow.exceptions import MlflowException

from ada_core.run.files import RUN_INFO

log = logging.getLogger(__name__)

RESULT = "result.json"  # the train flow's return value, written last: the run finished
PID, PID_START, HOST, FLOW_RUN = "ada.pid", "ada.pid_start", "ada.host", "prefect.flow_run_id"


# ---------------------------------------------------------------------------------------------
# Is the owner alive?


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (/proc), so a reused pid is not mistaken for it."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]  # field 22, counted after the parenthesised name


def process_tags() -> dict[str, str]:
    """The tags that say which process owns a run."""
    return {PID: str(os.getpid()), PID_START: str(_start_time(os.getpid()) or ""), HOST: socket.gethostname()}


def owner_alive(tags: dict[str, str]) -> bool:
    """Whether the process named by a run's tags still runs. Another host's process counts as gone;
    this process itself (a flow-level retry, in process) counts as gone too: it is not running the run."""
    pid = tags.get(PID)
    if not pid or tags.get(HOST) != socket.gethostname() or int(pid) == os.getpid():
        return False
    start = _start_time(int(pid))
    return start is not None and start == tags.get(PID_START)


def mark_dead(client: MlflowClient, run_id: str, reason: str) -> bool:
    """RUNNING whose owner is gone -> MLflow KILLED and its Prefect flow run Crashed; returns whether it was."""
    run = client.get_run(run_id)
    if run.info.status != "RUNNING" or owner_alive(run.data.tags):
        return False
    client.set_terminated(run_id, status="KILLED")
    client.set_tag(run_id, "ada.killed_reason", reason)
    flow_run_id = run.data.tags.get(FLOW_RUN)
    if flow_run_id:
        crash_flow_run(flow_run_id, reason)
    log.warning("MLflow run %s: its process %s is gone; marked KILLED (%s)", run_id, run.data.tags.get(PID), reason)
    return True


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


# ---------------------------------------------------------------------------------------------
# Which run does a resume continue?


@dataclass
class ResumeTarget:
    run_dir: Path
    run_id: str | None  # None: the run died before its MLflow run was recorded anywhere we can find


def resolve(resume: str, client: MlflowClient, experiment: str) -> ResumeTarget:
    """A run folder (its run_info.json names the MLflow run) or an MLflow run id (its run_dir param)."""
    path = Path(resume).expanduser()
    if path.is_dir():
        return ResumeTarget(path, _run_id_of_folder(path, client, experiment))
    try:
        run = client.get_run(resume)
    except MlflowException:
        raise ValueError(f"resume: {resume!r} is neither a run folder nor an MLflow run id at "
                         f"{client.tracking_uri}") from None
    run_dir = run.data.params.get("run_dir")
    if not run_dir:
        raise ValueError(f"resume: MLflow run {resume} has no run_dir param; resume from its folder instead")
    return ResumeTarget(Path(run_dir), resume)


def _run_id_of_folder(path: Path, client: MlflowClient, experiment: str) -> str | None:
    info = path / RUN_INFO
    if info.is_file():
        run_id = json.loads(info.read_text()).get("mlflow_run_id")
        if run_id:
            return run_id
    exp = client.get_experiment_by_name(experiment)  # killed before run_info.json: find it by its run_dir
    if exp is None:
        return None
    runs = client.search_runs([exp.experiment_id], f"params.run_dir = '{path}'", max_results=1)
    return runs[0].info.run_id if runs else None


def run_of_flow_run(client: MlflowClient, experiment: str, flow_run_id: str | None) -> ResumeTarget | None:
    """The MLflow run an earlier attempt of this very Prefect flow run made: a retry resumes it."""
    exp = client.get_experiment_by_name(experiment) if flow_run_id else None
    if exp is None:
        return None
    runs = client.search_runs([exp.experiment_id], f"tags.`{FLOW_RUN}` = '{flow_run_id}'", max_results=1)
    if not runs or not runs[0].data.params.get("run_dir"):
        return None
    return ResumeTarget(Path(runs[0].data.params["run_dir"]), runs[0].info.run_id)


def take_over(client: MlflowClient, run_id: str) -> None:
    """Before a resume reopens `run_id`: refuse if its process still runs, else mark the dead attempt."""
    run = client.get_run(run_id)
    if run.info.status == "RUNNING" and owner_alive(run.data.tags):
        raise RuntimeError(f"MLflow run {run_id} is still running in process {run.data.tags.get(PID)}; "
                           "stop it before resuming")
    mark_dead(client, run_id, "resumed after its process died")


def finished_result(run_dir: Path) -> dict[str, Any] | None:
    """The train flow's result when the run in `run_dir` finished, else None."""
    path = run_dir / RESULT
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


# ---------------------------------------------------------------------------------------------
# `make ui`: reap what died while no one was looking


def reap_dead_runs(client: MlflowClient) -> list[str]:
    """Mark every RUNNING run whose owner process is gone KILLED (and its flow run Crashed)."""
    reaped = []
    for exp in client.search_experiments():
        for run in client.search_runs([exp.experiment_id], "attributes.status = 'RUNNING'"):
            if PID in run.data.tags and mark_dead(client, run.info.run_id, "found dead at `make ui` start"):
                reaped.append(run.info.run_id)
    return reaped


def main(argv: list[str]) -> int:
    if argv[:1] != ["reap"]:
        print(__doc__)
        return 2
    from flows.tracking import resolve_tracking_uri

    client = MlflowClient(resolve_tracking_uri())
    reaped = reap_dead_runs(client)
    print(f"marked {len(reaped)} dead run(s) KILLED" + (f": {', '.join(reaped)}" if reaped else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
