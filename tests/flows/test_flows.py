"""The real flows under Prefect's test harness, inspected through MlflowClient and the Prefect API.

One `compare` run (GRPO vs Ada-balance + the matched GRPO control, curated prompts, 2 steps each)
is shared by most tests; `sweep`, `evaluate`, `curate` and a `train` on PostgreSQL run once each.
Sizes are tiny: the point is the plumbing (parent/child runs, params, per-step metrics, system
metrics, checkpoints, tables, report, registry, task runs, caching), not learning.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

import pytest
from mlflow import MlflowClient
from pydantic import ValidationError

from ada_core import metrics as K
from ada_core.sampling.budget import matched_grpo_prompts
from ada_core.config import ConfigError
from ada_core.run.folder import RunDirError
from ada_core.run.files import read_metrics
from flows import tracking
from flows.params import CompareParams, EvaluateParams, SweepParams, TrainParams


pytestmark = pytest.mark.slow

# Seconds per run. Two-digit sums and a short SFT warm start: the curated set (prompts solved at
# least once in 4) keeps ~15% of the 412-prompt pool, enough for 12 held out and 4 per step.
SMALL = {
    "data.dataset": "arithmetic:2", "data.train_size": 400, "data.eval_size": 12, "data.curation_k": 4,
    "data.pass_rate_ceiling": 1.0, "sft_steps": 150, "eval_every": 1, "eval_k": 2, "checkpoint_every": 0,
}
# A run that does not curate refuses the curation fields (ada_core/config/applies.py: nothing reads them).
UNCURATED = {k: v for k, v in SMALL.items() if k not in ("data.curation_k", "data.pass_rate_ceiling")}
HEADLINE = ["N", "M", "n", "variant", "sampler", "advantage", "model", "dataset_hash", "seed"]


@pytest.fixture(scope="module")
def flows_env(prefect_harness, ada_home):
    patch = pytest.MonkeyPatch()
    # Short runs still get samples: the monitor publishes only after its first interval, and a warm
    # 2-step child run can end within a second.
    patch.setenv("MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL", "0.2")
    patch.setenv("TQDM_DISABLE", "1")
    yield MlflowClient(tracking.default_tracking_uri())
    patch.undo()


@pytest.fixture(scope="module")
def compared(flows_env):
    from flows.compare import compare

    summary = compare(CompareParams(
        variants=["grpo", "ada-balance"], matched_grpo=True, seeds=[0], steps=2, prompts_per_step=4,
        overrides=SMALL, experiment="flows-compare",
    ))
    return summary, flows_env


def _children(client: MlflowClient, parent_id: str) -> dict[str, object]:
    """Child runs by `<variant>-s<seed>`; their run names are `<variant>-s<seed> @ <group>`, their
    study tag the group's, which is the parent's name and study."""
    parent = client.get_run(parent_id)
    runs = client.search_runs([parent.info.experiment_id], f"tags.mlflow.parentRunId = '{parent_id}'")
    assert all(r.info.run_name.endswith(f" @ {parent.info.run_name}") for r in runs)
    assert {r.data.tags["ada.study"] for r in runs} == {parent.data.tags["ada.study"]} == {parent.info.run_name}
    return {r.info.run_name.split(" @ ")[0]: r for r in runs}


# ---------------------------------------------------------------------------------------------
# compare: parent/child structure, params, metrics, artifacts, report, registry, task runs


def test_compare_makes_one_child_run_per_variant_and_seed(compared):
    summary, client = compared
    parent = client.get_run(summary["parent_run_id"])
    assert parent.info.status == "FINISHED" and "mlflow.parentRunId" not in parent.data.tags
    assert json.loads(parent.data.params["variants"]) == ["grpo", "ada-balance"]
    children = _children(client, summary["parent_run_id"])
    assert set(children) == {"grpo-s0", "ada-balance-s0", "grpo-matched-s0"}
    assert all(r.info.status == "FINISHED" for r in children.values())


def test_every_child_logs_params_step_metrics_and_system_metrics(compared):
    summary, client = compared
    children = _children(client, summary["parent_run_id"])
    ada = children["ada-balance-s0"]
    for key in HEADLINE:
        assert key in ada.data.params, key
    assert (ada.data.params["variant"], ada.data.params["sampler"], ada.data.params["advantage"]) == (
        "ada-balance", "ada", "global_mean")
    assert ada.data.params["sampler.exit_rule"] == "balance" and ada.data.params["model"] == "tiny"
    assert ada.data.params["curated"] == "True" and int(ada.data.params["num_params"]) > 100_000
    assert len({r.data.params["dataset_hash"] for r in children.values()}) == 1  # one curated set for all
    grpo = children["grpo-s0"].data.params
    assert (grpo["N"], grpo["M"], grpo["sampler.exit_rule"], grpo["n"]) == ("n/a", "n/a", "n/a", "4")  # unused by GRPO
    assert ada.data.params["N"] == "4"

    for run in children.values():  # the training and eval splits of the curated set, with its digest
        contexts = {{t.key: t.value for t in i.tags}["mlflow.data.context"]: i for i in run.inputs.dataset_inputs}
        assert set(contexts) == {"training", "evaluation"}
        assert all({t.key: t.value for t in i.tags}["ada.source_digest"] == run.data.params["dataset_hash"]
                   for i in contexts.values())
        # ... and the digest of the data it was curated from: the one the curation cache keys on.
        from tasks.curation import curation_inputs

        source_digest = curation_inputs(CompareParams(steps=2, prompts_per_step=4, overrides=SMALL).build("grpo", 0),
                                        0)["dataset_digest"]
        assert {t.key: t.value for t in contexts["training"].tags}["ada.curated_from_digest"] == source_digest
        assert run.data.tags["mlflow.note.content"].startswith(f"`{run.data.tags['ada.variant']}` (a child")

    for run in children.values():
        run_id = run.info.run_id
        assert [m.step for m in client.get_metric_history(run_id, K.REWARD_MEAN)] == [1, 2]
        assert [m.step for m in client.get_metric_history(run_id, K.EVAL_AVG_AT_K)] == [0, 1, 2]
        for key in (K.BUDGET_GENERATED_SAMPLES_CUM, K.BUDGET_TRAINED_TOKENS_CUM, K.BUDGET_LOGPROB_TOKENS_CUM,
                    K.TIME_GENERATE_S, K.TIME_UPDATE_S, K.SAMPLER_EFFECTIVE_RATIO):
            assert key in run.data.metrics, (run.info.run_name, key)
        assert any(k.startswith("system/cpu") for k in run.data.metrics), run.info.run_name


# Every key of a feature these children leave off: asynchronous rollout, the streaming schedule, the KL term,
# more than one training rank.
OFF_IN_EVERY_CHILD = {K.ASYNC_STEPS, K.ASYNC_POLICY_VERSION, K.ASYNC_STALENESS_MEAN, K.ASYNC_STALENESS_MAX,
                      K.ASYNC_WAIT_S, K.TIME_OVERLAP_S, K.BUDGET_ABORTED_TOKENS, K.BUDGET_ABORTED_SAMPLES,
                      K.TIME_REWARD_OVERLAP_S, K.TRAIN_KL_REF, K.DIST_WORLD_SIZE, K.DIST_RANK_UPDATE_MAX_S,
                      K.DIST_RANK_UPDATE_MIN_S}


def test_a_feature_that_is_off_logs_no_metric(compared):
    """No child runs async, streaming, KL or two ranks: none of their keys is in MLflow or metrics.jsonl (no
    all-zero `async/*` charts), and GRPO, which has no unresolved prompts, logs no unresolved counts."""
    summary, client = compared
    for name, run in _children(client, summary["parent_run_id"]).items():
        logged = set(run.data.metrics) | {key for row in read_metrics(run.data.params["run_dir"]) for key in row}
        assert not {key for key in logged if key.startswith("async/")}, name
        assert not OFF_IN_EVERY_CHILD & logged, (name, OFF_IN_EVERY_CHILD & logged)
        assert (K.SAMPLER_UNRESOLVED in logged) == name.startswith("ada-balance"), name
        assert {K.EVAL_AVG_AT_K, K.REWARD_MEAN, K.TIME_STEP_S} <= logged, name


def test_runs_with_different_per_step_budgets_log_budget_points_at_the_same_x_values(compared):
    """GRPO, Ada-balance and the matched control spend their own samples and FLOPs a step, yet each budget-axis
    series has its points at the same budgets wherever the runs overlap (the grid they all read their curves off),
    so MLflow's group-by averages runs point by point. The values are the run's own eval curve, interpolated."""
    import numpy as np

    summary, client = compared
    children = _children(client, summary["parent_run_id"])
    per_step = {name: client.get_metric_history(run.info.run_id, K.BUDGET_GENERATED_SAMPLES)[0].value
                for name, run in children.items()}
    # GRPO spends 4 prompts x 4 samples; what Ada and its matched control spend depends on the draws (they can
    # coincide), so the alignment below is asserted whatever the budgets are, not on their being different.
    assert per_step["grpo-s0"] == 16, per_step
    for axis in (K.VS_SAMPLES, K.VS_MFLOPS):
        for key in (K.EVAL_AVG_AT_K, K.EVAL_PASS_AT_K, K.REWARD_MEAN):
            series = K.budget_axis_key(axis, key)
            steps = {name: [m.step for m in client.get_metric_history(run.info.run_id, series)]
                     for name, run in children.items()}
            assert all(s == sorted(set(s)) and set(s) <= set(tracking.grid_points(-1, max(s))) for s in steps.values())
            for a, b in ((a, b) for a in steps for b in steps if a < b):  # any two runs, where both have points
                start, end = max(steps[a][0], steps[b][0]), min(steps[a][-1], steps[b][-1])
                assert [x for x in steps[a] if start <= x <= end] == [x for x in steps[b] if start <= x <= end], (
                    series, a, b, steps)
            if key != K.REWARD_MEAN:  # the evaluations all start at budget 0: three runs, one set of shared points
                end = min(s[-1] for s in steps.values())
                assert len([x for x in steps["grpo-s0"] if x <= end]) >= 3, (series, steps)
    for run in children.values():  # on the samples axis, the values are the eval curve read off at those budgets
        run_id = run.info.run_id
        evals = client.get_metric_history(run_id, K.EVAL_AVG_AT_K)
        cum = {m.step: m.value for m in client.get_metric_history(run_id, K.BUDGET_GENERATED_SAMPLES_CUM)}
        x, y = [cum.get(m.step, 0.0) for m in evals], [m.value for m in evals]
        points = client.get_metric_history(run_id, K.budget_axis_key(K.VS_SAMPLES, K.EVAL_AVG_AT_K))
        assert [m.step for m in points] == tracking.grid_points(-1, x[-1])
        assert np.allclose([m.value for m in points], np.interp([m.step for m in points], x, y))


def test_checkpoints_and_generation_tables_are_artifacts(compared, tmp_path):
    summary, client = compared
    for run in _children(client, summary["parent_run_id"]).values():
        run_id = run.info.run_id
        checkpoint = {a.path for a in client.list_artifacts(run_id, "checkpoints/step_000002")}
        assert {"checkpoints/step_000002/hf", "checkpoints/step_000002/trainer_state.json"} <= checkpoint
        tables = [a.path for a in client.list_artifacts(run_id, "generations")]
        assert tables == ["generations/step_000000.json", "generations/step_000001.json", "generations/step_000002.json"]
        table = json.loads(Path(client.download_artifacts(run_id, tables[0], str(tmp_path))).read_text())
        assert {"prompt", "completion", "reward"} <= set(table["columns"]) and table["data"]


def test_matched_grpo_generates_as_many_samples_per_step_as_ada_balance(compared):
    summary, client = compared
    children = _children(client, summary["parent_run_id"])
    ada_dir = children["ada-balance-s0"].data.params["run_dir"]
    samples = [r[K.BUDGET_GENERATED_SAMPLES] for r in read_metrics(ada_dir) if K.BUDGET_GENERATED_SAMPLES in r]
    expected = matched_grpo_prompts(sum(samples) / len(samples), 4)
    matched = children["grpo-matched-s0"]
    assert int(matched.data.params["prompts_per_step"]) == expected
    assert int(client.get_run(summary["parent_run_id"]).data.params["matched_prompts_per_step_s0"]) == expected
    assert int(children["grpo-s0"].data.params["prompts_per_step"]) == 4
    matched_samples = [r[K.BUDGET_GENERATED_SAMPLES] for r in read_metrics(matched.data.params["run_dir"])
                       if K.BUDGET_GENERATED_SAMPLES in r]
    assert matched_samples == [expected * 4] * 2


def test_report_is_on_the_parent_run_and_a_prefect_artifact(compared):
    summary, client = compared
    files = {Path(a.path).name for a in client.list_artifacts(summary["parent_run_id"], "report")}
    axes = ["step", "generated_samples", "trained_tokens", "wall_time", "compute"]
    assert {f"accuracy_reward_vs_{a}.png" for a in axes} <= files
    assert {"effective_ratio.png", "samples_per_step.png", "time_split.png", "report.md"} <= files
    markdown = (Path(summary["report_dir"]) / "report.md").read_text()
    rows = [line for line in markdown.splitlines() if line.startswith("| ") and "±" in line]
    # three tables (what the runs reached, what their sampler drew, what they cost), one row per variant in each
    assert [row.split("|")[1].strip() for row in rows] == ["grpo", "ada-balance", "grpo-matched"] * 3
    # every variant paired against grpo, and the prompt ledger's plot
    assert "| ada-balance | grpo | generated samples | 1 |" in markdown and "paired.json" in files
    assert "prompt_pass_rates.png" in files
    # each variant's mean with a band over seeds (interactive and static), and one seed says it has no std
    assert {"bands.html", "accuracy_reward_bands.png"} <= files
    assert "± n/a (1 seed)" in markdown and "± 0.000" not in markdown
    table = client.load_table(client.get_run(summary["parent_run_id"]).info.experiment_id,
                              "report/final_metrics.json", run_ids=[summary["parent_run_id"]])
    assert list(table["variant"]) == ["grpo", "ada-balance", "grpo-matched"] and list(table["n_seeds"]) == [1, 1, 1]
    assert table["held-out accuracy (avg@k) std"].isna().all()  # one seed: no std, not 0

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    with get_client(sync_client=True) as prefect:
        artifacts = prefect.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["compare-report"])))
    assert artifacts and artifacts[0].type == "markdown"
    assert "| variant | seeds |" in artifacts[0].data and summary["parent_run_id"] in artifacts[0].data
    for child in summary["children"]:  # every child listed; SQLite has no MLflow UI, so ids, not links
        assert f"`{child['variant']}` seed {child['seed']}: MLflow run `" in artifacts[0].data
    assert "## Plots" in artifacts[0].data and "`accuracy_reward_vs_generated_samples.png`" in artifacts[0].data
    # Every config difference between the variants is listed: the algorithm, and the matched control's batch.
    assert "## Config differences between variants" in artifacts[0].data
    assert "| `sampler.name` | algorithm |" in artifacts[0].data
    assert "| `prompts_per_step` | **other** |" in artifacts[0].data
    assert "config_differences.json" in files
    assert "![accuracy_reward_vs_compute](accuracy_reward_vs_compute.png)" in markdown  # report.md shows its plots


def test_a_compares_seeds_share_their_start_and_exam_and_its_best_policy_is_picked_on_validation(flows_env):
    """Seeds vary the training, not the exam (issue 27 item 2): without curation each child warm-starts itself,
    and still every seed logs the same start model hash, draws the same held-out and validation split and scores
    the same step-0 accuracy; their training draws differ; the champion is picked on validation."""
    import yaml

    from ada_core.config import validate_config
    from ada_core.data import run_split
    from ada_core.run.files import CONFIG
    from ada_core.run.ledger import read_rows
    from flows.compare import compare

    summary = compare(CompareParams(
        variants=["grpo"], matched_grpo=False, seeds=[0, 1], steps=1, prompts_per_step=4, curate=False,
        overrides={"data.dataset": "arithmetic:2", "data.train_size": 40, "data.eval_size": 8, "data.val_size": 8,
                   "sft_steps": 20, "eval_every": 1, "eval_k": 2, "checkpoint_every": 0},
        experiment="flows-shared-start", register_as="shared-start-policy",
    ))
    client = flows_env
    children = _children(client, summary["parent_run_id"])
    runs = [children["grpo-s0"], children["grpo-s1"]]
    assert len({r.data.params["start_model_sha256"] for r in runs}) == 1
    splits = []
    for run in runs:
        config = validate_config(yaml.safe_load((Path(run.data.params["run_dir"]) / CONFIG).read_text()))
        assert config.data.seed == 0 and config.seed in (0, 1)
        splits.append([[p.id for p in part] for part in run_split(config.data, config.seed)])
    assert splits[0] == splits[1] and len(splits[0][2]) == 8
    first = [{m.step: m.value for m in client.get_metric_history(r.info.run_id, K.EVAL_AVG_AT_K)}[0] for r in runs]
    assert first[0] == first[1]
    assert all(K.VAL_AVG_AT_K in r.data.metrics for r in runs)
    drawn = [[row["prompt_id"] for row in read_rows(Path(r.data.params["run_dir"]))] for r in runs]
    assert drawn[0] != drawn[1]  # the seed moves what RL draws
    parent = client.get_run(summary["parent_run_id"])
    assert parent.data.tags["ada.best_selected_on"] == K.VAL_AVG_AT_K


def test_best_policy_is_registered_as_champion(compared):
    summary, client = compared
    children = _children(client, summary["parent_run_id"])
    champion = client.get_model_version_by_alias("ada-policy", "champion")
    best = max(children.values(), key=lambda r: r.data.metrics[K.EVAL_AVG_AT_K])
    assert math.isclose(float(champion.tags["eval_avg_at_k"]), best.data.metrics[K.EVAL_AVG_AT_K])
    assert champion.tags["variant"] in {"grpo", "ada-balance", "grpo-matched"}
    assert champion.run_id == children[f"{champion.tags['variant']}-s0"].info.run_id
    assert champion.source.endswith("/checkpoints/step_000002/hf")
    assert summary["registered"]["uri"] == "models:/ada-policy@champion"


def test_each_step_runs_as_prefect_task_runs(compared):
    summary, client = compared
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    flow_run_id = _children(client, summary["parent_run_id"])["ada-balance-s0"].data.tags["prefect.flow_run_id"]
    # Task runs reach Prefect's API through its event stream, so a loaded machine can read them a little
    # after the flow returned: wait (bounded) until the last one, the final checkpoint, is recorded.
    deadline = time.monotonic() + 120
    with get_client(sync_client=True) as prefect:
        while True:
            task_runs = prefect.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
            done = [t for t in task_runs if t.state is not None and t.state.is_final()]
            if {"checkpoint-step-2", "update-step-2"} <= {t.name for t in done} or time.monotonic() > deadline:
                break
            time.sleep(1)
    names = sorted(t.name for t in task_runs)
    assert [n for n in names if n.startswith(("rollout", "update"))] == [
        "rollout-step-1", "rollout-step-2", "update-step-1", "update-step-2"]
    assert [n for n in names if n.startswith("evaluate")] == ["evaluate-step-0", "evaluate-step-1", "evaluate-step-2"]
    assert "checkpoint-step-2" in names
    assert any(n.startswith("curate-") for n in names)  # the child's curation: a cache hit, still a task run
    assert all(t.state.is_completed() for t in task_runs)


# ---------------------------------------------------------------------------------------------
# curate caching, evaluate, sweep, PostgreSQL


def test_curation_is_cached_on_its_inputs(compared, ada_home):
    from tasks.curation import curate_dataset, curate_for, curation_inputs

    config = CompareParams(steps=2, prompts_per_step=4, overrides=SMALL).build("grpo", 0)
    first = curate_for(config, 0)
    state = curate_dataset(**curation_inputs(config, 0), return_state=True)
    assert state.name == "Cached" and state.result() == first
    # Without Prefect's record the persisted set under ADA_HOME is reused, not re-sampled.
    summary_file = Path(first["dataset"]) / "curation.json"
    before = summary_file.stat().st_mtime_ns
    again = curate_dataset.with_options(refresh_cache=True)(**curation_inputs(config, 0))
    assert again == first and summary_file.stat().st_mtime_ns == before
    assert first["kept"] > config.data.eval_size and Path(first["dataset"]).is_relative_to(ada_home / "curated")
    assert any((ada_home / "prefect" / "storage").iterdir())  # Prefect's cache record, under ADA_HOME


def test_evaluate_flow_scores_the_champion(compared):
    summary, client = compared
    from flows.evaluate import evaluate

    result = evaluate(EvaluateParams(model="models:/ada-policy@champion", k=2, eval_size=12, experiment="flows-eval"))
    run = client.get_run(result["run_id"])
    assert 0.0 <= run.data.metrics[K.EVAL_AVG_AT_K] <= run.data.metrics[K.EVAL_PASS_AT_K] <= 1.0
    assert run.data.params["model"] == "models:/ada-policy@champion" and run.data.params["k"] == "2"
    assert [a.path for a in client.list_artifacts(result["run_id"], "generations")] == ["generations/step_000000.json"]


def test_evaluate_accepts_checkpoints_and_hf_folders(compared):
    summary, _ = compared
    from flows.evaluate import local_model_dir

    checkpoint = Path(summary["children"][0]["run_dir"]) / "checkpoints" / "step_000002"
    assert local_model_dir(str(checkpoint), "unused", checkpoint) == checkpoint / "hf"
    assert local_model_dir(str(checkpoint / "hf"), "unused", checkpoint) == checkpoint / "hf"
    assert local_model_dir("tiny", "unused", checkpoint) == "tiny"  # a built-in name, for resolve_model


def test_evaluate_defaults_to_the_training_runs_own_held_out_split(flows_env, tmp_path):
    """A platform-trained model is scored on its run's held-out prompts, never on one it trained on: not on a
    re-split of the profile's raw prompts (2048 + 128 with seed 0, which hold most of this run's)."""
    import yaml

    from ada_core.config import validate_config
    from ada_core.data import load_prompts, split_prompts
    from ada_core.run.files import CONFIG, read_generations
    from flows.evaluate import evaluate
    from flows.train import train

    out = tmp_path / "run"
    trained = train(TrainParams(
        preset="grpo", steps=1, prompts_per_step=4, curate=False, register_as="held-out-policy", output_dir=str(out),
        overrides={"sft_steps": 0, "eval_every": 0, "checkpoint_every": 0, "data.train_size": 48, "data.eval_size": 8},
        experiment="flows-held-out"))
    config = validate_config(yaml.safe_load((out / CONFIG).read_text()))
    drawn = load_prompts(config.data.dataset, size=config.data.train_size + config.data.eval_size, seed=config.seed)
    training, held_out = split_prompts(drawn, eval_size=config.data.eval_size, seed=config.seed)
    training_ids, training_texts = {p.id for p in training}, {p.text for p in training}
    for model in ("models:/held-out-policy/1", str(out / "checkpoints" / "step_000001")):
        result = evaluate(EvaluateParams(model=model, k=1, experiment="flows-held-out"))
        scored = read_generations(result["run_dir"])  # the table it logged: every prompt once at k=1
        assert scored and not {r["prompt_id"] for r in scored} & training_ids, model
        assert not {r["prompt"] for r in scored} & training_texts, model
        assert result["eval_prompt_ids"] == [p.id for p in held_out] and result["trained_by_run"] == trained["run_id"]
    with pytest.raises(ConfigError, match=r"eval_size: 9 is more than the 8 prompts"):
        evaluate(EvaluateParams(model="models:/held-out-policy/1", eval_size=9, experiment="flows-held-out"))


def test_evaluate_defaults_to_a_curated_runs_own_held_out_split(compared):
    """A run trained on a curated set is scored on that set's held-out prompts: none of them trained on (the
    raw profile dataset's split would hold curated training prompts)."""
    import yaml

    from ada_core.config import validate_config
    from ada_core.data import run_split
    from ada_core.run.files import CONFIG, read_generations
    from ada_core.run.ledger import read_rows
    from flows.evaluate import evaluate

    summary, client = compared
    run = _children(client, summary["parent_run_id"])["ada-balance-s0"]
    run_dir = Path(run.data.params["run_dir"])
    config = validate_config(yaml.safe_load((run_dir / CONFIG).read_text()))
    assert config.data.dataset == run.data.params["curated_dataset"]  # the config names the curated set
    training, held_out, _ = run_split(config.data, config.seed)
    trained_ids = {r["prompt_id"] for r in read_rows(run_dir)}  # every prompt its steps drew, from the ledger
    assert trained_ids and trained_ids <= {p.id for p in training}
    result = evaluate(EvaluateParams(model=str(run_dir / "checkpoints" / "step_000002"), k=1,
                                     experiment="flows-held-out"))
    assert result["eval_prompt_ids"] == [p.id for p in held_out] and result["trained_by_run"] == run.info.run_id
    scored = read_generations(result["run_dir"])  # the table it logged: some of the prompts it scored
    assert scored and {r["prompt_id"] for r in scored} <= set(result["eval_prompt_ids"])
    assert not set(result["eval_prompt_ids"]) & ({p.id for p in training} | trained_ids)
    assert not {r["prompt"] for r in scored} & {p.text for p in training}


