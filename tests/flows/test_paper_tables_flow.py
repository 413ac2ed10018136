"""`benchmarks/paper_tables.py --smoke`: the paper grid's plumbing, through the real `paper-tables` flow.

One seed, GRPO and Ada-Est, two steps, both pools (the standard curation and a pass-rate band), on the
flows tests' small data, so the SFT start and the standard curation are cache hits within a session.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest
from mlflow import MlflowClient

from flows.group import STUDY_SEPARATOR

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def _benchmark():
    spec = importlib.util.spec_from_file_location("paper_tables_benchmark", ROOT / "benchmarks" / "paper_tables.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_smoke_grid_writes_the_three_tables_on_both_parents(prefect_harness, ada_home, tmp_path, monkeypatch):
    monkeypatch.setenv("TQDM_DISABLE", "1")
    bench = _benchmark()
    out = bench.run(bench.parse_args(["--smoke", "--out", str(tmp_path)]))
    markdown = (tmp_path / "paper_tables.md").read_text()
    assert markdown == out["markdown"]
    for title in ("### Table A", "### Table B", "### Table C", "### Table D"):
        assert title in markdown
    # every pool read at its runs' last evaluation (step 2), which every row states
    for pool in ("standard", "hard"):
        assert f"- pool `{pool}`: read at step 2, the last evaluation of its longest runs; 4 runs reach it\n" in markdown
    # Table A: one row per pool and method, at step 2; Table C pairs ada-est with grpo in each pool at a
    # printed budget; Table D reads both against grpo's final accuracy
    table_a = markdown.split("### Table A")[1].split("### Table B")[0]
    assert "| pool | method | step | generated samples (mean) | trained tokens (mean) | avg@k | pass@k | seeds |" in table_a
    assert "| standard | grpo | 2 | 32 |" in table_a and "| hard | ada-est | 2 |" in table_a  # 2 steps x 4 prompts x 4
    # Table C: ada-est (8 samples a prompt over 4 prompts) against its budget-matched controls, started once its
    # run ended: GRPO n = 4 over 8 prompts and GRPO n = 8 over 4, each with 2 updates; C' against grpo
    table_c = markdown.split("### Table C:")[1].split("### Table C'")[0]
    for pool in ("standard", "hard"):
        assert f"| {pool} | ada-est | grpo-b.ada-est (b) | 0 | 32 / 32 | 64 | 2 / 2 |" in table_c
        assert f"| {pool} | ada-est | grpo-n.ada-est (n) | 0 | 32 / 32 | 64 | 2 / 2 |" in table_c
    table_c_prime = markdown.split("### Table C'")[1].split("### Table D")[0]
    assert "| standard | ada-est | grpo | 0 |" in table_c_prime and "| hard | ada-est | grpo | 0 |" in table_c_prime
    table_b = markdown.split("### Table B")[1].split("### Table C")[0]
    assert "| standard | grpo | 1-2 |" in table_b and "(×1.00)" in table_b  # grpo is its own reference
    table_d = markdown.split("### Table D")[1]
    assert "| standard | " in table_d and "(grpo at step 2; its gain over steps 1-2: " in table_d
    assert ") | ada-est | " in table_d

    client = MlflowClient(out["summaries"]["standard"]["tracking_uri"])
    for pool, parent_id in out["parents"].items():
        parent = client.get_run(parent_id)
        assert parent.data.tags["ada.flow"] == "compare"
        children = client.search_runs([parent.info.experiment_id], f"tags.mlflow.parentRunId = '{parent_id}'")
        assert sorted(r.info.run_name.split(STUDY_SEPARATOR)[0] for r in children) == [
            "ada-est-s0", "grpo-b.ada-est-s0", "grpo-n.ada-est-s0", "grpo-s0"]
        assert {"control_prompts_ada-est_s0", "control_n_ada-est_s0"} <= set(parent.data.params)
        assert (parent.data.params["control_prompts_ada-est_s0"], parent.data.params["control_n_ada-est_s0"]) == ("8", "8")
        artifacts = {a.path for a in client.list_artifacts(parent_id, "report")}
        assert "report/paper_tables.md" in artifacts and "report/report.md" in artifacts
        report = Path(client.download_artifacts(parent_id, "report/report.md", str(tmp_path / pool)))
        assert "## Table C" in report.read_text()  # the compare report itself shows Table C
    # the hard pool is the band: every curated prompt it trained on was solved 1 or 2 times in 4
    hard_child = next(c for c in out["summaries"]["hard"]["children"] if c["variant"] == "grpo")
    import yaml

    config = yaml.safe_load((Path(hard_child["run_dir"]) / "config.yaml").read_text())
    from ada_core.data.curation import load_curated

    curated = load_curated(config["data"]["dataset"])
    assert curated.prompts and {p.difficulty for p in curated.prompts} <= {0.25, 0.5}
    assert curated.report["params"]["band"] == [0.25, 0.5]

    # The same command on a killed grid (--tables-from): in the standard pool ada-est-s0 stopped after step 1
    # and kept its result anyway (a run of another length), in the hard pool it started and never finished.
    # Neither is read; the first is named in every row it would have entered, the second in the header.
    killed = {pool: tmp_path / f"killed-{pool}" for pool in out["groups"]}
    for pool, group in out["groups"].items():
        shutil.copytree(group, killed[pool], ignore=shutil.ignore_patterns("checkpoints"))
    stopped = killed["standard"] / "ada-est-s0" / "metrics.jsonl"
    stopped.write_text("".join(line + "\n" for line in stopped.read_text().splitlines() if json.loads(line)["step"] <= 1))
    (killed["hard"] / "ada-est-s0" / "result.json").unlink()
    partial = bench.run(bench.parse_args(["--smoke", "--out", str(tmp_path / "partial"), "--tables-from",
                                          *(f"{pool}={folder}" for pool, folder in killed.items())]))["markdown"]
    assert ("- pool `hard`: 3 runs finished: grpo-s0, grpo-b.ada-est-s0, grpo-n.ada-est-s0; not finished, so not "
            "read: ada-est-s0 (last evaluation at step 2)") in partial
    assert "left out of every table: ada-est seed 0 (stopped at step 1 of 2)" in partial
    for table in ("### Table A", "### Table B", "### Table C'", "### Table D"):
        section = partial.split(table)[1].split("### ")[0]
        rows = [line for line in section.splitlines() if line.startswith("| standard |") and "| ada-est |" in line]
        assert len(rows) == 1 and "seed 0: stopped at step 1 of 2" in rows[0], (table, section)
    matched = partial.split("### Table C:")[1].split("### ")[0]  # its controls ran; ada-est is not read: said, per control
    rows = [line for line in matched.splitlines() if line.startswith("| standard | ada-est |")]
    assert len(rows) == 2 and all("none (seed 0: stopped at step 1 of 2)" in row for row in rows), matched
    assert "| hard | ada-est |" not in partial.split("### Table A")[1]
