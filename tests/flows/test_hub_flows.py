"""Hub ids end to end, offline: a hub cache built here (HF_HUB_OFFLINE=1, HF_HOME in tmp) holds the
tiny model, a small arithmetic dataset and the paper suite's four benchmarks; a train flow named by
hub ids trains on them and logs their commits, and `evaluate` scores the suite as the paper's table.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml
from mlflow import MlflowClient
from support import dataset_card, put_in_hub_cache
from test_resume_flows import run_until_killed
from typer.testing import CliRunner

from ada_core.run.files import CONFIG, RUN_INFO, read_metrics

from flows import tracking
from flows.params import CompareParams, EvaluateParams, TrainParams

pytestmark = pytest.mark.slow

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
SUITE_FILES = {  # the paper suite's hub ids -> the local fixture in that benchmark's schema
    "weqweasdas/math500": "math500.parquet", "weqweasdas/minerva_math": "minerva.jsonl",
    "weqweasdas/olympiadbench": "olympiadbench.parquet", "weqweasdas/aime_hmmt_brumo_cmimc_amc23": "aime.parquet",
}


def tiny_readable(fixture: Path, out: Path) -> Path:
    """`fixture` with its columns, ids and types kept but every problem an `a+b=` sum the tiny model can read."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = (pq.read_table(fixture).to_pylist() if fixture.suffix == ".parquet"
            else [json.loads(line) for line in fixture.read_text().splitlines() if line.strip()])
    for i, row in enumerate(rows):
        a, b = 3 + i, 4 + 2 * i
        for text in ("problem", "question"):
            if text in row:
                row[text] = f"{a}+{b}="
        for answer in ("answer", "final_answer"):
            if answer in row:
                row[answer] = [str(a + b)] if isinstance(row[answer], list) else type(row[answer])(a + b)
        if "solution" in row:
            row["solution"] = f"\\boxed{{{a + b}}}"
    if fixture.suffix == ".parquet":
        pq.write_table(pa.Table.from_pylist(rows), out)
    else:
        out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return out


@pytest.fixture(scope="module")
def hub(prefect_harness, tiny_model, tmp_path_factory):
    from ada_core.data import generate_prompts

    root = tmp_path_factory.mktemp("hf")
    cache = root / "hub"
    commits = {"model": put_in_hub_cache(cache, "model", "ada-test/tiny", {
        p.name: p for p in Path(tiny_model).iterdir() if p.is_file()})}
    rows = [{"id": p.id, "text": p.text, "answer": p.answer, "source": p.source, "meta": p.meta}
            for p in generate_prompts("arithmetic", 48, 0)]
    commits["dataset"] = put_in_hub_cache(cache, "dataset", "ada-test/arithmetic", {
        "README.md": dataset_card({"train": "data/train-*"}),
        "data/train-00000-of-00001.jsonl": "".join(json.dumps(r) + "\n" for r in rows),
    })
    for repo, name in SUITE_FILES.items():
        suffix = Path(name).suffix
        commits[repo] = put_in_hub_cache(cache, "dataset", repo, {
            "README.md": dataset_card({"train": f"data/train-*{suffix}"}),
            f"data/train-00000-of-00001{suffix}": tiny_readable(FIXTURES / name, root / name),
        })
    patch = pytest.MonkeyPatch()
    patch.setenv("HF_HOME", str(root))
    patch.delenv("HF_HUB_CACHE", raising=False)
    patch.setenv("HF_HUB_OFFLINE", "1")
    patch.setenv("TQDM_DISABLE", "1")
    yield commits, MlflowClient(tracking.default_tracking_uri())
    patch.undo()


SHORT = {"model": "ada-test/tiny", "data.dataset": "ada-test/arithmetic", "data.train_size": 40, "data.eval_size": 8,
         "sft_steps": 0, "eval_every": 1, "eval_k": 2, "checkpoint_every": 0, "eval_suite": "paper",
         "eval_max_tokens": 6}