def test_sweep_runs_the_grid_under_one_parent(flows_env):
    from flows.sweep import sweep

    params = SweepParams(variants=["ada-balance", "grpo"], N=[1, 2], M=[4], n=[4], seeds=[0], steps=1,
                         prompts_per_step=4, overrides=SMALL, experiment="flows-sweep")
    summary = sweep(params)
    children = _children(flows_env, summary["parent_run_id"])
    assert set(children) == {"ada-balance-N1-M4-n4-s0", "ada-balance-N2-M4-n4-s0", "grpo-n4-s0"}
    assert children["ada-balance-N2-M4-n4-s0"].data.params["N"] == "2"
    assert children["ada-balance-N1-M4-n4-s0"].data.params["N"] == "1"
    assert summary["registered"]["name"] == "ada-policy"


def test_train_flow_on_postgresql(flows_env, postgres_uri):
    from flows.train import train

    result = train(TrainParams(preset="grpo", steps=1, prompts_per_step=4, overrides=UNCURATED, curate=False,
                               tracking_uri=postgres_uri, experiment="flows-postgres", register_as="pg-policy"))
    client = MlflowClient(tracking.resolve_tracking_uri(postgres_uri))
    run = client.get_run(result["run_id"])
    assert run.info.status == "FINISHED" and run.data.params["variant"] == "grpo"
    assert run.data.params["curated"] == "False"
    assert [m.step for m in client.get_metric_history(result["run_id"], K.EVAL_AVG_AT_K)] == [0, 1]
    assert client.list_artifacts(result["run_id"], "checkpoints")
    assert client.get_model_version_by_alias("pg-policy", "candidate").run_id == result["run_id"]


