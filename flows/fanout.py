"""A group's children as runs of the `train` deployment, spread over workers by Prefect.

With `children: deployments`, compare and sweep submit every child at once with `run_deployment`
(linked to the parent flow run, so the Prefect UI shows each as a sub-run). Workers on the
deployment's work pool pick them up: `make ui` starts $ADA_WORKERS process workers with `--limit 1`,
one per GPU. Each child holds one slot of Prefect global concurrency limits from before its MLflow
run starts until it ends (`flows.train`): the shared `concurrency_limit`, which bounds runs training
at once across every group, and with `max_parallel` one made for the group alone. Nothing here
schedules: this module checks the set-up, submits, waits and gathers.

A finished child's result is read back from MLflow (`tracking.child_result`: the run tagged with
the child's flow-run id), not from Prefect's result storage, which a worker on another machine
would keep to itself. A child that ends in any state but Completed is recorded as a failure; the others go on.

A child waiting for a slot is already a Running flow run on its worker (Prefect has no per-group
gate before Running), so with `max_parallel` below the number of workers, a worker can sit on a
waiting child. Its MLflow run starts only once it holds the slots.

When the parent fails or is cancelled (any exception, Prefect's TerminationSignal on a worker's
SIGTERM or a KeyboardInterrupt included), every child still pending is cancelled (a Running one is
set Cancelling, which its worker acts on by stopping it) and the group's limit is deleted. A
resumed group (`resume`) that finds the limit of an earlier attempt replaces it: that attempt's
children are gone, and their slots with them. A parent killed outright (SIGKILL, a lost machine)
runs no clean-up: its children finish, and the limit stays until the group is resumed or
`prefect gcl delete <group>`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any
from uuid import UUID

from prefect import get_run_logger
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
from prefect.client.schemas.objects import FlowRun, WorkerStatus
from prefect.deployments import run_deployment
from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound
from prefect.states import Cancelled, Cancelling

from flows import tracking
from flows.params import GroupSettings, TrainParams
from flows.tracking.links import flow_run_url

FollowUp = Callable[[dict[str, Any]], list[TrainParams]]
Plan = Callable[[TrainParams], tuple[TrainParams, dict[str, Any] | None]]


def check_setup(params: GroupSettings) -> None:
    """Fail before any child is submitted when nothing could run it: no deployment, no worker, no limit."""
    with get_client(sync_client=True) as client:
        try:
            deployment = client.read_deployment_by_name(params.deployment)
        except ObjectNotFound:
            raise ValueError(
                f"deployment: the Prefect server at {client.api_url} has no deployment {params.deployment!r}; "
                "`make ui` registers prefect.yaml's (or `prefect deploy --name train`)") from None
        pool = deployment.work_pool_name
        workers = client.read_workers_for_work_pool(pool) if pool else []
        if not any(w.status == WorkerStatus.ONLINE for w in workers):
            raise ValueError(
                f"children: no worker is online on work pool {pool!r} to run {params.deployment!r}; start one "
                f"(`make ui`, or `prefect worker start --pool {pool} --limit 1`), or use children='inline'")
        if params.concurrency_limit:
            try:
                client.read_global_concurrency_limit_by_name(params.concurrency_limit)
            except ObjectNotFound:
                raise ValueError(
                    f"concurrency_limit: the Prefect server has no global concurrency limit "
                    f"{params.concurrency_limit!r}; `make ui` creates it, or "
                    f"`prefect gcl create {params.concurrency_limit} --limit <slots>`") from None


def open_group_limit(group: str, max_parallel: int) -> str:
    """A concurrency limit of `max_parallel` slots for this group's children only; its name is the group's.

    One of that name left by an earlier attempt of the group (a resume after the parent was killed) is
    deleted and made afresh: the slots it still counts were held by that attempt's children."""
    create = GlobalConcurrencyLimitCreate(name=group, limit=max_parallel)
    with get_client(sync_client=True) as client:
        try:
            client.create_global_concurrency_limit(create)
        except ObjectAlreadyExists:
            get_run_logger().warning("concurrency limit %r was left by an earlier attempt of this group; "
                                     "made afresh", group)
            client.delete_global_concurrency_limit_by_name(group)
            client.create_global_concurrency_limit(create)
    return group


def close_group_limit(name: str) -> None:
    """Delete the group's limit once no child can hold it (also when the parent fails or is cancelled)."""
    with get_client(sync_client=True) as client:
        try:
            client.delete_global_concurrency_limit_by_name(name)
        except ObjectNotFound:
            pass


def submit(params: TrainParams, deployment: str, group: str) -> UUID:
    """One child as a run of `deployment`, returned at once (timeout=0); a sub-run of the calling flow run."""
    run = run_deployment(
        deployment, parameters={"params": params.model_dump(mode="json")}, timeout=0, as_subflow=True,
        flow_run_name=params.run_name, tags=["ada", group, f"variant:{params.variant}", f"seed:{params.seed}"],
    )
    return run.id