def test_a_train_flow_named_by_hub_ids_trains_and_logs_their_commits(hub):
    from flows.train import train

    commits, client = hub
    result = train(TrainParams(preset="grpo", steps=1, prompts_per_step=4, curate=False, overrides=SHORT,
                               experiment="flows-hub"))
    run = client.get_run(result["run_id"])
    assert run.info.status == "FINISHED"
    assert run.data.tags["ada.model_revision"] == run.data.params["model"] == f"ada-test/tiny@{commits['model']}"
    assert run.data.tags["ada.dataset_revision"] == f"ada-test/arithmetic@{commits['dataset']}"
    sources = {i.dataset.name: i.dataset for i in run.inputs.dataset_inputs}
    keys = ("math500", "minerva_math", "olympiad_bench", "aime_like")
    suite = {f"{repo}:{key}": repo for repo, key in zip(SUITE_FILES, keys)}  # the suite's benchmarks, pinned too
    assert set(sources) == {"ada-test/arithmetic:training", "ada-test/arithmetic:evaluation", *suite}
    for name, dataset in sources.items():
        source = json.loads(dataset.source)
        repo = suite.get(name, "ada-test/arithmetic")
        assert dataset.source_type == "hugging_face"
        assert (source["path"], source["split"], source["revision"]) == (repo, "train", commits[suite.get(name, "dataset")])
    assert run.data.params["eval_suite_revisions"] == str([f"{repo}@{commits[repo]}" for repo in SUITE_FILES])
    weighted = client.get_metric_history(result["run_id"], "eval_suite/weighted/avg_at_k")
    assert [m.step for m in weighted] == [0, 1]
    assert client.get_metric_history(result["run_id"], "eval_suite/math500/prompts")[0].value == 3
    tables = {a.path for a in client.list_artifacts(result["run_id"], "suite")}
    assert {"suite/accuracy_step_000000.md", "suite/accuracy_step_000001.json"} <= tables


def test_evaluate_scores_the_paper_suite_as_the_papers_table(hub):
    from flows.evaluate import evaluate

    commits, client = hub
    result = evaluate(EvaluateParams(model="ada-test/tiny", suite="paper", k=2, max_tokens=4, eval_size=8,
                                     dataset="arithmetic", experiment="flows-hub-eval"))
    run = client.get_run(result["run_id"])
    assert run.data.tags["ada.model_revision"] == f"ada-test/tiny@{commits['model']}"
    assert run.data.params["k"] == "2" and run.data.params["max_tokens"] == "4" and run.data.params["suite"] == "paper"
    prompts = {b: run.data.metrics[f"eval_suite/{b}/prompts"] for b in ("math500", "minerva_math", "olympiad_bench",
                                                                          "aime_like")}
    assert prompts == {"math500": 3, "minerva_math": 2, "olympiad_bench": 2, "aime_like": 2}
    assert result["table"].splitlines()[0] == (
        "| Model | Math500 | Minerva Math | Olympiad Bench | AIME-like | Weighted Average |")
    artifact = client.download_artifacts(result["run_id"], "suite/accuracy_step_000000.md")
    assert Path(artifact).read_text() == result["table"]
    rows = json.loads(Path(client.download_artifacts(result["run_id"], "suite/accuracy_step_000000.json")).read_text())
    assert rows["columns"][:3] == ["benchmark", "prompts", "avg_at_k"] and len(rows["data"]) == 5
    revisions = {i.dataset.name: json.loads(i.dataset.source)["revision"] for i in run.inputs.dataset_inputs
                 if i.dataset.source_type == "hugging_face"}  # the held-out split of `arithmetic` is the other one
    assert revisions == {f"{repo}:{ctx}": commits[repo] for repo, ctx in zip(
        SUITE_FILES, ("math500", "minerva_math", "olympiad_bench", "aime_like"))}


def test_the_cli_evaluates_a_suite_by_hub_ids(hub, tmp_path):
    from ada_core.cli import app

    result = CliRunner().invoke(app, ["evaluate", "--model", "ada-test/tiny", "--suite", "paper", "--k", "1",
                                      "--max-tokens", "4", "--eval-size", "4", "--output-dir", str(tmp_path / "ev")])
    assert result.exit_code == 0, result.output
    assert "| Model | Math500 | Minerva Math | Olympiad Bench | AIME-like | Weighted Average |" in result.stdout
    assert "avg@1 accuracy (%) at temperature 1 with at most 4 generated tokens" in result.stdout


# ---------------------------------------------------------------------------------------------
# Runs named by hub ids resume as the same run, at the commits they pinned

@pytest.fixture
def killable(hub, monkeypatch):
    """What a flow killed in a child process needs: the harness's API, one torch thread."""
    from prefect.settings import PREFECT_API_URL

    monkeypatch.setenv("PREFECT_API_URL", PREFECT_API_URL.value())  # the killed child reports to the harness
    monkeypatch.setenv("ADA_TORCH_THREADS", "1")
    return hub


@pytest.fixture
def hub_moves_on(hub):
    """`move(repo, files)`: a new commit of a dataset at `main` (the hub moved on after a run pinned it);
    every moved ref is put back afterwards, for the module's other tests."""
    cache = Path(os.environ["HF_HOME"]) / "hub"
    moved = []

    def move(repo: str, files: dict) -> str:
        moved.append(repo)
        return put_in_hub_cache(cache, "dataset", repo, files)

    yield move
    commits, _ = hub
    for repo in moved:
        key = "dataset" if repo == "ada-test/arithmetic" else repo
        (cache / f"datasets--{repo.replace('/', '--')}" / "refs" / "main").write_text(commits[key])


def hub_revisions(run) -> dict[str, str]:
    """MLflow dataset input name -> the commit its Hugging Face source names."""
    return {i.dataset.name: json.loads(i.dataset.source)["revision"] for i in run.inputs.dataset_inputs
            if i.dataset.source_type == "hugging_face"}


