"""A researcher's own sampler, the way they use it: examples/second_chance.py, named in $ADA_SAMPLERS, runs
through `ada simulate`, `ada train` (and its resume) and a 2-seed `compare` against GRPO, whose runs are MLflow
children with the sampler's options as params, rows of the compare's report and saved runs the paper tables
read back. Nothing in the platform names it. docs/SAMPLERS.md is the guide.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "second_chance.py"
TRAIN = ["--steps", "2", "--set", "sft_steps=0", "--set", "prompts_per_step=4", "--set", "eval_every=0",
         "--set", "data.train_size=16", "--set", "data.eval_size=4"]
# As tests/flows/test_flows.py's SMALL: two-digit sums, a short warm start, curated prompts.
SMALL = {"data.dataset": "arithmetic:2", "data.train_size": 400, "data.eval_size": 12, "data.curation_k": 4,
         "data.pass_rate_ceiling": 1.0, "sft_steps": 150, "eval_every": 1, "eval_k": 2, "checkpoint_every": 0}


def ada(*args: str, home: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "ADA_SAMPLERS": str(EXAMPLE.relative_to(ROOT)), "ADA_HOME": str(home), "OMP_NUM_THREADS": "1",
           "TQDM_DISABLE": "1"}
    return subprocess.run([sys.executable, "-m", "ada_core.cli", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)


def test_ada_simulate_runs_the_example_beside_the_platforms_samplers(tmp_path):
    out = ada("simulate", "--prompts", "16", "--steps", "2", "--json", str(tmp_path / "sim.json"), home=tmp_path)
    assert out.returncode == 0, out.stderr
    methods = json.loads((tmp_path / "sim.json").read_text())["methods"]
    assert {"grpo-n4", "ada-balance-m4", "second-chance"} <= set(methods)
    # n = 4 for every prompt, then 4 more for those whose first 4 agreed: between 4 and 8 a prompt
    assert 4 < methods["second-chance"]["samples_per_prompt_drawn"] < 8
    assert "| second-chance |" in out.stdout


def test_ada_train_runs_the_example_and_resumes_its_state(tmp_path):
    run = tmp_path / "run"
    first = ada("train", "--preset", "second-chance", "--output-dir", str(run), "--set", "sampler.options.extra=2",
                *TRAIN, home=tmp_path)
    assert first.returncode == 0, first.stderr
    config = yaml.safe_load((run / "config.yaml").read_text())
    assert config["sampler"]["name"] == "second_chance" and config["sampler"]["options"] == {"extra": 2, "give_up": 2}
    saved = json.loads(next(run.glob("checkpoints/*/trainer_state.json")).read_text())["sampler"]
    assert set(saved) == {"streak"} and saved["streak"]  # the sampler's own state, in the checkpoint

    resumed = ada("train", "--resume", str(run), "--steps", "3", home=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "sampler/second_chances" in r]
    assert [r["step"] for r in steps] == [1, 2, 3]
    assert all(r["budget/generated_samples"] == 16 + 2 * r["sampler/second_chances"] for r in steps)

    wrong = ada("train", "--preset", "second-chance", "--output-dir", str(tmp_path / "other"),
                "--set", "sampler.options.extra=0", *TRAIN, home=tmp_path)
    assert wrong.returncode == 2
    assert wrong.stderr.strip().splitlines() == [
        "error: invalid config: sampler.options.extra: Input should be greater than or equal to 1 (got 0)"]


def test_a_two_seed_compare_trains_logs_reports_and_saves_the_example(prefect_harness, ada_home, monkeypatch, tmp_path):
    from mlflow import MlflowClient

    from flows import tracking
    from flows.compare import compare
    from flows.paper_tables import run_start
    from flows.params import CompareParams
    from report.curves import load_run
    from report.saved_runs import saved_tables_markdown, write_runs

    monkeypatch.setenv("ADA_SAMPLERS", str(EXAMPLE))
    monkeypatch.setenv("TQDM_DISABLE", "1")
    summary = compare(CompareParams(
        variants=["grpo", "second-chance"], matched_grpo=False, seeds=[0, 1], steps=2, prompts_per_step=4,
        overrides={**SMALL, "sampler.options.extra": 2}, experiment="own-sampler",
    ))
    assert not summary["failures"]
    children = summary["children"]
    assert sorted((c["variant"], c["seed"]) for c in children) == [
        ("grpo", 0), ("grpo", 1), ("second-chance", 0), ("second-chance", 1)]

    client = MlflowClient(tracking.default_tracking_uri())
    for child in children:
        params = client.get_run(child["run_id"]).data.params
        if child["variant"] == "second-chance":
            assert (params["sampler"], params["sampler.options.extra"], params["sampler.options.give_up"]) == (
                "second_chance", "2", "2")
        else:
            assert params["sampler"] == "fixed" and "sampler.options.extra" not in params
    markdown = (Path(summary["report_dir"]) / "report.md").read_text()
    assert "| second-chance | grpo |" in markdown  # paired against the reference, by seed

    runs = [load_run(c["run_dir"], c["variant"], c["seed"]) for c in children]
    starts = {c["run_dir"]: run_start(c["run_dir"]) for c in children}
    saved = write_runs(tmp_path / "runs.jsonl", {"standard": runs}, starts)
    tables = saved_tables_markdown([saved], methods=["grpo", "second-chance"])
    assert "| standard | second-chance |" in tables
