"""Every deployment of prefect.yaml, run by a real worker as the Prefect UI's Run button starts it.

The Run button posts the form's values to the API (`create_flow_run_from_deployment`), starting from
the deployment's own parameters (compare's and sweep's `children: deployments`); the worker that
`make ui` started on the deployment's queue loads the entrypoint by path and runs it in a process of
its own. Each run is as small as runs go (one step, two prompts, no SFT, no curation: curate has its
own test in test_deploy.py), on the `make ui` stack these modules share (`ui_stack`), and must end
Completed. The compare deployment crashed there once (`flows/report.py` shadowed the `report` package
on a worker), while every test that started a compare from Python passed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mlflow import MlflowClient
from support import wait_flow_run

pytestmark = pytest.mark.slow

EXPERIMENT = "deployments-test"
FAST = {"data.train_size": 16, "data.eval_size": 4, "sft_steps": 0, "eval_every": 1, "eval_k": 2,
        "checkpoint_every": 0}
SMALL = {"steps": 1, "prompts_per_step": 2, "curate": False, "overrides": FAST, "experiment": EXPERIMENT}
POLICY = "deployments-test-policy"


def worker_logs(home: Path) -> str:
    return "\n".join(f"--- {log.name}:\n{log.read_text()[-2500:]}" for log in sorted((home / "ui").glob("ada-*.log")))


def as_json_view(form: dict) -> dict:
    """The parameters as the form's JSON view submits them: `params` as JSON text, in which each free-form
    object field (overrides, pools) is the JSON wrapper the form holds it in, not unwrapped by the server."""
    def wrapped(value):
        return {"__prefect_kind": "json", "value": json.dumps(value)} if isinstance(value, dict) else value

    return {"params": {"__prefect_kind": "json", "value": json.dumps({k: wrapped(v) for k, v in form.items()})}}


def run_as_the_ui_does(ui_stack, prefect_api, name: str, edits: dict, timeout_s: float = 600,
                       json_view: bool = False):
    """Start `name` (`<flow>/<deployment>`) through the API with the form's values (the deployment's
    parameters, then the edits; `json_view`: as that view sends them) and wait for the worker to finish
    it; the final flow run."""
    from prefect.client.orchestration import get_client

    home, state = ui_stack
    with prefect_api(f"{state['prefect_url']}/api"):
        with get_client(sync_client=True) as client:
            deployment = client.read_deployment_by_name(name)
            form = {**(deployment.parameters.get("params") or {}), **edits}
            parameters = as_json_view(form) if json_view else {"params": form}
            run = client.create_flow_run_from_deployment(deployment.id, parameters=parameters)
            flow_run = wait_flow_run(client, run.id, timeout_s)
            if flow_run is None:
                pytest.fail(f"{name}: flow run {run.id} not finished in {timeout_s:.0f} s\n{worker_logs(home)}")
    assert flow_run.state.type.value == "COMPLETED", f"{name}: {flow_run.state.message}\n{worker_logs(home)}"
    return flow_run


def mlflow_run_of(state, flow_run_id) -> object:
    client = MlflowClient(state["mlflow_url"])
    experiment = client.get_experiment_by_name(EXPERIMENT)
    [run] = client.search_runs([experiment.experiment_id], f"tags.`prefect.flow_run_id` = '{flow_run_id}'")
    return run


@pytest.fixture(scope="module")
def trained(ui_stack, prefect_api):
    """The `train` deployment, registering its policy for the `evaluate` test."""
    return run_as_the_ui_does(ui_stack, prefect_api, "train/train",
                              {**SMALL, "preset": "grpo", "register_as": POLICY})


def test_train_deployment_runs_on_a_worker(trained, ui_stack):
    _, state = ui_stack
    run = mlflow_run_of(state, trained.id)
    assert run.info.status == "FINISHED" and run.info.run_name == trained.name
    assert run.data.params["steps"] == "1"


def test_evaluate_deployment_runs_on_a_worker(trained, ui_stack, prefect_api):
    _, state = ui_stack
    run_as_the_ui_does(ui_stack, prefect_api, "evaluate/evaluate",
                       {"model": f"models:/{POLICY}@candidate", "k": 2, "eval_size": 4, "experiment": EXPERIMENT})
    client = MlflowClient(state["mlflow_url"])
    [run] = client.search_runs([client.get_experiment_by_name(EXPERIMENT).experiment_id], "tags.`ada.flow` = 'evaluate'")
    assert run.info.status == "FINISHED" and run.data.params["trained_by_run"]


@pytest.mark.parametrize(("name", "edits"), [
    ("compare/compare", {"variants": ["grpo"], "matched_grpo": False, "reference": "grpo", "seeds": [0]}),
    ("sweep/sweep", {"variants": ["grpo"], "n": [2], "seeds": [0]}),
])
def test_group_deployment_runs_on_a_worker_and_its_children_on_train(ui_stack, prefect_api, name, edits):
    """The parent on the `groups` worker, its one child as a run of `train` on the training worker; the sweep
    submitted from the form's JSON view (which could never submit: its `overrides` came as Prefect's wrapper)."""
    _, state = ui_stack
    flow_run = run_as_the_ui_does(ui_stack, prefect_api, name, {**SMALL, **edits}, json_view=name == "sweep/sweep")
    parent = mlflow_run_of(state, flow_run.id)
    assert parent.info.status == "FINISHED"
    assert flow_run.name == parent.info.run_name  # one name in both UIs, as the children have
    assert parent.info.run_name.startswith(f"{name.split('/')[0]}-")
    client = MlflowClient(state["mlflow_url"])
    children = client.search_runs([parent.info.experiment_id], f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    assert len(children) == 1 and children[0].info.status == "FINISHED"


def test_paper_tables_deployment_runs_on_a_worker(ui_stack, prefect_api):
    """One pool, one method, one seed: its compare (a subflow, children inline) and the tables; from the form's
    JSON view (pools and overrides in Prefect's wrapper)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId

    _, state = ui_stack
    edits = {"profile": "tiny", "methods": ["grpo"], "seeds": [0], "pools": {"small": {}}, "steps": 1, "prompts_per_step": 2,
             "curate": False, "overrides": FAST, "experiment": EXPERIMENT}
    flow_run = run_as_the_ui_does(ui_stack, prefect_api, "paper-tables/paper-tables", edits, json_view=True)
    with prefect_api(f"{state['prefect_url']}/api"):
        with get_client(sync_client=True) as prefect:
            subflows = prefect.read_flow_runs(flow_run_filter=FlowRunFilter(
                parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[flow_run.id])))
    [compare_run] = subflows
    parent = mlflow_run_of(state, compare_run.id)
    assert parent.info.run_name == compare_run.name and parent.info.status == "FINISHED"
    artifacts = MlflowClient(state["mlflow_url"]).list_artifacts(parent.info.run_id, "report")
    assert "report/paper_tables.md" in {a.path for a in artifacts}


