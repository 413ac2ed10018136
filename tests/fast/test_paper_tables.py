"""Tables A, B and C of the paper grid (report/paper_tables.py) on hand-made curves: every row says the
step or budget it is read at, and runs of unequal length are never mixed (issue 26, finding 4)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from ada_core import metrics as K
from report.curves import RunCurves, merge_rows
from report.paper_tables import paper_tables_markdown, step_profile, table_a, table_b, table_c, table_c_matched

T95_2 = 4.302653  # t(0.975, 2 degrees of freedom)
T95_1 = 12.706205  # t(0.975, 1 degree of freedom)


def run(label: str, seed: int, acc: list[float], samples: float, gen_s: float, tokens_per_sample: float = 2.0,
        planned: int | None = None) -> RunCurves:
    """Eval at steps 0, 1, 2, ... with accuracy `acc`, `samples` generated and 8 tokens trained a step; with
    `planned`, the run's config plans that many steps (a run stopped early evaluated fewer)."""
    rows = []
    for step, a in enumerate(acc):
        if step > 0:
            rows.append({"step": step, K.BUDGET_GENERATED_SAMPLES: samples, K.BUDGET_GENERATED_TOKENS:
                         samples * tokens_per_sample, K.TIME_GENERATE_S: gen_s, K.TIME_REWARD_S: 0.1,
                         K.TIME_UPDATE_S: 0.5, K.TIME_STEP_S: gen_s + 0.1 + 0.5 + 0.2,
                         K.BUDGET_GENERATED_SAMPLES_CUM: samples * step,
                         K.BUDGET_TRAINED_TOKENS_CUM: 8.0 * step})
        rows.append({"step": step, K.EVAL_AVG_AT_K: a, K.EVAL_PASS_AT_K: min(1.0, 2 * a)})
    return RunCurves(label, seed, Path("."), None, merge_rows(rows), config={"steps": planned} if planned else {})


def pool() -> list[RunCurves]:
    runs = [run("grpo", s, [0.1, 0.2, 0.4 + 0.01 * s], 128, 1.0) for s in (0, 1, 2)]
    runs += [run("grpo-n8", s, [0.1, 0.3, 0.5 + 0.02 * s], 256, 2.0) for s in (0, 1, 2)]
    return runs


def row_of(text: str, *first_cells: str) -> str:
    """The table line that starts with these cells."""
    start = "| " + " | ".join(first_cells) + " |"
    lines = [line for line in text.splitlines() if line.startswith(start)]
    assert len(lines) == 1, (start, text)
    return lines[0]


def test_table_a_is_mean_and_95_interval_over_seeds_at_a_stated_step_and_budget():
    text = table_a({"standard": pool(), "hard": pool()[:3]})
    half = T95_2 * 0.01 / math.sqrt(3)  # sd 0.01 over 3 seeds
    # read at step 2, by which grpo generated 256 samples and trained 16 tokens
    assert f"| standard | grpo | 2 | 256 | 16 | 0.410 ± {half:.3f} | 0.820 ± {2 * half:.3f} | 0,1,2 |" in text
    assert row_of(text, "standard", "grpo-n8").startswith("| standard | grpo-n8 | 2 | 512 | 16 | 0.520 ±")
    assert f"| hard | grpo | 2 | 256 | 16 | 0.410 ± {half:.3f} |" in text
    assert "| hard | grpo-n8 |" not in text  # not run on the hard pool: no row


def test_table_a_leaves_out_a_run_that_stopped_early_and_says_so():
    # seed 2 of grpo-n8 was stopped at step 1 of 2: averaging its 0.3 with the others' step-2 0.5/0.52 would
    # mix lengths; the row is read at step 2 over seeds 0 and 1 and names seed 2.
    runs = pool()[:5] + [run("grpo-n8", 2, [0.1, 0.3], 256, 2.0, planned=2)]
    text = table_a({"standard": runs})
    half = T95_1 * math.sqrt(0.0002) / math.sqrt(2)  # sd of 0.50, 0.52 over 2 seeds
    assert (f"| standard | grpo-n8 | 2 | 512 | 16 | 0.510 ± {half:.3f} | 1.000 ± 0.000 "
            "| 0,1 (seed 2: stopped at step 1 of 2) |") in text
    assert "| standard | grpo | 2 | 256 | 16 |" in text  # the others keep their full length


def test_a_partial_grid_names_the_seeds_it_lacks():
    # a killed grid read with --tables-from: grpo-n8 finished seeds 0 and 1 only
    text = paper_tables_markdown({"standard": pool()[:5]})
    table_a_part = text.split("### Table A")[1].split("### Table B")[0]
    assert row_of(table_a_part, "standard", "grpo-n8").endswith("| 0,1 (seed 2: no run) |")
    table_c_part = text.split("### Table C'")[1].split("### Table D")[0]
    assert row_of(table_c_part, "standard", "grpo-n8", "grpo").startswith(
        "| standard | grpo-n8 | grpo | 0,1 (seed 2: no run) |")


def test_table_b_splits_the_step_and_gives_ratios_to_grpo():
    profile = step_profile(run("x", 0, [0.1, 0.2], 128, 1.0))
    assert profile == pytest.approx({"gen": 1.0, "reward": 0.1, "update": 0.5, "other": 0.2, "step": 1.8,
                                     "samples": 128, "tokens": 256})
    text = table_b({"standard": pool()})
    assert "| standard | grpo | 1-2 | 1.800 (×1.00) | 1.000 (×1.00) |" in text
    assert "| standard | grpo-n8 | 1-2 | 2.800 (×1.56) | 2.000 (×2.00) | 0.100 (×1.00) | 0.500 (×1.00) | 0.200 (×1.00) " \
           "| 256 (×2.00) | 512 (×2.00) | 0,1,2 |" in text


