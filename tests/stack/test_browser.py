"""The two UIs in a real browser, and the links between them.

`make ui` (the shared `ui_stack`) runs on free, non-default ports; headless Chromium (Debian's
`chromium` + `chromium-driver`, `make browser`) opens the Prefect deployments page and the
compare deployment's run form (its defaults shown as an unedited run uses them), then the MLflow
run of a finished `train` and follows its link to the Prefect flow run (one name in both), and
a comparison report as the compare flow writes it: its Prefect artifact's tables and plots fit the
column, and its interactive seed-band page opens in MLflow's artifact view. The same train run is checked
through the APIs: dataset inputs and their digests, the budget-axis series, the Prefect progress
artifacts (the SFT warm start's included) and metrics table. Skips, saying why, where Chromium
or selenium is missing.
"""

from __future__ import annotations

import json
import shutil
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from mlflow import MlflowClient

from ada_core import metrics as K
from ada_core.data import data_digest, load_prompts, prompts_digest, split_prompts
from flows import tracking
from flows.tracking import links

pytestmark = pytest.mark.slow

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--window-size=1400,900"]
STEPS = 2
SFT_STEPS = 2  # curation off: the warm start runs in the train flow itself, and shows its own progress


def _find(*names: str) -> str | None:
    return next((path for name in names if (path := shutil.which(name))), None)


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    """A headless Chromium driven by selenium, with a fresh profile."""
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (pip install -e '.[dev]')")
    from selenium.webdriver.chrome.service import Service

    chromium, driver = _find("chromium", "chromium-browser", "google-chrome"), _find("chromedriver")
    if not chromium or not driver:
        reason = f"no chromium ({chromium}) or chromedriver ({driver}) on PATH; `make browser` installs them"
        print(f"SKIP: {reason}")
        pytest.skip(reason)
    options = webdriver.ChromeOptions()
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}")
    options.binary_location = chromium
    chrome = webdriver.Chrome(options=options, service=Service(driver))  # the Debian driver: no download
    chrome.set_page_load_timeout(60)
    try:
        yield chrome
    finally:
        chrome.quit()


def _wait_for_text(chrome, predicate, timeout_s: float = 60) -> str:
    """The page's visible text once `predicate(text)` holds; fails with the text (and a screenshot) otherwise."""
    deadline = time.monotonic() + timeout_s
    text = ""
    while time.monotonic() < deadline:
        text = chrome.find_element("tag name", "body").text
        if predicate(text):
            return text
        time.sleep(0.5)
    pytest.fail(f"{chrome.current_url}: page never showed what was expected; it shows:\n{text[:2000]}")


def test_prefect_ui_on_other_ports_lists_the_deployments(ui_stack, browser, infra_ui):
    home, state = ui_stack
    assert not state["prefect_url"].endswith(":4200")
    assert all(ok for _, ok, _ in infra_ui.check(state)), infra_ui.check(state)
    browser.get(f"{state['prefect_url']}/deployments")
    text = _wait_for_text(browser, lambda t: all(name in t for name in ("compare", "curate", "evaluate", "sweep", "train")))
    assert "Can't connect" not in text and "4200" not in text
    browser.save_screenshot(str(home / "ui" / "prefect-deployments.png"))


FORM_FIELDS_JS = """
const out = {};
for (const label of arguments[0]) {
  const el = [...document.querySelectorAll(".schema-form-property__label")]
    .find(e => e.textContent.trim().replace(" (Optional)", "") === label);
  if (!el) { out[label] = null; continue; }
  const box = el.closest(".schema-form-property");
  out[label] = {
    selected: [...box.querySelectorAll("select option")].filter(o => o.selected).map(o => o.value),
    values: [...box.querySelectorAll("input:not([type=checkbox])")].map(i => i.value),
    checked: [...box.querySelectorAll("input[type=checkbox]")].map(i => i.checked),
  };
}
return JSON.stringify(out);
"""