def test_paper_tables_form_defaults_are_the_paper_grid(ui_stack, prefect_api):
    """An untouched form runs benchmarks/paper_tables.py's whole grid (no run here: it takes hours)."""
    from prefect.client.orchestration import get_client

    from flows.params import PAPER_METHODS, PAPER_OVERRIDES, PAPER_POOLS, PAPER_SEEDS

    _, state = ui_stack
    with prefect_api(f"{state['prefect_url']}/api"):
        with get_client(sync_client=True) as client:
            deployment = client.read_deployment_by_name("paper-tables/paper-tables")
    assert deployment.work_queue_name == "default"
    schema = deployment.parameter_openapi_schema["definitions"]["PaperTablesParams"]["properties"]
    defaults = {name: schema[name].get("default") for name in ("methods", "seeds", "pools", "overrides", "steps")}
    assert defaults == {"methods": PAPER_METHODS, "seeds": PAPER_SEEDS, "pools": PAPER_POOLS,
                        "overrides": PAPER_OVERRIDES, "steps": None}


def test_an_unknown_override_key_marks_its_field_with_a_short_message(ui_stack, prefect_api):
    """What the form does before it submits (the server's /ui/schemas/validate, which says which field is
    wrong) and what creating the run answers: the unknown key named in one short line, on `overrides`; it
    used to be a list of all ~120 keys, shown as a corner toast."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import PrefectHTTPStatusError

    _, state = ui_stack
    message = "Additional properties are not allowed ('sampler.MM' was unexpected)"
    typed = {"params": {"overrides": {"__prefect_kind": "json", "value": '{"sampler.MM": 8}'}}}
    with prefect_api(f"{state['prefect_url']}/api"):
        with get_client(sync_client=True) as client:
            deployment = client.read_deployment_by_name("train/train")
            checked = client._client.post("/ui/schemas/validate", json={
                "schema": deployment.parameter_openapi_schema, "values": typed}).json()
            assert checked == {"valid": False, "errors": [
                {"property": "params", "errors": [{"property": "overrides", "errors": [message]}]}]}, checked
            with pytest.raises(PrefectHTTPStatusError) as refused:
                client.create_flow_run_from_deployment(deployment.id, parameters=typed)
    assert refused.value.response.json()["detail"] == (
        f"Error creating flow run: Validation failed for field 'params.overrides'. Failure reason: {message}")