def test_table_c_pairs_by_seed_at_equal_samples_and_tokens_and_prints_the_budget():
    text = table_c({"standard": pool()})
    # at grpo's final 256 samples grpo-n8 is at step 1: 0.3 - (0.4 + 0.01 s) = -0.1 - 0.01 s, mean -0.11;
    # equal trained tokens: both train 8 a step, so the pairs are the final accuracies, +0.1 + 0.01 s
    half = T95_2 * 0.01 / math.sqrt(3)
    assert (f"| standard | grpo-n8 | grpo | 0,1,2 | 256 | **-0.110 [{-0.11 - half:+.3f}, {-0.11 + half:+.3f}]** "
            f"| 1 / 2 | 16 | **+0.110 [{0.11 - half:+.3f}, {0.11 + half:+.3f}]** |") in text


def test_table_c_reads_every_seed_of_a_row_at_one_budget():
    # ada generates 100, 120, 140 samples a step by seed (final 200, 240, 280); grpo 128 (final 256). Each
    # seed's own common budget would be 200, 240, 256; the row reads all three at 200, and says so.
    grpo = [run("grpo", s, [0.1, 0.2, 0.4], 128, 1.0) for s in (0, 1, 2)]
    ada = [run("ada", s, [0.1, 0.3, 0.5], 100 + 20 * s, 1.0) for s in (0, 1, 2)]
    grpo_at_200 = 0.2 + (200 - 128) / 128 * 0.2
    ada_at_200 = [0.5, 0.3 + (200 - 120) / 120 * 0.2, 0.3 + (200 - 140) / 140 * 0.2]
    diffs = [a - grpo_at_200 for a in ada_at_200]
    mean = sum(diffs) / 3
    half = T95_2 * float(np.std(diffs, ddof=1)) / math.sqrt(3)
    text = table_c({"standard": grpo + ada})
    assert row_of(text, "standard", "ada", "grpo").startswith(
        f"| standard | ada | grpo | 0,1,2 | 200 | {'**' if mean - half > 0 else ''}{mean:+.3f} "
        f"[{mean - half:+.3f}, {mean + half:+.3f}]")


def test_table_c_leaves_out_a_stopped_run_instead_of_moving_the_row():
    # the case: one run stopped early. The row keeps the budget of the runs that finished, over the
    # seeds that have both, and names the stopped one (and a stopped reference run, by the reference's name).
    full = table_c({"standard": pool()[:3] + pool()[3:5]})
    runs = pool()[:5] + [run("grpo-n8", 2, [0.1, 0.3], 256, 2.0, planned=2)]
    text = table_c({"standard": runs})
    assert row_of(text, "standard", "grpo-n8", "grpo") == row_of(full, "standard", "grpo-n8", "grpo").replace(
        "| 0,1 (seed 2: no run) |", "| 0,1 (seed 2: stopped at step 1 of 2) |")
    runs = pool()[:2] + [run("grpo", 2, [0.1, 0.2], 128, 1.0, planned=2)] + pool()[3:]
    assert "| 0,1 (seed 2: grpo stopped at step 1 of 2) |" in table_c({"standard": runs})


def test_markdown_says_where_each_pool_is_read_and_holds_all_four_tables():
    runs = pool()[:5] + [run("grpo-n8", 2, [0.1, 0.3], 256, 2.0, planned=2)]
    text = paper_tables_markdown({"standard": runs, "hard": pool()})
    assert ("- pool `standard`: read at step 2, the last evaluation of its longest runs; 5 runs reach it; left out "
            "of every table: grpo-n8 seed 2 (stopped at step 1 of 2)") in text
    assert "- pool `hard`: read at step 2, the last evaluation of its longest runs; 6 runs reach it\n" in text
    for title in ("### Table A", "### Table B", "### Table C", "### Table D"):
        assert title in text


def test_table_c_matched_reads_each_method_against_its_controls_at_equal_samples_and_updates():
    """ada draws 256 samples a step (8 a prompt over 32); its controls: grpo-b.ada (n = 4 over 64 prompts, its own
    run) and, for n = 8, the grid's grpo-n8 run (the control coincided with it and was not run twice). Both
    controls spend what ada spends a step, so at ada's final 512 samples each side made 2 updates."""
    def cfg(r):
        r.config = {"prompts_per_step": 32}
        return r
    ada = [cfg(run("ada", s, [0.1, 0.3, 0.52 + 0.01 * s], 256, 2.0)) for s in (0, 1, 2)]
    by_prompts = [cfg(run("grpo-b.ada", s, [0.1, 0.3, 0.50], 256, 2.0)) for s in (0, 1, 2)]
    text = table_c_matched({"standard": pool() + ada + by_prompts})
    half = T95_2 * 0.01 / math.sqrt(3)
    assert (f"| standard | ada | grpo-b.ada (b) | 0,1,2 | 256 / 256 | 512 | 2 / 2 | **+0.030 [{0.03 - half:+.3f}, "
            f"{0.03 + half:+.3f}]** |") in text
    # n = 256 / 32 = 8: grpo-n8's run of each seed is the control (0.5 + 0.02 s)
    row = row_of(text, "standard", "ada", "grpo-n8 (n)")
    assert row.startswith("| standard | ada | grpo-n8 (n) | 0,1,2 | 256 / 256 | 512 | 2 / 2 | +0.010 [")
    assert "| standard | grpo |" not in text and "| standard | grpo-b.ada |" not in text  # GRPO and controls have none
