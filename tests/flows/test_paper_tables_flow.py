"""`benchmarks/paper_tables.py --smoke`: the paper grid's plumbing, through the real `paper-tables` flow.

One seed, GRPO and Ada-Est, two steps, both pools (the standard curation and a pass-rate band), on the
flows tests' small data, so the SFT start and the standard curation are cache hits within a session.
"""

from __future__ import annotations

import importlib.util
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
    for title in ("### Table A", "### Table B", "### Table C"):
        assert title in markdown
    # Table A: one row per method, both pools' columns; Table C pairs ada-est with grpo in each pool
    assert "| method | standard avg@k | standard pass@k | hard avg@k | hard pass@k | seeds |" in markdown
    table_c = markdown.split("### Table C")[1]
    assert "| standard | ada-est | grpo | 1 |" in table_c and "| hard | ada-est | grpo | 1 |" in table_c
    table_b = markdown.split("### Table B")[1].split("### Table C")[0]
    assert "| standard | grpo |" in table_b and "(×1.00)" in table_b  # grpo is its own reference

    client = MlflowClient(out["summaries"]["standard"]["tracking_uri"])
    for pool, parent_id in out["parents"].items():
        parent = client.get_run(parent_id)
        assert parent.data.tags["ada.flow"] == "compare"
        children = client.search_runs([parent.info.experiment_id], f"tags.mlflow.parentRunId = '{parent_id}'")
        assert sorted(r.info.run_name.split(STUDY_SEPARATOR)[0] for r in children) == ["ada-est-s0", "grpo-s0"]
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