# ---------------------------------------------------------------------------------------------
# Invalid parameters are rejected before any work


def test_train_flow_with_the_vllm_engine(flows_env, vllm_server):
    from flows.train import train

    overrides = {**UNCURATED, "rollout.vllm.base_url": vllm_server.base_url}
    result = train(TrainParams(preset="ada-balance", engine="vllm", steps=2, prompts_per_step=4, overrides=overrides,
                               curate=False, experiment="flows-vllm"))
    run = flows_env.get_run(result["run_id"])
    assert run.info.status == "FINISHED" and run.data.params["rollout.engine"] == "vllm"
    assert [m.value for m in flows_env.get_metric_history(result["run_id"], "sync/weight_version")] == [1.0, 2.0]
    assert all(m.value > 0 for m in flows_env.get_metric_history(result["run_id"], K.TIME_SYNC_S))


def test_invalid_values_fail_before_any_mlflow_run(flows_env, monkeypatch, tmp_path):
    from flows.compare import compare
    from flows.train import train

    with pytest.raises(ValidationError, match=r"overrides: 'sampler\.n': Input should be greater than or equal to 2"):
        TrainParams(overrides={"sampler.n": 1}, experiment="flows-invalid")  # refused by the parameters themselves
    with pytest.raises(ConfigError, match=r"sampler\.M0 \+ \(sampler\.N - 1\) \* sampler\.M = 2 must be >= sampler\.n = 4"):
        train(TrainParams(overrides={"sampler.M": 1, "sampler.N": 2}, experiment="flows-invalid"))  # a combination
    monkeypatch.setenv("ADA_VLLM_PYTHON", str(tmp_path / "no-such-env" / "python"))
    with pytest.raises(ConfigError, match=r"rollout\.engine.*make vllm-env"):
        train(TrainParams(engine="vllm", experiment="flows-invalid"))
    with pytest.raises(ValidationError, match=r"optim\.lr"):
        CompareParams(variants=["grpo", "ada-balance"], overrides={"optim.lr": -1}, experiment="flows-invalid")
    with pytest.raises(Exception, match="matched_grpo"):  # Prefect validates the pydantic parameter model
        compare(params={"variants": ["grpo"], "matched_grpo": True, "experiment": "flows-invalid"})
    used = tmp_path / "used-run"  # a run with a checkpoint: something to resume, so not overwritten silently
    (used / "checkpoints" / "step_000001").mkdir(parents=True)
    (used / "checkpoints" / "step_000001" / "COMPLETE").write_text("ok\n")
    (used / "metrics.jsonl").write_text('{"step": 1}\n')
    with pytest.raises(RunDirError, match="already holds a run"):
        train(TrainParams(output_dir=str(used), experiment="flows-invalid"))
    assert sorted(p.name for p in used.iterdir()) == ["checkpoints", "metrics.jsonl"]
    assert flows_env.get_experiment_by_name("flows-invalid") is None


def test_demo_keeps_its_state_under_ada_home_and_runs_prefect_ephemeral(tmp_path, monkeypatch):
    from flows.demo import configure_environment

    for key in ("ADA_HOME", "PREFECT_HOME", "PREFECT_API_URL"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:1/api")  # a stale URL must not be used
    home, mode = configure_environment()
    assert home == tmp_path / ".ada" and mode == "ephemeral"
    assert os.environ["PREFECT_HOME"] == str(tmp_path / ".ada" / "prefect") and "PREFECT_API_URL" not in os.environ
    assert os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] == "false" and os.environ["MLFLOW_DISABLE_TELEMETRY"] == "true"


# ---------------------------------------------------------------------------------------------
# The report's pure parts, on hand-written metric rows


