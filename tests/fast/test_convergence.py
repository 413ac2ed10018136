"""Table D (report/convergence.py) on hand-made curves: the target, the interpolated crossing, seeds that
never reach it, runs left out for being short, and the paired speed-up against GRPO n = 4."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from report.convergence import Crossing, crossing, table_d
from test_paper_tables import row_of, run

# grpo's finals are 0.4, 0.5, 0.6: the target is their mean, 0.5; grpo's own crossing is its read step (4).
GRPO = [[0.1, 0.2, 0.3, 0.35, 0.4], [0.1, 0.2, 0.3, 0.4, 0.5], [0.1, 0.2, 0.4, 0.6, 0.6]]
# ada (200 samples a step) crosses at steps 1.5, 0.8, 1.5 (samples 300, 160, 300)
ADA = [[0.1, 0.3, 0.7, 0.7, 0.7], [0.1, 0.6, 0.6, 0.6, 0.6], [0.1, 0.2, 0.8, 0.8, 0.8]]


def grid() -> list:
    runs = [run("grpo", s, acc, 128, 1.0) for s, acc in enumerate(GRPO)]
    runs += [run("ada", s, acc, 200, 1.0) for s, acc in enumerate(ADA)]
    runs += [run("slow", s, [0.1, 0.2, 0.3, 0.3, 0.3], 128, 1.0) for s in (0, 1)]
    runs.append(run("slow", 2, [0.1, 0.2, 0.3], 128, 1.0, planned=4))  # stopped at step 2 of 4
    return runs


def test_the_crossing_is_interpolated_in_steps_and_in_samples():
    curve = run("x", 0, [0.1, 0.3, 0.5], 128, 1.0)
    assert crossing(curve, 0.4) == Crossing(steps=pytest.approx(1.5), samples=pytest.approx(192))
    assert crossing(curve, 0.5) == Crossing(2.0, 256.0)  # reached exactly at an evaluation
    assert crossing(curve, 0.05) == Crossing(0.0, 0.0)  # the start already reaches it
    assert crossing(curve, 0.51) is None
    # the first crossing counts, not a later one after a dip
    assert crossing(run("x", 0, [0.1, 0.5, 0.2, 0.6], 10, 1.0), 0.4).steps == pytest.approx(0.75)


def ratio_cell(ratios: list[float], seeds: str) -> str:
    logs = np.log(ratios)
    half = stats.t.ppf(0.975, len(logs) - 1) * np.std(logs, ddof=1) / math.sqrt(len(logs))
    mean = logs.mean()
    return f"×{math.exp(mean):.2f} [{math.exp(mean - half):.2f}, {math.exp(mean + half):.2f}] (seeds {seeds})"


def test_table_d_counts_who_reaches_grpo_final_accuracy_and_pairs_the_speed_up():
    text = table_d({"standard": grid()})
    target = "| standard | 0.500 (grpo at step 4; its gain over steps 3-4: +0.050 [-0.074, +0.174]) |"
    # the target cell says how much grpo's curve still rose over its last evaluation interval (flat or not);
    # grpo reaches its own final accuracy at its read step in every seed (step 4, 512 samples): the paper's
    # reading of "faster convergence"; its own speed-up is 1 by definition
    assert row_of(text, "standard", "0.500 (grpo at step 4; its gain over steps 3-4: +0.050 [-0.074, +0.174])", "grpo") == (
        f"{target} grpo | 3 of 3 seeds | 4.0 ± 0.0 | 512 ± 0 | ×1 (the reference) | ×1 (the reference) |")
    # ada: 3 of 3, the mean over all three; the speed-up pairs every seed against grpo's read step:
    # steps 4 / 1.5, 4 / 0.8, 4 / 1.5; samples 512 / 300, 512 / 160, 512 / 300
    steps_half = stats.t.ppf(0.975, 2) * np.std([1.5, 0.8, 1.5], ddof=1) / math.sqrt(3)
    assert row_of(text, "standard", "0.500 (grpo at step 4; its gain over steps 3-4: +0.050 [-0.074, +0.174])", "ada") == (
        f"{target} ada | 3 of 3 seeds | 1.3 ± {steps_half:.1f} | 253 ± "
        f"{stats.t.ppf(0.975, 2) * np.std([300, 160, 300], ddof=1) / math.sqrt(3):,.0f} "
        f"| {ratio_cell([4 / 1.5, 4 / 0.8, 4 / 1.5], '0,1,2')} | {ratio_cell([512 / 300, 512 / 160, 512 / 300], '0,1,2')} |")


def test_a_method_that_never_reaches_the_target_and_a_short_run_are_counted_not_averaged():
    text = table_d({"standard": grid()})
    assert row_of(text, "standard", "0.500 (grpo at step 4; its gain over steps 3-4: +0.050 [-0.074, +0.174])", "slow") == (
        "| standard | 0.500 (grpo at step 4; its gain over steps 3-4: +0.050 [-0.074, +0.174]) | slow | 0 of 2 seeds (seed 0: not reached; seed 1: not reached; "
        "seed 2: stopped at step 2 of 4) | n/a | n/a | n/a (no seed where both reached it after step 0) "
        "| n/a (no seed where both reached it after step 0) |")


def test_a_pool_without_its_reference_says_so():
    text = table_d({"hard": [run("ada", 0, ADA[0], 200, 1.0)]})
    assert "| hard | n/a (no grpo run is read) | ada | n/a | n/a | n/a | n/a | n/a |" in text
