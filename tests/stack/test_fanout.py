"""`children: deployments` for real: a Prefect server, the `train` deployment, two process workers.

One server, two `--limit 1` workers (each with its own PREFECT_HOME and ADA_HOME) and a global
concurrency limit of 2 slots are shared by the module; MLflow is a fresh PostgreSQL database, as a
team would run it (several processes write it at once). Children are 2-step `tiny` runs without
curation or SFT: the point is the plumbing (submission, slots, sub-runs, gathering, failures).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mlflow import MlflowClient

from flows.params import CompareParams, SweepParams
from flows.train import SLOT_LEASE_S

pytestmark = pytest.mark.slow

LIMIT = "fanout-test"
FAST = {"data.train_size": 64, "data.eval_size": 8, "sft_steps": 0, "eval_every": 2, "eval_k": 2,
        "checkpoint_every": 0}
GROUP = {"variants": ["grpo", "ada-balance"], "matched_grpo": False, "seeds": [0], "steps": 2, "prompts_per_step": 4,
         "curate": False, "overrides": FAST, "children": "deployments", "concurrency_limit": LIMIT, "poll_s": 0.5}


@pytest.fixture(scope="module")
def stack(tmp_path_factory, free_port, infra_ui, postgres_uri, prefect_api):
    """Prefect server + `train` deployment + 2 workers + the limit; everything stopped at the end."""
    ui = infra_ui
    root = tmp_path_factory.mktemp("fanout")
    patch = pytest.MonkeyPatch()
    patch.setenv("PREFECT_WORKER_QUERY_SECONDS", "1")  # workers pick runs up quickly: a short test
    patch.setenv("PREFECT_SERVER_CONCURRENCY_MAXIMUM_CONCURRENCY_SLOT_WAIT_SECONDS", "1")
    patch.setenv("TQDM_DISABLE", "1")
    patch.delenv("PREFECT_API_URL", raising=False)
    for home in ("server", "worker0", "worker1"):
        (root / home / "prefect").mkdir(parents=True)
    procs = []
    try:
        server, url = ui.start_prefect_server(root / "server", free_port(), root / "logs")
        procs.append(server)
        for i in range(2):  # they start (seconds of imports) while prefect.yaml's `train` is deployed
            procs.append(ui.start_worker(root / f"worker{i}", url, root / "logs", name=f"fanout-worker-{i}"))
        ui.deploy(root / "server", url, ["train"])

        from prefect.client.orchestration import get_client
        from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate

        with prefect_api(f"{url}/api"):  # the module's flows run here, against this server
            with get_client(sync_client=True) as client:  # what `make ui` does with `prefect gcl create`
                client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=LIMIT, limit=2))
            wait_for_workers(2)
            yield {"url": url, "logs": root / "logs", "tracking_uri": postgres_uri}
    finally:
        for proc in reversed(procs):
            ui.stop_pid(proc.pid)
        patch.undo()


def wait_for_workers(count: int, timeout_s: float = 120) -> None:
    import time

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.objects import WorkerStatus

    deadline = time.monotonic() + timeout_s
    with get_client(sync_client=True) as client:
        while time.monotonic() < deadline:
            online = [w for w in client.read_workers_for_work_pool("ada-process") if w.status == WorkerStatus.ONLINE]
            if len(online) >= count:
                return
            time.sleep(1)
    pytest.fail(f"{count} workers not online within {timeout_s:.0f} s")


def flow_runs(ids: list[str]) -> dict[str, object]:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=ids)))
        return {_child_name(run.name): run for run in runs}


def _child_name(name: str) -> str:
    """`<variant>-s<seed> @ <group>` -> `<variant>-s<seed>`: children are named after their group too."""
    child, _, group = name.partition(" @ ")
    assert group, name
    return child


def overlap(a: tuple, b: tuple) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def children_of(client: MlflowClient, parent_id: str) -> dict[str, object]:
    experiment = client.get_run(parent_id).info.experiment_id
    return {_child_name(r.info.run_name): r
            for r in client.search_runs([experiment], f"tags.mlflow.parentRunId = '{parent_id}'")}


def worker_logs(stack) -> str:
    return "\n".join(p.read_text()[-2000:] for p in sorted(stack["logs"].glob("fanout-worker-*.log")))


def both_running_then_release(held: int, seen: dict, timeout_s: float = 240) -> None:
    """Wait until two `train` flow runs are Running at the same moment, then free the `held` slots of LIMIT.

    The test holds every slot of LIMIT, so each child, once a worker has started it, waits inside its
    flow run for a slot: two children Running at once is then a fact the test observes, not a race
    between two short runs. Releasing the slots lets both train.
    """
    import time

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterState, FlowRunFilterStateType
    from prefect.client.schemas.objects import StateType

    deadline = time.monotonic() + timeout_s
    running = FlowRunFilter(state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.RUNNING])))
    with get_client(sync_client=True) as client:
        try:
            while time.monotonic() < deadline:
                names = {run.name for run in client.read_flow_runs(flow_run_filter=running) if " @ " in run.name}
                if len(names) >= 2:
                    seen["running_at_once"] = sorted(_child_name(n) for n in names)
                    return
                time.sleep(0.5)
        except Exception as error:  # seen by the test; the slots are freed all the same
            seen["error"] = repr(error)
        finally:  # whatever happened, or the children would wait for ever
            client.release_concurrency_slots(names=[LIMIT], slots=held, occupancy_seconds=1)


def test_two_workers_train_two_children_at_once(stack):
    import contextvars
    import threading

    from prefect.client.orchestration import get_client

    from flows.compare import compare

    with get_client(sync_client=True) as client:  # the test holds both slots: children wait, Running
        client.increment_concurrency_slots(names=[LIMIT], slots=2, mode="concurrency")
    seen: dict = {}
    watcher = threading.Thread(target=contextvars.copy_context().run, args=(both_running_then_release, 2, seen))
    watcher.start()
    try:
        summary = compare(CompareParams(**GROUP, tracking_uri=stack["tracking_uri"], experiment="fanout-parallel"))
    finally:
        watcher.join()
    assert seen.get("running_at_once") == ["ada-balance-s0", "grpo-s0"], (seen, worker_logs(stack))
    assert not summary["failures"], worker_logs(stack)
    runs = flow_runs([c["flow_run_id"] for c in summary["children"]])
    assert set(runs) == {"grpo-s0", "ada-balance-s0"}  # flow-run names carry variant and seed
    assert all(r.state.is_completed() for r in runs.values())

    # Sub-runs of the parent: each hangs off a task run of the parent flow run.
    with get_client(sync_client=True) as client:
        parents = {client.read_task_run(r.parent_task_run_id).flow_run_id for r in runs.values()}
    assert len(parents) == 1

    client = MlflowClient(summary["tracking_uri"])
    children = children_of(client, summary["parent_run_id"])
    assert set(children) == {"grpo-s0", "ada-balance-s0"}
    assert all(r.info.status == "FINISHED" for r in children.values())
    assert {r.data.tags["prefect.flow_run_id"] for r in children.values()} == {str(r.id) for r in runs.values()}
    report = Path(summary["report_dir"]) / "report.md"
    assert report.is_file() and "ada-balance" in report.read_text()
    assert summary["registered"] is not None

    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    with get_client(sync_client=True) as prefect:
        artifact = prefect.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["compare-report"])))[0]
    for run in runs.values():  # the artifact links each child's flow run page and names its MLflow run
        assert f"{stack['url']}/runs/flow-run/{run.id}" in artifact.data
    for run in children.values():
        assert run.info.run_id in artifact.data


def test_max_parallel_one_trains_one_at_a_time_and_a_failing_child_does_not_sink_the_group(stack, tmp_path):
    """Two children under `max_parallel=1`, one given a model folder that does not exist."""
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    from ada_core.paths import runs_dir
    from flows import tracking
    from flows.group import child_params, finish_group, run_children

    params = CompareParams(**{**GROUP, "max_parallel": 1}, tracking_uri=stack["tracking_uri"],
                           experiment="fanout-failure")
    missing = tmp_path / "no-such-model"
    group = "fanout-failure"

    @flow(name="fanout-failure-group")
    def group_with_a_bad_child() -> dict:
        uri = tracking.resolve_tracking_uri(params.tracking_uri)
        group_dir = runs_dir() / group
        with tracking.tracked_run(uri, params.experiment, group) as (client, parent_id):
            good = child_params(params, "grpo", 0, "grpo", uri, parent_id, group_dir)
            bad = child_params(params, "ada-balance", 0, "ada-balance", uri, parent_id, group_dir,
                               extra_overrides={"model": str(missing)})  # fails in set-up, inside its MLflow run
            results, failures = run_children(params, [good, bad], lambda result: [], group, client, parent_id, uri)
            return finish_group(client, parent_id, "compare", results, group_dir, "fanout-policy", "champion",
                                label_order=["grpo", "ada-balance"], failures=failures)

    summary = group_with_a_bad_child()
    assert [c["variant"] for c in summary["children"]] == ["grpo"], worker_logs(stack)
    (failure,) = summary["failures"]
    assert failure["variant"] == "ada-balance" and failure["state"] == "FAILED"
    assert "no-such-model" in failure["message"]
    assert failure["flow_run_url"] == f"{stack['url']}/runs/flow-run/{failure['flow_run_id']}"
    report = (Path(summary["report_dir"]) / "report.md").read_text()
    assert "Failed children (1)" in report and failure["flow_run_url"] in report and "ada-balance" in report
    assert json.loads((Path(summary["report_dir"]).parent / "summary.json").read_text())["failures"] == [failure]
    client = MlflowClient(tracking.resolve_tracking_uri(stack["tracking_uri"]))
    parent = client.get_run(summary["parent_run_id"])
    assert parent.info.status == "FINISHED" and parent.data.tags["ada.failed_children"] == "1"

    # Both children opened an MLflow run (the bad one failed inside it), each only once it held the
    # slot: under one slot they never overlap, though both Prefect flow runs may be Running at once
    # (one waiting for the slot).
    children = children_of(client, summary["parent_run_id"])
    assert {n: r.info.status for n, r in children.items()} == {"grpo-s0": "FINISHED", "ada-balance-s0": "FAILED"}
    spans = [(r.info.start_time, r.info.end_time) for r in children.values()]
    assert not overlap(*spans), spans
    with get_client(sync_client=True) as prefect:
        with pytest.raises(ObjectNotFound):  # the group's own limit is gone once its children are
            prefect.read_global_concurrency_limit_by_name(group)
        assert prefect.read_global_concurrency_limit_by_name(LIMIT).active_slots == 0


def test_a_group_with_no_successful_child_fails(stack, tmp_path):
    """The rule is the same inline, where the failing children are subflows here (seconds, not a worker's)."""
    from flows import tracking
    from flows.sweep import sweep

    missing = tmp_path / "missing.jsonl"
    params = SweepParams(variants=["grpo"], n=[4, 8], seeds=[0], steps=1, prompts_per_step=4, curate=False,
                         overrides={**FAST, "data.dataset": str(missing)}, children="inline",
                         tracking_uri=stack["tracking_uri"], experiment="fanout-all-failed")
    state = sweep(params, return_state=True)
    assert state.is_failed() and "no child succeeded" in state.message
    assert "grpo-n4-s0 FAILED" in state.message and "grpo-n8-s0 FAILED" in state.message
    client = MlflowClient(tracking.resolve_tracking_uri(stack["tracking_uri"]))
    (parent,) = client.search_runs([client.get_experiment_by_name("fanout-all-failed").experiment_id],
                                   "tags.`ada.flow` = 'sweep'")
    assert parent.info.status == "FAILED"


def test_deployments_need_a_server_with_the_limit(stack):
    from flows.fanout import check_setup

    with pytest.raises(ValueError, match="concurrency_limit: .*no-such-limit.*prefect gcl create"):
        check_setup(CompareParams(**{**GROUP, "concurrency_limit": "no-such-limit"}))
    with pytest.raises(ValueError, match="deployment: .*nope/nope"):
        check_setup(CompareParams(**{**GROUP, "deployment": "nope/nope"}))




def test_a_resumed_group_replaces_the_limit_its_killed_attempt_left(stack):
    """A parent killed outright leaves its group's limit, one slot still counted for a child that is gone;
    the resumed group (same name) must neither meet ObjectAlreadyExists nor wait on that slot."""
    from prefect import flow
    from prefect.client.orchestration import get_client

    from flows.fanout import close_group_limit, open_group_limit

    group = "fanout-resumed"

    @flow(name="fanout-resume-attempts")
    def two_attempts() -> None:
        open_group_limit(group, 1)  # the first attempt, then killed while its child held the slot
        with get_client(sync_client=True) as client:
            client.increment_concurrency_slots(names=[group], slots=1, mode="concurrency")
        open_group_limit(group, 2)  # the resumed attempt

    two_attempts()
    with get_client(sync_client=True) as client:
        limit = client.read_global_concurrency_limit_by_name(group)
    assert (limit.limit, limit.active_slots) == (2, 0)
    close_group_limit(group)


def test_a_failing_parent_cancels_its_children_and_deletes_its_limit(stack):
    """Two children under `max_parallel=1`: one trains, the other waits for the slot. When the first ends,
    the parent fails (its follow-up raises, as compare's matched control can): the waiting child must be
    cancelled, not trained without its parent, and the group's limit deleted."""
    import time

    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterTags
    from prefect.exceptions import ObjectNotFound

    from ada_core.paths import runs_dir
    from flows import tracking
    from flows.group import child_params, run_children

    group = "fanout-cancel"
    params = CompareParams(**{**GROUP, "max_parallel": 1}, tracking_uri=stack["tracking_uri"], experiment=group)

    def follow_up(result: dict) -> list:
        raise RuntimeError(f"follow-up of {result['variant']} failed")

    @flow(name="fanout-cancel-group")
    def failing_group() -> None:
        uri = tracking.resolve_tracking_uri(params.tracking_uri)
        with tracking.tracked_run(uri, params.experiment, group) as (client, parent_id):
            children = [child_params(params, preset, 0, preset, uri, parent_id, runs_dir() / group)
                        for preset in ("grpo", "ada-balance")]
            run_children(params, children, follow_up, group, client, parent_id, uri)

    state = failing_group(return_state=True)
    assert state.is_failed() and "follow-up of" in state.message, worker_logs(stack)
    with get_client(sync_client=True) as client:
        with pytest.raises(ObjectNotFound):
            client.read_global_concurrency_limit_by_name(group)
        deadline = time.monotonic() + 120  # the worker notices Cancelling and stops the child's process
        while time.monotonic() < deadline:
            runs = client.read_flow_runs(flow_run_filter=FlowRunFilter(tags=FlowRunFilterTags(all_=[group])))
            if len(runs) == 2 and all(r.state.is_final() for r in runs):
                break
            time.sleep(1)
        states = sorted(r.state.type.value for r in runs)
        assert states == ["CANCELLED", "COMPLETED"], (states, worker_logs(stack))
        # A child stopped while it held a slot frees it when its lease runs out (flows.train.SLOT_LEASE_S).
        deadline = time.monotonic() + SLOT_LEASE_S + 60
        while client.read_global_concurrency_limit_by_name(LIMIT).active_slots and time.monotonic() < deadline:
            time.sleep(1)
        assert client.read_global_concurrency_limit_by_name(LIMIT).active_slots == 0
