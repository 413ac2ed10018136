"""`make ui` for real: servers on free loopback ports, prefect.yaml deployed, a worker runs a triggered flow.

One small flow run (curate on a tiny pool) goes the whole way: deployment -> work pool -> worker ->
flow-run subprocess -> MLflow run on the UI's MLflow server. Every wait is bounded, and the servers
and worker are always stopped. The stack (`ui_stack`, conftest.py) is shared with test_browser.py.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
from mlflow import MlflowClient
from support import wait_flow_run

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
CURATE_PARAMS = {
    "overrides": {"data.train_size": 48, "data.eval_size": 8, "data.curation_k": 2, "sft_steps": 5},
    "experiment": "deploy-test",
}


def test_ui_serves_deployments_and_a_worker_runs_a_triggered_flow(ui_stack, prefect_api, infra_ui):
    home, state = ui_stack
    assert state["prefect_url"].startswith("http://127.0.0.1:") and state["mlflow_url"].startswith("http://127.0.0.1:")
    assert json.loads((home / "ui" / "servers.json").read_text())["mlflow_url"] == state["mlflow_url"]

    from prefect.client.orchestration import get_client

    with prefect_api(f"{state['prefect_url']}/api"):
        with get_client(sync_client=True) as client:
            deployments = {f"{client.read_flow(d.flow_id).name}/{d.name}": d for d in client.read_deployments()}
            assert set(deployments) == {"train/train", "compare/compare", "evaluate/evaluate", "curate/curate",
                                        "sweep/sweep", "paper-tables/paper-tables"}
            assert all(d.work_pool_name == "ada-process" for d in deployments.values())
            sweep = deployments["sweep/sweep"]
            assert [s.schedule.cron for s in sweep.schedules] == ["0 3 * * 0"]
            # The weekly sweep ships paused; the command `make ui` prints starts it.
            [schedule] = sweep.schedules
            assert schedule.active is False
            assert state["sweep_schedule"] == {"id": str(schedule.id), "active": False, "cron": "0 3 * * 0"}
            command = infra_ui.resume_sweep_command(state)
            assert command.endswith(f"deployment schedule resume sweep/sweep {schedule.id}")
            subprocess.run(command, shell=True, check=True, capture_output=True, timeout=300)
            assert client.read_deployment(sweep.id).schedules[0].active is True
            client.update_deployment_schedule(sweep.id, schedule.id, active=False)  # paused again for the others
            assert deployments["train/train"].pull_steps == [
                {"prefect.deployments.steps.set_working_directory": {"directory": str(REPO)}}
            ]
            # Group parents fan their children out (the weekly sweep included), from their own queue.
            for name in ("compare/compare", "sweep/sweep"):
                assert deployments[name].parameters == {"params": {"children": "deployments"}}
                assert deployments[name].work_queue_name == "groups"
            assert deployments["train/train"].work_queue_name == "default"
            assert deployments["paper-tables/paper-tables"].work_queue_name == "default"  # it trains itself
            assert client.read_global_concurrency_limit_by_name("ada-train").limit == 1  # ADA_WORKERS=1

            # The server checks parameters against the flow's pydantic schema before any run exists.
            with pytest.raises(Exception, match="(?i)valid|schema|steps"):
                client.create_flow_run_from_deployment(deployments["train/train"].id, parameters={"params": {"steps": 0}})

            run = client.create_flow_run_from_deployment(deployments["curate/curate"].id,
                                                         parameters={"params": CURATE_PARAMS})
            flow_run = wait_flow_run(client, run.id, 480)
            if flow_run is None:
                pytest.fail(f"flow run {run.id} not finished in 480 s; worker log:\n{(home / 'ui' / 'ada-worker-0.log').read_text()[-3000:]}")
            assert flow_run.state.type.value == "COMPLETED", (home / "ui" / "ada-worker-0.log").read_text()[-3000:]
            # One training worker (ADA_WORKERS=1) and the group parents' worker, both polling by now.
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                workers = {w.name for w in client.read_workers_for_work_pool("ada-process")}
                if workers == {"ada-worker-0", "ada-groups"}:
                    break
                time.sleep(2)
            assert workers == {"ada-worker-0", "ada-groups"}

    # The flow logged to the UI's MLflow server (servers.json), over HTTP.
    mlflow = MlflowClient(state["mlflow_url"])
    experiment = mlflow.get_experiment_by_name("deploy-test")
    assert experiment is not None
    runs = mlflow.search_runs([experiment.experiment_id])
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    assert runs[0].data.params["curation.k"] == "2"
    assert runs[0].data.metrics["curation/pool"] == 56
    assert {a.path for a in mlflow.list_artifacts(runs[0].info.run_id)} == {"curated"}
    inputs = mlflow.get_run(runs[0].info.run_id).inputs.dataset_inputs  # the curated set, with its lineage
    assert len(inputs) == (1 if runs[0].data.metrics["curation/kept"] else 0)  # an empty set has no input
    for item in inputs:
        tags = {t.key: t.value for t in item.tags}
        assert tags["mlflow.data.context"] == "curated" and tags["ada.curated_from"] == "arithmetic"
    assert (home / "mlflow.db").is_file() and (home / "prefect" / "prefect.db").is_file()
