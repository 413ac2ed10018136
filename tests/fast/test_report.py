"""The offline report's arithmetic: merged rows on the step timeline, mean and std over seeds."""

from __future__ import annotations

import json

import numpy as np
import pytest
from support import write_run_folder

from ada_core import metrics as K
from report import (
    count_params,
    load_run,
    mean_std,
    merge_rows,
    summary_rows,
    summary_table,
    variant_bands,
    write_report,
)
from report.tables import PARTS, final_metrics


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
    assert mean_std([1.0])[0] == 1.0 and np.isnan(mean_std([1.0])[1]) and mean_std([float("nan")])[0] != mean_std([float("nan")])[0]


def test_the_summary_comes_in_parts_that_fit_a_column_and_cover_every_metric(tmp_path):
    """Three tables of at most five columns (a Prefect artifact cuts a wider table off), every final metric in
    one of them; counts in whole units."""
    runs = [load_run(write_run_folder(tmp_path / f"grpo-s{seed}", "grpo", seed, [0.1, 0.2], 1419.5 + seed))
            for seed in (0, 1)]
    assert sorted(c for part in PARTS for c in part) == sorted(final_metrics(runs[0]))
    tables = summary_table(runs).split("\n\n")
    assert len(tables) == len(PARTS) == 3
    assert all(table.splitlines()[0].count("|") - 1 <= 5 for table in tables), tables
    assert "| grpo | n/a | 1,420 ± 1 | 1,420 ± 1 |" in tables[1]  # no effective ratio logged; counts in whole units


def test_one_seed_has_no_std_and_the_table_says_so(tmp_path):
    run = load_run(write_run_folder(tmp_path / "grpo-s0", "grpo", 0, [0.1, 0.2], 8.0))
    table = summary_table([run])
    assert "± 0.000" not in table and "0.200 ± n/a (1 seed)" in table
    [row] = summary_rows([run])
    assert row["variant"] == "grpo" and row["n_seeds"] == 1
    assert row["held-out accuracy (avg@k)"] == pytest.approx(0.2) and row["held-out accuracy (avg@k) std"] is None


def test_bands_are_the_mean_and_std_over_seeds_at_shared_budget_points(tmp_path):
    """Two seeds of ada at 10 and 14 samples a step: the band's x values are those both cover; the
    second seed is read between its points. One grpo seed is a line with no band."""
    runs = [load_run(write_run_folder(tmp_path / "ada-s0", "ada", 0, [0.0, 0.2, 0.4], 10.0)),
            load_run(write_run_folder(tmp_path / "ada-s1", "ada", 1, [0.0, 0.4, 0.6], 14.0)),
            load_run(write_run_folder(tmp_path / "grpo-s0", "grpo", 0, [0.0, 0.1, 0.2], 8.0))]
    ada, grpo = variant_bands(runs, K.BUDGET_GENERATED_SAMPLES_CUM, K.EVAL_AVG_AT_K)
    assert ada.seeds == 2 and list(ada.x) == [0.0, 10.0, 14.0, 20.0]  # seed 1 reaches 28, seed 0 stops at 20
    s1_at_10 = 0.4 * 10 / 14
    assert ada.mean[1] == pytest.approx((0.2 + s1_at_10) / 2)
    assert ada.high[1] - ada.mean[1] == pytest.approx(np.std([0.2, s1_at_10], ddof=1))
    assert grpo.seeds == 1 and list(grpo.low) == list(grpo.mean) == list(grpo.high)
    by_step = variant_bands(runs, "step", K.EVAL_AVG_AT_K)[0]
    assert list(by_step.x) == [0.0, 1.0, 2.0] and list(by_step.mean) == pytest.approx([0.0, 0.3, 0.5])

    report = write_report(runs, tmp_path / "report")
    html = (tmp_path / "report" / "bands.html").read_text()
    assert "plotly" in html and '"fill":"toself"' in html.replace(" ", "") and "ada (mean of 2 seeds)" in html
    assert (tmp_path / "report" / "accuracy_reward_bands.png").stat().st_size > 0
    assert "[bands.html](bands.html)" in report.markdown and "![accuracy_reward_bands]" in report.markdown


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
