"""Tables A, B and C of the paper grid (report/paper_tables.py) on hand-made curves."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from ada_core import metrics as K
from report.curves import RunCurves, merge_rows
from report.paper_tables import paper_tables_markdown, step_profile, table_a, table_b, table_c


def run(label: str, seed: int, acc: list[float], samples: float, gen_s: float, tokens_per_sample: float = 2.0):
    rows = []
    for step, a in enumerate(acc):
        if step > 0:
            rows.append({"step": step, K.BUDGET_GENERATED_SAMPLES: samples, K.BUDGET_GENERATED_TOKENS:
                         samples * tokens_per_sample, K.TIME_GENERATE_S: gen_s, K.TIME_REWARD_S: 0.1,
                         K.TIME_UPDATE_S: 0.5, K.TIME_STEP_S: gen_s + 0.1 + 0.5 + 0.2,
                         K.BUDGET_GENERATED_SAMPLES_CUM: samples * step,
                         K.BUDGET_TRAINED_TOKENS_CUM: 8.0 * step})
        rows.append({"step": step, K.EVAL_AVG_AT_K: a, K.EVAL_PASS_AT_K: min(1.0, 2 * a)})
    return RunCurves(label, seed, Path("."), None, merge_rows(rows))


def pool() -> list[RunCurves]:
    runs = [run("grpo", s, [0.1, 0.2, 0.4 + 0.01 * s], 128, 1.0) for s in (0, 1, 2)]
    runs += [run("grpo-n8", s, [0.1, 0.3, 0.5 + 0.02 * s], 256, 2.0) for s in (0, 1, 2)]
    return runs


def test_table_a_is_mean_and_95_interval_over_seeds():
    text = table_a({"standard": pool(), "hard": pool()[:3]})
    half = 4.302653 * 0.01 / math.sqrt(3)  # t(0.975, 2) x sd 0.01 / sqrt(3)
    assert f"| grpo | 0.410 ± {half:.3f} | 0.820 ± {2 * half:.3f} | 0.410 ± {half:.3f} |" in text
    assert "| grpo-n8 | 0.520 ±" in text and "| n/a | n/a | 0,1,2 |" in text  # not run on the hard pool


def test_table_b_splits_the_step_and_gives_ratios_to_grpo():
    profile = step_profile(run("x", 0, [0.1, 0.2], 128, 1.0))
    assert profile == pytest.approx({"gen": 1.0, "reward": 0.1, "update": 0.5, "other": 0.2, "step": 1.8,
                                     "samples": 128, "tokens": 256})
    text = table_b({"standard": pool()})
    assert "| standard | grpo | 1.800 (×1.00) | 1.000 (×1.00) |" in text
    assert "| standard | grpo-n8 | 2.800 (×1.56) | 2.000 (×2.00) | 0.100 (×1.00) | 0.500 (×1.00) | 0.200 (×1.00) " \
           "| 256 (×2.00) | 512 (×2.00) |" in text


def test_table_c_pairs_by_seed_at_equal_samples_and_tokens():
    text = table_c({"standard": pool()})
    # at grpo's final 256 samples grpo-n8 is at step 1: 0.3 - (0.4 + 0.01 s) = -0.1 - 0.01 s, mean -0.11
    half = 4.302653 * 0.01 / math.sqrt(3)
    assert f"| standard | grpo-n8 | grpo | 3 | **-0.110 [{-0.11 - half:+.3f}, {-0.11 + half:+.3f}]** |" in text
    # equal trained tokens: both train 8 a step, so the pairs are the final accuracies, +0.1 + 0.01 s
    assert f"**+0.110 [{0.11 - half:+.3f}, {0.11 + half:+.3f}]** |" in text
    assert "### Table C" in paper_tables_markdown({"standard": pool()})
