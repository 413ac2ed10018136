"""The offline report's arithmetic: merged rows on the step timeline, mean and std over seeds."""

from __future__ import annotations

import json

import pytest

from ada_core import metrics as K
from report import count_params, load_run, mean_std, merge_rows, summary_table


def test_merge_rows_puts_eval_on_the_step_timeline_with_flops():
    rows = [
        {"step": 0, K.EVAL_AVG_AT_K: 0.1},
        {"step": 1, K.REWARD_MEAN: 0.2, K.BUDGET_GENERATED_TOKENS_CUM: 100.0, K.BUDGET_TRAINED_TOKENS_CUM: 40.0,
         K.BUDGET_LOGPROB_TOKENS_CUM: 40.0},
        {"step": 1, K.EVAL_AVG_AT_K: 0.3},
    ]
    points = merge_rows(rows, num_params=1_000_000)
    assert [p["step"] for p in points] == [0.0, 1.0]
    assert points[0][K.BUDGET_GENERATED_SAMPLES_CUM] == 0.0 and points[0]["compute/flops_cum"] == 0.0
    assert points[1][K.EVAL_AVG_AT_K] == 0.3 and points[1][K.REWARD_MEAN] == 0.2
    assert points[1]["compute/flops_cum"] == pytest.approx(5.2e8)  # 2e8 + 2.4e8 + 8e7


def test_summary_table_reports_mean_and_std_over_seeds(tmp_path):
    runs = []
    for seed, acc in ((0, 0.2), (1, 0.4)):
        run_dir = tmp_path / f"ada-s{seed}"
        run_dir.mkdir()
        rows = [{"step": 1, K.REWARD_MEAN: 0.5, K.BUDGET_GENERATED_SAMPLES: 10.0}, {"step": 1, K.EVAL_AVG_AT_K: acc}]
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (run_dir / "run_info.json").write_text(json.dumps({"label": "ada", "seed": seed, "num_params": 1000}))
        runs.append(load_run(run_dir))
    assert [r.label for r in runs] == ["ada", "ada"] and count_params(runs[0].run_dir) == 1000
    table = summary_table(runs)
    assert "| ada | 2 (0,1) | 0.300 ± 0.141 |" in table
    assert mean_std([1.0]) == (1.0, 0.0) and mean_std([float("nan")])[0] != mean_std([float("nan")])[0]