def test_compare_form_shows_what_an_unedited_run_does(ui_stack, browser, prefect_api):
    """The form's fields hold the defaults an unedited run uses (list fields too: they used to show
    "0 selected" while a run trained three variants plus the matched control), and a description's
    `<flow>/<deployment>` is still there."""
    from prefect.client.orchestration import get_client

    from flows.params import CompareParams

    home, state = ui_stack
    with prefect_api(f"{state['prefect_url']}/api"):
        with get_client(sync_client=True) as client:
            deployment = client.read_deployment_by_name("compare/compare")
    unedited = CompareParams(**deployment.parameters["params"])  # what a run of the untouched form gets
    children = len(unedited.variants) * len(unedited.seeds) * len(unedited.regimes) + unedited.matched_grpo
    assert (unedited.children, children, unedited.curate) == ("deployments", 2, True)  # two arms, not four

    first = browser.current_window_handle
    browser.switch_to.new_window("tab")  # a form page may hold the tab with "leave this page?": its own tab
    try:
        browser.get(f"{state['prefect_url']}/deployments/deployment/{deployment.id}/run")
        text = _wait_for_text(browser, lambda t: "Regimes" in t and "Matched Grpo" in t and "Eval Every" in t)
        labels = ["Variants", "Seeds", "Regimes", "Matched Grpo", "Curate", "Children", "Eval Every"]
        fields = json.loads(browser.execute_script(FORM_FIELDS_JS, labels))
        browser.save_screenshot(str(home / "ui" / "prefect-compare-form.png"))
    finally:
        browser.close()
        browser.switch_to.window(first)
    assert fields["Variants"]["selected"] == unedited.variants == ["grpo", "ada-balance"], fields
    assert fields["Seeds"]["values"] == [str(s) for s in unedited.seeds] == ["0"], fields
    assert fields["Regimes"]["selected"] == unedited.regimes == ["default"], fields
    assert fields["Matched Grpo"]["checked"] == [False] and fields["Curate"]["checked"] == [True], fields
    # Prefect draws an optional int as an `int | None` switch set to None (no input box): the profile's value
    assert fields["Eval Every"] == {"selected": [], "values": [], "checked": []} and unedited.eval_every is None, fields
    assert fields["Children"]["selected"] == ["deployments"], fields
    assert "<flow>/<deployment>" in text  # in backticks: markdown would take a bare <flow> for a tag