def test_a_killed_hub_train_flow_resumes_at_the_commits_it_pinned(killable, hub_moves_on, tmp_path):
    """A run whose model, dataset and suite are hub ids is killed; the hub moves on (new commits at `main`);
    resumed with the same parameters it is the same run, and reads and scores what it pinned at its start."""
    from flows.train import train

    commits, client = killable
    params = {"preset": "grpo", "steps": 4, "prompts_per_step": 4, "curate": False, "experiment": "flows-hub-resume",
              "overrides": {**SHORT, "eval_every": 2, "checkpoint_every": 2}}
    killed = tmp_path / "killed"
    run_until_killed("train", {**params, "output_dir": str(killed)}, "killed", "checkpoint", 2, tmp_path / "child.log")
    saved = (killed / CONFIG).read_text()
    config = yaml.safe_load(saved)
    assert config["model"] == f"ada-test/tiny@{commits['model']}"
    assert config["data"]["dataset"] == f"ada-test/arithmetic@{commits['dataset']}"
    assert config["eval_suite_revisions"] == [f"{repo}@{commits[repo]}" for repo in SUITE_FILES]
    rows = [{"id": f"n{i}", "text": f"{i}+1=", "answer": str(i + 1)} for i in range(48)]
    hub_moves_on("ada-test/arithmetic", {"README.md": dataset_card({"train": "data/train-*"}),
                                         "data/train-00000-of-00001.jsonl": "".join(json.dumps(r) + "\n" for r in rows)})
    hub_moves_on("weqweasdas/math500", {"README.md": dataset_card({"train": "data/train-*.jsonl"}),
                                        "data/train-0.jsonl": '{"problem": "1+1=", "answer": "2"}\n'})

    run_id = json.loads((killed / RUN_INFO).read_text())["mlflow_run_id"]
    result = train(TrainParams(**params, resume=run_id))
    run = client.get_run(run_id)
    assert result["run_id"] == run_id and run.info.status == "FINISHED"
    assert run.data.tags["ada.resumed_from"] == "step_000002" and "ada.resume_changes" not in run.data.tags
    assert (killed / CONFIG).read_text() == saved
    assert [r["step"] for r in read_metrics(killed) if "time/step_s" in r] == [1, 2, 3, 4]
    keys = ("math500", "minerva_math", "olympiad_bench", "aime_like")
    assert hub_revisions(run) == {
        "ada-test/arithmetic:training": commits["dataset"], "ada-test/arithmetic:evaluation": commits["dataset"],
        **{f"{repo}:{key}": commits[repo] for repo, key in zip(SUITE_FILES, keys)}}
    math500 = client.get_metric_history(run_id, "eval_suite/math500/prompts")
    assert [(m.step, m.value) for m in math500] == [(0, 3), (2, 3), (4, 3)]  # the pinned 3, not main's 1


def test_a_killed_compare_of_hub_ids_with_a_curated_child_resumes(killable, tmp_path, ada_home):
    """A compare whose model and dataset are hub ids, its child curated first, is killed mid-child and
    resumed: the child's request names the ids unpinned, its config the curated set from the pinned ones."""
    from flows.compare import compare

    commits, client = killable
    overrides = {k: v for k, v in SHORT.items() if k != "eval_suite"}
    params = {"variants": ["grpo"], "matched_grpo": False, "steps": 4, "prompts_per_step": 4, "curate": True,
              "experiment": "flows-hub-compare", "overrides": {
                  **overrides, "eval_every": 2, "checkpoint_every": 2, "data.curation_k": 2,
                  "data.keep_pass_rate": [0.0, 1.0]}}
    runs = ada_home / "runs"
    existing = set(runs.glob("compare-*")) if runs.exists() else set()
    run_until_killed("compare", params, "grpo-s0", "checkpoint", 2, tmp_path / "child.log")
    [group] = set(runs.glob("compare-*")) - existing
    child = group / "grpo-s0"
    child_run = json.loads((child / RUN_INFO).read_text())["mlflow_run_id"]
    curation = json.loads((Path(yaml.safe_load((child / CONFIG).read_text())["data"]["dataset"]) / "curation.json")
                          .read_text())
    assert curation["inputs"]["model"] == f"ada-test/tiny@{commits['model']}"

    summary = compare(CompareParams(**params, resume=str(group)))
    assert [c["run_id"] for c in summary["children"]] == [child_run] and summary["failures"] == []
    run = client.get_run(child_run)
    assert run.info.status == "FINISHED" and run.data.tags["ada.resumed_from"] == "step_000002"
    assert run.data.tags["ada.model_revision"] == f"ada-test/tiny@{commits['model']}"
    assert [r["step"] for r in read_metrics(child) if "time/step_s" in r] == [1, 2, 3, 4]
