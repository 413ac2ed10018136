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


def test_the_report_lists_every_config_difference_between_variants(tmp_path):
    """Presets differ in algorithm fields only; a deliberate other difference (the matched control's
    prompts_per_step, an override given to one variant) is listed and marked `other`."""
    import yaml

    from ada_core.config import build_config
    from report import config_differences, differences_markdown

    def run(label, preset, seed, **overrides):
        run_dir = tmp_path / f"{label}-s{seed}"
        run_dir.mkdir()
        config = build_config(preset, "tiny", overrides={"seed": seed, **overrides})
        (run_dir / "config.yaml").write_text(yaml.safe_dump(config.model_dump(), sort_keys=False))
        rows = [{"step": 0, K.EVAL_AVG_AT_K: 0.1}, {"step": 1, K.BUDGET_GENERATED_SAMPLES: 10.0},
                {"step": 1, K.EVAL_AVG_AT_K: 0.2}]
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (run_dir / "run_info.json").write_text(json.dumps({"label": label, "seed": seed}))
        return load_run(run_dir)

    plain = [run(p, p, s) for p in ("grpo", "ada-balance") for s in (0, 1)]
    rows = {r["field"]: r for r in config_differences(plain)}
    assert {f for f, r in rows.items() if r["kind"] == "other"} == set(), rows  # seeds alone are no difference
    assert rows["sampler.name"]["values"] == {"grpo": "fixed", "ada-balance": "ada"}
    assert rows["advantage.name"]["kind"] == "algorithm"

    runs = [*plain, run("grpo-matched", "grpo", 0, prompts_per_step=80), run("grpo-matched", "grpo", 1, prompts_per_step=81)]
    wd = run("ada-wd", "ada-balance", 0, optim={"weight_decay": 0.01})
    rows = {r["field"]: r for r in config_differences([*runs, wd])}
    assert rows["prompts_per_step"]["kind"] == "other"
    assert rows["prompts_per_step"]["values"] == {"grpo": "32", "ada-balance": "32", "grpo-matched": "80 / 81",
                                                 "ada-wd": "32"}
    assert rows["optim.weight_decay"]["values"]["ada-wd"] == "0.01" and rows["optim.weight_decay"]["kind"] == "other"
    markdown = differences_markdown([*runs, wd])  # in report.md and the compare's Prefect artifact (test_flows)
    assert "| `optim.weight_decay` | **other** | `0.0` | `0.0` | `0.0` | `0.01` |" in markdown
    assert "| `sampler.name` | algorithm | `fixed` | `ada` | `fixed` | `ada` |" in markdown