def test_the_compare_form_submitted_twice_creates_a_run_each_time(ui_stack, browser, prefect_api):
    """A walk of the UI once saw a submission hang on "Oops. Something went wrong" with no run created: Prefect's
    server on SQLite answers a write 503 when SQLite refuses it ("database is locked", a deferred transaction
    that read before another connection wrote), and the UI, unlike Prefect's client, does not retry.
    infra/prefect_server.py replays the Run button's request. Here another caller writes all along (variables
    made and deleted over plain HTTP) while the form is submitted twice: each click leaves the form within the
    bound, no error page, one new run each with the unedited form's parameters (`overrides` an object, not
    Prefect's JSON wrapper). The compare queue is paused meanwhile, so the runs wait; they are deleted after."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId

    home, state = ui_stack
    with prefect_api(f"{state['prefect_url']}/api"), get_client(sync_client=True) as client:
        deployment = client.read_deployment_by_name("compare/compare")
        queue = client.read_work_queue_by_name(deployment.work_queue_name, work_pool_name=deployment.work_pool_name)
        only_compare = DeploymentFilter(id=DeploymentFilterId(any_=[deployment.id]))
        before = {run.id for run in client.read_flow_runs(deployment_filter=only_compare)}
        client.update_work_queue(queue.id, is_paused=True)
        answers, stop = [], threading.Event()
        writer = threading.Thread(target=_write_until, args=(f"{state['prefect_url']}/api", stop, answers), daemon=True)
        writer.start()
        first = browser.current_window_handle
        browser.switch_to.new_window("tab")
        created: list = []
        try:
            for attempt in range(2):
                form = f"{state['prefect_url']}/deployments/deployment/{deployment.id}/run"
                browser.get(form)
                _wait_for_text(browser, lambda t: "Matched Grpo" in t)
                submit = next(b for b in browser.find_elements("tag name", "button") if b.text.strip() == "Submit")
                submit.click()
                text = _wait_for_text(browser, lambda t: browser.current_url != form or "went wrong" in t, timeout_s=30)
                assert "went wrong" not in text and "Oops" not in text, (attempt, text[:1000])
                runs = client.read_flow_runs(deployment_filter=only_compare)
                created = [run for run in runs if run.id not in before]
                assert len(created) == attempt + 1, (attempt, [run.name for run in created])
        finally:
            stop.set()
            writer.join(30)
            browser.close()
            browser.switch_to.window(first)
            client.update_work_queue(queue.id, is_paused=False)
            for run in created:
                client.delete_flow_run(run.id)
    for run in created:
        assert run.state.is_scheduled(), run.state
        assert run.parameters["params"]["overrides"] == {}, run.parameters
        assert run.parameters["params"]["variants"] == ["grpo", "ada-balance"], run.parameters
    assert answers, "the other caller wrote nothing"


def _write_until(api: str, stop: threading.Event, answers: list[int]) -> None:
    """Another caller of the API that does not retry (plain httpx): a variable made and deleted, again and again."""
    import httpx

    with httpx.Client(base_url=api, timeout=30) as http:
        for i in range(100_000):
            if stop.is_set():
                return
            made = http.post("/variables/", json={"name": f"busy_{i}", "value": i})
            answers.append(made.status_code)
            if made.status_code < 400:
                answers.append(http.delete(f"/variables/name/busy_{i}").status_code)
            stop.wait(0.02)


def test_ui_status_names_what_is_wrong(infra_ui, free_port):
    """A Prefect server whose UI calls another port, a dead MLflow and no worker: three PROBLEM lines."""

    class WrongUI(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - the http.server API
            body = {"/api/health": True, "/ui-settings": {"api_url": "http://127.0.0.1:4200/api"}}.get(self.path)
            self.send_response(200 if body is not None else 404)
            self.end_headers()
            self.wfile.write(json.dumps(body).encode())

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), WrongUI)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        results = {what: (ok, detail) for what, ok, detail in infra_ui.check(
            {"prefect_url": url, "mlflow_url": f"http://127.0.0.1:{free_port()}", "pids": {}})}
    finally:
        server.shutdown()
    assert results["Prefect API"][0] is True
    assert results["Prefect UI"] == (False, results["Prefect UI"][1])
    assert "http://127.0.0.1:4200/api" in results["Prefect UI"][1] and f"{url}/api" in results["Prefect UI"][1]
    assert results["MLflow"][0] is False and "does not answer" in results["MLflow"][1]
    assert results["worker"][0] is False


@pytest.fixture(scope="module")
def trained(ui_stack, tmp_path_factory, prefect_api):
    """A 2-step `train` flow run on a parquet file, in this process, against the `make ui` servers."""
    from flows.params import TrainParams
    from flows.train import train

    home, state = ui_stack
    data = tmp_path_factory.mktemp("data") / "openr1_sums.parquet"
    pq.write_table(pa.Table.from_pylist([
        {"problem": f"{a}+{a % 7}=", "answer": str(a + a % 7), "uuid": f"sum-{a}", "problem_type": "Algebra",
         "question_type": "math-word-problem", "source": "synthetic"} for a in range(60)]), data)  # 20 for the SFT
    params = TrainParams(
        preset="ada-balance", steps=STEPS, prompts_per_step=4, curate=False, tracking_uri=state["mlflow_url"],
        experiment="browser-test",
        overrides={"data.dataset": str(data), "data.train_size": 32, "data.eval_size": 8, "eval_every": 1,
                   "eval_k": 2, "checkpoint_every": 0, "sft_steps": SFT_STEPS},
    )
    with prefect_api(f"{state['prefect_url']}/api"):
        result = train(params)
    return state, result, data, params.config()


def test_mlflow_run_links_to_its_prefect_flow_run(trained, browser, ui_stack, prefect_api):
    state, result, _, _ = trained
    home, _ = ui_stack
    client = MlflowClient(state["mlflow_url"])
    run = client.get_run(result["run_id"])
    prefect_url = run.data.tags[links.PREFECT_RUN_URL_TAG]
    assert prefect_url == f"{state['prefect_url']}/runs/flow-run/{run.data.tags['prefect.flow_run_id']}"
    assert prefect_url in run.data.tags[links.NOTE_TAG]
    experiment = client.get_experiment(run.info.experiment_id)
    assert experiment.tags[tracking.EXPERIMENT_KIND_TAG] == "custom_model_development"

    browser.get(links.mlflow_run_url(state["mlflow_url"], run.info.experiment_id, run.info.run_id))
    _wait_for_text(browser, lambda t: run.info.run_name in t and "Prefect flow run" in t)
    assert "Model training" in browser.find_element("tag name", "body").text
    browser.save_screenshot(str(home / "ui" / "mlflow-run.png"))
    anchors = [a for a in browser.find_elements("tag name", "a") if a.get_attribute("href") == prefect_url]
    assert anchors, f"no link to {prefect_url} on the MLflow run page"
    browser.get(anchors[0].get_attribute("href"))  # the anchor opens a new tab; follow it in this one
    # One name in both UIs: the standalone run's flow run is named after its MLflow run.
    assert run.info.run_name.startswith("train-ada-balance-s0-")
    text = _wait_for_text(browser, lambda t: run.info.run_name in t and "Completed" in t)
    assert "Can't connect" not in text
    browser.save_screenshot(str(home / "ui" / "prefect-flow-run.png"))
    from prefect.client.orchestration import get_client

    with prefect_api(f"{state['prefect_url']}/api"):
        with get_client(sync_client=True) as prefect:
            assert prefect.read_flow_run(run.data.tags["prefect.flow_run_id"]).name == run.info.run_name


def test_train_run_logs_its_data_and_budget_series(trained):
    state, result, data, config = trained
    client = MlflowClient(state["mlflow_url"])
    run = client.get_run(result["run_id"])
    prompts = load_prompts(str(data), size=config.data.train_size + config.data.eval_size, seed=config.seed)
    train_split, eval_split = split_prompts(prompts, config.data.eval_size, config.seed)
    inputs = {{t.key: t.value for t in i.tags}["mlflow.data.context"]: i for i in run.inputs.dataset_inputs}
    assert set(inputs) == {"training", "evaluation"}
    assert inputs["training"].dataset.digest == prompts_digest(train_split)
    assert inputs["evaluation"].dataset.digest == prompts_digest(eval_split)
    for item in inputs.values():
        assert {t.key: t.value for t in item.tags}["ada.source_digest"] == data_digest(str(data))
        assert data.name in item.dataset.source and json.loads(item.dataset.schema)["mlflow_colspec"]
    assert run.data.params["dataset_hash"] == data_digest(str(data))

    # The eval curve read off the shared budget grid, from 0 to the samples generated by the last evaluation.
    accuracy = client.get_metric_history(run.info.run_id, K.budget_axis_key(K.VS_SAMPLES, K.EVAL_AVG_AT_K))
    samples = [m.value for m in client.get_metric_history(run.info.run_id, K.BUDGET_GENERATED_SAMPLES_CUM)]
    assert [m.step for m in accuracy] == tracking.grid_points(-1, samples[-1])
    evals = client.get_metric_history(run.info.run_id, K.EVAL_AVG_AT_K)
    assert accuracy[0].value == evals[0].value and accuracy[-1].step <= samples[-1]
    compute = client.get_metric_history(run.info.run_id, K.budget_axis_key(K.VS_MFLOPS, K.EVAL_AVG_AT_K))
    assert compute[0].step == 0 and compute[-1].step > compute[1].step > 0
    assert client.get_metric_history(run.info.run_id, K.budget_axis_key(K.VS_SAMPLES, K.REWARD_MEAN))


def test_prefect_shows_progress_and_links_to_mlflow(trained, prefect_api):
    state, result, _, _ = trained
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, LogFilter, LogFilterFlowRunId

    client = MlflowClient(state["mlflow_url"])
    run = client.get_run(result["run_id"])
    flow_run_id = run.data.tags["prefect.flow_run_id"]
    with prefect_api(f"{state['prefect_url']}/api"):
        with get_client(sync_client=True) as prefect:
            artifacts = prefect.read_artifacts(artifact_filter=ArtifactFilter(
                flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id])))
            logs = prefect.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])))
    by_type = {}
    for artifact in artifacts:
        by_type.setdefault(artifact.type, []).append(artifact)
    progress = {a.description.split(":")[0].split(" of ")[0]: a for a in by_type["progress"]}
    assert set(progress) == {"warm start (SFT)", f"train {run.info.run_name}"}, progress
    assert progress["warm start (SFT)"].data == 100.0
    assert progress["warm start (SFT)"].description.endswith(f"step {SFT_STEPS} of {SFT_STEPS}")
    bar = progress[f"train {run.info.run_name}"]
    assert bar.data == 100.0 and bar.description.endswith(f"step {STEPS} of {STEPS}")
    [table] = by_type["table"]
    rows = {row["key"]: row for row in json.loads(table.data)}
    assert rows[K.EVAL_AVG_AT_K]["step"] == STEPS and rows[K.REWARD_MEAN]["metric"] == "reward (round-1 mean)"
    run_url = links.mlflow_run_url(state["mlflow_url"], run.info.experiment_id, run.info.run_id)
    [markdown] = by_type["markdown"]
    assert f"]({run_url})" in markdown.data
    lines = [log.message for log in logs]
    assert any(line.endswith(run_url) for line in lines), lines  # the URL ends the line: nothing glued on


REPORT_WIDTHS_JS = """
return [...document.querySelectorAll('table, img')].map(e => {
  const box = e.parentElement.getBoundingClientRect();
  return [e.tagName, (e.alt || e.innerText.split('\\n')[0]).slice(0, 60), Math.round(e.getBoundingClientRect().width),
          Math.round(box.width)];
});
"""
PLOTLY_TRACES_JS = ("const p = document.querySelector('.js-plotly-plot'); "
                    "return p && p.data ? p.data.map(t => [t.name, t.fill || '', t.x.length]) : null;")


def _plotly_traces(chrome, timeout_s: float = 90):
    """The traces of the page's plotly figure once its inlined script has drawn it, searching MLflow's frames."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        chrome.switch_to.default_content()
        for frame in [None, *chrome.find_elements("tag name", "iframe")]:
            if frame is not None:
                chrome.switch_to.default_content()
                chrome.switch_to.frame(frame)
            traces = chrome.execute_script(PLOTLY_TRACES_JS)
            if traces:
                return traces
        time.sleep(1)
    chrome.switch_to.default_content()
    pytest.fail(f"{chrome.current_url}: no plotly figure drawn")