def cancel_children(flow_run_ids: list[UUID], reason: str) -> None:
    """Cancel each flow run not yet final: one no worker has started is Cancelled at once, a Running
    one is set Cancelling, which its worker acts on (it stops the process and marks it Cancelled)."""
    with get_client(sync_client=True) as client:
        for run in client.read_flow_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=flow_run_ids))):
            if run.state is None or run.state.is_final():
                continue
            started = run.state.is_running() or run.state.is_paused()
            client.set_flow_run_state(run.id, (Cancelling if started else Cancelled)(message=reason), force=True)


def wait_for_any(pending: dict[UUID, TrainParams], poll_s: float) -> list[FlowRun]:
    """Block until at least one pending flow run is in a final state; return those that are."""
    with get_client(sync_client=True) as client:
        while True:
            runs = client.read_flow_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=list(pending))))
            done = [run for run in runs if run.state is not None and run.state.is_final()]
            if done:
                return done
            time.sleep(poll_s)


def failure_record(params: TrainParams, flow_run_id: str | UUID | None, state: str, message: str) -> dict[str, Any]:
    return {"variant": params.variant or params.preset, "preset": params.preset, "seed": params.seed,
            "run_name": params.run_name, "flow_run_id": str(flow_run_id) if flow_run_id else None,
            "state": state, "message": message, "flow_run_url": flow_run_url(flow_run_id)}


def run_deployments(
    children: list[TrainParams], follow_up: FollowUp, params: GroupSettings, group: str,
    client: tracking.MlflowClient, experiment_id: str, tracking_uri: str, plan: Plan,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Submit every child, then wait; a finished child's follow-ups (the matched control) go in at once.

    `plan(child)` (flows.group.plan_child) -> (params to run, None), or (params, its result) for a
    child that finished in an earlier attempt of a resumed group: not submitted again.

    Returns (results of the Completed children, failure records of the others).
    """
    logger = get_run_logger()
    check_setup(params)
    limits = [params.concurrency_limit] if params.concurrency_limit else []
    group_limit = open_group_limit(group, params.max_parallel) if params.max_parallel else None
    limits += [group_limit] if group_limit else []
    pending: dict[UUID, TrainParams] = {}
    try:
        return _submit_and_gather(children, follow_up, params, group, client, experiment_id, tracking_uri, plan,
                                  limits, pending)
    except BaseException as err:  # failed or cancelled: no child may go on without its parent
        if pending:
            logger.warning("%s ended (%s): cancelling its %d unfinished children", group, type(err).__name__,
                           len(pending))
            try:
                cancel_children(list(pending), f"its parent {group} ended: {type(err).__name__}: {err}"[:500])
            except Exception as cancel_err:  # noqa: BLE001 - the parent's own error is the one raised
                logger.error("cancelling the children of %s failed: %s", group, cancel_err)
        raise
    finally:
        if group_limit:
            close_group_limit(group_limit)


def _submit_and_gather(
    children: list[TrainParams], follow_up: FollowUp, params: GroupSettings, group: str,
    client: tracking.MlflowClient, experiment_id: str, tracking_uri: str, plan: Plan, limits: list[str],
    pending: dict[UUID, TrainParams],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """`run_deployments`' body; `pending` (flow run id -> params) holds the children not yet final."""
    logger = get_run_logger()

    results: list[dict[str, Any]] = []
    failures: list[dict[str, Any]] = []

    def launch(child: TrainParams) -> None:
        child, done = plan(child)
        if done is not None:
            results.append(done)
            for extra in follow_up(done):
                launch(extra)
            return
        child = child.model_copy(update={"concurrency_limits": limits})
        flow_run_id = submit(child, params.deployment, group)
        pending[flow_run_id] = child
        logger.info("submitted %s as flow run %s (%s)", child.run_name, flow_run_id, flow_run_url(flow_run_id) or "")

    for child in children:
        launch(child)
    while pending:
        for run in wait_for_any(pending, params.poll_s):
            child = pending.pop(run.id)
            if run.state.is_completed():
                try:
                    result = tracking.child_result(client, experiment_id, run.id, tracking_uri)
                except Exception as err:  # e.g. its MLflow run was deleted: one child lost, not the group
                    failures.append(failure_record(child, run.id, "COMPLETED", f"no result: {err}"))
                    continue
                results.append(result)
                logger.info("%s finished (MLflow run %s)", child.run_name, result["run_id"])
                for extra in follow_up(result):
                    launch(extra)
            else:
                failures.append(failure_record(child, run.id, run.state.type.value, run.state.message or ""))
                logger.warning("%s ended %s: %s", child.run_name, run.state.type.value, run.state.message)
    return results, failures
