"""Run lookups, each written once: the run a resume continues (of a run folder, of an MLflow run id,
of a Prefect flow run), a deployed child's result, and marking runs whose process died.

A `train` flow tags its MLflow run with the process that runs it (`ada.pid`, `ada.pid_start`,
`ada.host`, `process_tags`) and its Prefect flow run id (`prefect.flow_run_id`). A run left
RUNNING by a process that is gone is marked KILLED here; the Prefect side of that (the flow run
Crashed) is the caller's `on_killed(flow_run_id, reason)` (flows/resume.py passes `crash_flow_run`).
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from uuid import UUID

from mlflow import MlflowClient
from mlflow.exceptions import MlflowException

from ada_core.errors import ResumeError, RunInUse
from ada_core.run.files import read_run_info

log = logging.getLogger(__name__)

PID, PID_START, HOST, FLOW_RUN = "ada.pid", "ada.pid_start", "ada.host", "prefect.flow_run_id"

OnKilled = Callable[[str, str], Any]  # (Prefect flow run id, reason), called for a run marked KILLED


# ---------------------------------------------------------------------------------------------
# Filter strings: a value is quoted, never pasted


def equals_filter(field: str, value: str) -> str:
    """An MLflow filter clause `field = value` that MLflow's parser reads back as exactly `value`.

    The parser has no escape for a quote inside a quoted value (`''` and `\\'` are taken literally),
    so the value goes in single quotes, or in double quotes when it holds a `'`. A value with both is
    matched with LIKE, each quote (and `\\`, PostgreSQL's LIKE escape) as the one-character wildcard;
    that can match more runs, so callers keep only the exact ones (`search_equal`).
    """
    return _clause(field, value)[0]


def _clause(field: str, value: str) -> tuple[str, bool]:
    """(`equals_filter`'s clause, whether it matches `value` exactly)."""
    if "'" not in value:
        return f"{field} = '{value}'", True
    if '"' not in value:
        return f'{field} = "{value}"', True
    pattern = value.replace("'", "_").replace('"', "_").replace("\\", "_")
    return f"{field} LIKE '{pattern}'", False


def search_equal(client: MlflowClient, experiment_ids: list[str], kind: str, key: str, value: str,
                 order_by: list[str] | None = None, max_results: int = 1) -> list[Any]:
    """Runs whose `kind` (`params` or `tags`) `key` is exactly `value`, at most `max_results`.
    The key is back-quoted and the value quoted by `equals_filter`, so a `'` in a path or id cannot
    break (or widen) the search."""
    if kind not in ("params", "tags"):
        raise ValueError(f"search_equal: kind must be params or tags, not {kind!r}")
    if "`" in key:
        raise ValueError(f"search_equal: a key cannot hold a backquote: {key!r}")
    clause, exact = _clause(f"{kind}.`{key}`", value)
    runs = client.search_runs(experiment_ids, clause, order_by=order_by,
                              max_results=max_results if exact else max(1000, max_results))
    if not exact:
        field = (lambda run: run.data.params) if kind == "params" else (lambda run: run.data.tags)
        runs = [run for run in runs if field(run).get(key) == value][:max_results]
    return list(runs)


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


def mark_dead(client: MlflowClient, run_id: str, reason: str, on_killed: OnKilled | None = None) -> bool:
    """RUNNING whose owner is gone -> MLflow KILLED and `on_killed(its flow run, reason)`; returns whether it was."""
    run = client.get_run(run_id)
    if run.info.status != "RUNNING" or owner_alive(run.data.tags):
        return False
    client.set_terminated(run_id, status="KILLED")
    client.set_tag(run_id, "ada.killed_reason", reason)
    flow_run_id = run.data.tags.get(FLOW_RUN)
    if flow_run_id and on_killed is not None:
        on_killed(flow_run_id, reason)
    log.warning("MLflow run %s: its process %s is gone; marked KILLED (%s)", run_id, run.data.tags.get(PID), reason)
    return True


def take_over(client: MlflowClient, run_id: str, on_killed: OnKilled | None = None) -> None:
    """Before a resume reopens `run_id`: refuse if its process still runs, else mark the dead attempt."""
    run = client.get_run(run_id)
    if run.info.status == "RUNNING" and owner_alive(run.data.tags):
        pid = run.data.tags.get(PID)
        raise RunInUse(f"MLflow run {run_id} is still running in process {pid}; stop it (`kill {pid}`) or wait "
                       "for it to end before resuming", pid=int(pid) if pid else None)
    mark_dead(client, run_id, "resumed after its process died", on_killed)


def reap_dead_runs(client: MlflowClient, on_killed: OnKilled | None = None) -> list[str]:
    """Mark every RUNNING run whose owner process is gone KILLED (and `on_killed` its flow run)."""
    reaped = []
    for exp in client.search_experiments():
        for run in client.search_runs([exp.experiment_id], "attributes.status = 'RUNNING'"):
            if PID in run.data.tags and mark_dead(client, run.info.run_id, "found dead at `make ui` start", on_killed):
                reaped.append(run.info.run_id)
    return reaped


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
        return ResumeTarget(path, run_of_folder(path, client, experiment))
    try:
        run = client.get_run(resume)
    except MlflowException:
        raise ResumeError(f"resume: {resume!r} is neither a run folder nor an MLflow run id at "
                          f"{client.tracking_uri}") from None
    run_dir = run.data.params.get("run_dir")
    if not run_dir:
        raise ResumeError(f"resume: MLflow run {resume} has no run_dir param; resume from its folder instead")
    return ResumeTarget(Path(run_dir), resume)


def run_of_folder(path: Path, client: MlflowClient, experiment: str) -> str | None:
    """The MLflow run of a run folder: the one its run_info.json names, else the one whose run_dir param it is."""
    run_id = read_run_info(path).get("mlflow_run_id")
    if run_id:
        return run_id
    exp = client.get_experiment_by_name(experiment)  # killed before run_info.json: find it by its run_dir
    if exp is None:
        return None
    runs = search_equal(client, [exp.experiment_id], "params", "run_dir", str(path))
    return runs[0].info.run_id if runs else None


def run_of_flow_run(client: MlflowClient, experiment: str, flow_run_id: str | None) -> ResumeTarget | None:
    """The MLflow run an earlier attempt of this very Prefect flow run made: a retry resumes it."""
    exp = client.get_experiment_by_name(experiment) if flow_run_id else None
    if exp is None:
        return None
    runs = search_equal(client, [exp.experiment_id], "tags", FLOW_RUN, str(flow_run_id))
    if not runs or not runs[0].data.params.get("run_dir"):
        return None
    return ResumeTarget(Path(runs[0].data.params["run_dir"]), runs[0].info.run_id)


def resume_target(tracking_uri: str, experiment: str, resume: str | None = None, flow_run_id: str | None = None,
                  on_killed: OnKilled | None = None) -> ResumeTarget | None:
    """What a run continues: `resume` (a run folder or MLflow run id), else the MLflow run an earlier
    attempt of flow run `flow_run_id` made; its dead previous attempt is taken over (`take_over`)."""
    client = MlflowClient(tracking_uri)
    if resume:
        target = resolve(resume, client, experiment)
    else:
        target = run_of_flow_run(client, experiment, flow_run_id)
    if target is not None and target.run_id is not None:
        take_over(client, target.run_id, on_killed)
    return target


# ---------------------------------------------------------------------------------------------
# A deployed child's result


def child_result(client: MlflowClient, experiment_id: str, flow_run_id: UUID, tracking_uri: str) -> dict[str, Any]:
    """What `train` returns, rebuilt from the MLflow run its flow run logged (tag `prefect.flow_run_id`)."""
    runs = search_equal(client, [experiment_id], "tags", FLOW_RUN, str(flow_run_id),
                        order_by=["attributes.start_time DESC"])
    if not runs:
        raise RuntimeError(f"flow run {flow_run_id} completed but logged no MLflow run in experiment {experiment_id}")
    run = runs[0]
    checkpoints = sorted(a.path for a in client.list_artifacts(run.info.run_id, "checkpoints") if a.is_dir)
    tags, params = run.data.tags, run.data.params
    return {
        "variant": tags["ada.variant"], "preset": tags["ada.preset"], "seed": int(tags["ada.seed"]),
        "run_id": run.info.run_id, "run_dir": params["run_dir"], "tracking_uri": tracking_uri,
        "model_artifact": f"{checkpoints[-1]}/hf" if checkpoints else None, "registered_version": None,
        "metrics": dict(run.data.metrics), "num_params": int(params["num_params"]) if "num_params" in params else None,
        "flow_run_id": str(flow_run_id),
    }


def experiment_of(client: MlflowClient, run_id: str) -> str:
    """The experiment id of a run."""
    return client.get_run(run_id).info.experiment_id