def test_a_compare_report_fits_its_column_and_opens_its_bands_in_mlflow(ui_stack, browser, tmp_path, prefect_api):
    """A two-variant, two-seed compare report as `finish_group` writes it (the parent MLflow run's report/ and the
    Prefect artifact), read as a person reads it: every table and plot of the artifact fits its column, and the
    bands.html link opens the interactive page in MLflow's artifact view, each variant's mean and band over the
    seeds drawn (the server's raw get-artifact URL would download it)."""
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, ArtifactFilterKey

    from flows.group import finish_group
    from support import write_run_folder

    home, state = ui_stack
    client = MlflowClient(state["mlflow_url"])
    experiment = tracking.ensure_experiment(client, "browser-report")
    parent_id = client.create_run(experiment, run_name="compare-browser").info.run_id
    results = []
    for label, samples, curves in (("grpo", 8.0, ([0.1, 0.2, 0.3], [0.1, 0.25, 0.35])),
                                   ("ada-balance", 13.0, ([0.1, 0.3, 0.5], [0.1, 0.35, 0.45]))):
        for seed, accuracy in enumerate(curves):
            run_dir = write_run_folder(tmp_path / f"{label}-s{seed}", label, seed, accuracy, samples)
            run_id = client.create_run(experiment, run_name=f"{label}-s{seed}",
                                       tags={"mlflow.parentRunId": parent_id}).info.run_id
            results.append({"variant": label, "preset": label, "seed": seed, "run_dir": str(run_dir), "run_id": run_id,
                            "model_artifact": None, "metrics": {K.EVAL_AVG_AT_K: accuracy[-1]}})

    @flow(name="browser-report")
    def report_flow():
        return finish_group(client, parent_id, "compare", results, tmp_path / "group", "browser-policy", "champion",
                            ["grpo", "ada-balance"], reference="grpo")

    with prefect_api(f"{state['prefect_url']}/api"):
        flow_run_id = report_flow(return_state=True).state_details.flow_run_id
        with get_client(sync_client=True) as prefect:  # its own: the stack's compare deployments write one too
            [artifact] = prefect.read_artifacts(artifact_filter=ArtifactFilter(
                key=ArtifactFilterKey(any_=["compare-report"]), flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id])))
    browser.get(f"{state['prefect_url']}/artifacts/artifact/{artifact.id}")
    _wait_for_text(browser, lambda t: "Table C" in t and "Interactive" in t)
    time.sleep(3)  # the plots load from the MLflow server
    widths = browser.execute_script(REPORT_WIDTHS_JS)
    assert len([w for w in widths if w[0] == "TABLE"]) >= 4 and len([w for w in widths if w[0] == "IMG"]) >= 8, widths
    assert all(width <= column + 1 for _, _, width, column in widths), widths  # nothing cut off at the right
    browser.set_window_size(1400, 4200)
    browser.save_screenshot(str(home / "ui" / "prefect-compare-report.png"))
    browser.set_window_size(1400, 900)

    [href] = [a.get_attribute("href") for a in browser.find_elements("tag name", "a") if a.text == "bands.html"]
    assert href == links.mlflow_artifact_page_url(state["mlflow_url"], experiment, parent_id, "report/bands.html")
    browser.get(href)
    traces = _plotly_traces(browser)
    title = browser.execute_script("return document.querySelector('.js-plotly-plot').layout.title.text;")
    browser.switch_to.default_content()
    browser.save_screenshot(str(home / "ui" / "mlflow-report-bands.png"))
    assert title.startswith("Mean over seeds with a ±1 std band (grpo: 2 seeds, ada-balance: 2 seeds)<br>"), title
    bands = {name for name, fill, _ in traces if fill == "toself"}
    assert bands == {"grpo ±1 std", "ada-balance ±1 std"}, traces
    means = {name for name, fill, n in traces if not fill and n}
    assert means == {"grpo (mean of 2 seeds)", "ada-balance (mean of 2 seeds)"}, traces
