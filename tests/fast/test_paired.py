"""The report's equal-budget pieces without a flow: paired differences with their intervals, the
measured step-time axis, the prompt-ledger plot, and the compare regimes' parameters."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from ada_core import metrics as K
from ada_core.run.ledger import Ledger
from flows.params import CompareParams
from report.curves import STEP_TIME_CUM, RunCurves, merge_rows
from report.paired import mean_ci, paired_differences, paired_table, reference_for, value_at
from report.prompt_plot import pass_rate_matrix, plot_prompt_ledger


def curve(label: str, seed: int, acc: list[float], samples_per_step: float, run_dir: Path = Path(".")) -> RunCurves:
    """Eval at steps 0, 1, 2, ... with accuracy `acc`; generated samples grow by samples_per_step a step."""
    rows = []
    for step, a in enumerate(acc):
        if step > 0:
            rows.append({"step": step, K.BUDGET_GENERATED_SAMPLES: samples_per_step, K.TIME_GENERATE_S: 0.5,
                         K.TIME_UPDATE_S: 0.25, K.BUDGET_GENERATED_SAMPLES_CUM: samples_per_step * step})
        rows.append({"step": step, K.EVAL_AVG_AT_K: a})
    return RunCurves(label, seed, run_dir, None, merge_rows(rows))


def test_merge_rows_adds_the_measured_step_time():
    points = curve("a", 0, [0.1, 0.2, 0.3], 10).points
    assert [p[STEP_TIME_CUM] for p in points] == [0.0, 0.75, 1.5]


def test_paired_difference_at_the_common_budget():
    # the variant spends twice the samples a step: at the reference's final budget (20 samples) it has
    # only reached step 1, where its accuracy is 0.3, against the reference's 0.4 -> -0.1.
    runs = [curve("grpo", s, [0.1, 0.2, 0.4], 10) for s in (0, 1, 2)]
    runs += [curve("ada", s, [0.1, 0.3 + 0.01 * s, 0.6], 20) for s in (0, 1, 2)]
    rows = {r["axis"]: r for r in paired_differences(runs, "grpo", {"samples": K.BUDGET_GENERATED_SAMPLES_CUM,
                                                                    "step": "step"})}
    assert rows["samples"]["diffs"] == pytest.approx([-0.1, -0.09, -0.08])
    assert rows["samples"]["budget"] == 20 and rows["step"]["mean_diff"] == pytest.approx(0.2)
    half = rows["samples"]["ci95"]
    assert half == pytest.approx(4.302653 * 0.01 / math.sqrt(3), rel=1e-4)  # t(0.975, 2) * sd / sqrt(3)
    table = paired_table(list(rows.values()))
    assert "| ada | grpo | samples | 3 | -0.090 [" in table


def test_every_seed_of_a_row_is_read_at_one_shared_budget():
    # ada generates 10, 12, 14 samples a step by seed (finals 20, 24, 28), grpo 13 (final 26): read at each
    # seed's own common budget the seeds would sit at 20, 24 and 26; the row reads all of them at 20.
    runs = [curve("grpo", s, [0.0, 0.2, 0.4], 13) for s in (0, 1, 2)]
    runs += [curve("ada", s, [0.0, 0.3, 0.6], 10 + 2 * s) for s in (0, 1, 2)]
    row = paired_differences(runs, "grpo", {"samples": K.BUDGET_GENERATED_SAMPLES_CUM})[0]
    assert row["budget"] == 20
    grpo_at_20 = 0.2 + (20 - 13) / 13 * 0.2
    assert row["diffs"] == pytest.approx([0.6 - grpo_at_20, 0.3 + (20 - 12) / 12 * 0.3 - grpo_at_20,
                                          0.3 + (20 - 14) / 14 * 0.3 - grpo_at_20])
    assert "| ada | grpo | samples | 3 |" in paired_table([row]) and paired_table([row]).endswith("| 20 |")


def test_helpers():
    assert reference_for("pool-ada-est", "grpo") == "pool-grpo" and reference_for("ada-est", "grpo") == "grpo"
    assert math.isnan(mean_ci([0.1])[1]) and mean_ci([])[0] != mean_ci([])[0]
    run = curve("x", 0, [0.0, 1.0], 10)
    assert value_at(run, K.BUDGET_GENERATED_SAMPLES_CUM, 5) == pytest.approx(0.5)
    assert math.isnan(value_at(run, K.BUDGET_GENERATED_SAMPLES_CUM, 11))


def test_prompt_ledger_plot(tmp_path):
    from ada_core.records import Prompt, PromptPool, Sample

    ledger = Ledger.start(f"sqlite:///{tmp_path / 'l.db'}", tmp_path, threshold=0.7)
    try:
        for step in range(1, 5):
            pools = []
            for i, rewards in enumerate(([1.0, 0.0], [0.0, 0.0], [1.0, 1.0] if step < 3 else [1.0, 0.0])):
                samples = [Sample(f"p{i}", [1], [0.0], "x", reward=r) for r in rewards]
                pools.append(PromptPool(Prompt(id=f"p{i}", text="q", answer="1"), samples, "mixed", 1))
            ledger.record(step, pools, {"p0"})
    finally:
        ledger.close()
    from ada_core.run.ledger import read_rows

    matrix, resolved, total, _ = pass_rate_matrix(read_rows(tmp_path), bins=4)
    assert (resolved, total) == (2, 3) and matrix.shape == (3, 4)
    assert np.allclose(matrix[-1], 0.0)  # p1 never had a positive: the bottom row, all zero
    run = RunCurves("ada-est", 0, tmp_path, None, [])
    path = plot_prompt_ledger([run, RunCurves("grpo", 0, tmp_path / "none", None, [])], tmp_path)
    assert path is not None and path.read_bytes()[:4] == b"\x89PNG"


def test_compare_regimes_are_checked():
    assert CompareParams(regimes=["pool", "fresh"]).regimes == ["pool", "fresh"]
    with pytest.raises(ValueError, match="each regime once"):
        CompareParams(regimes=["pool", "pool"])
    with pytest.raises(ValueError):
        CompareParams(regimes=["sometimes"])


def test_seeds_without_a_difference_are_excluded_and_counted():
    # Seed 2's variant never evaluated: its difference is NaN, so it is left out and the table says so.
    runs = [curve("grpo", s, [0.1, 0.2, 0.4], 10) for s in (0, 1, 2)]
    runs += [curve("ada", s, [0.1, 0.3, 0.5 + 0.1 * s], 10) for s in (0, 1)]
    runs.append(RunCurves("ada", 2, Path("."), None, merge_rows([{"step": 1, K.BUDGET_GENERATED_SAMPLES: 10.0}])))
    row = paired_differences(runs, "grpo", {"step": "step"})[0]
    assert row["seeds"] == 2 and row["counted_seeds"] == [0, 1] and row["excluded_seeds"] == [2]
    assert row["diffs"] == pytest.approx([0.1, 0.2]) and row["mean_diff"] == pytest.approx(0.15)
    assert "| ada | grpo | step | 2 (1 excluded: seed 2, no value) | +0.150 [" in paired_table([row])
