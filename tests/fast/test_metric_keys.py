"""What a reader of a run meets first: the metric keys' order on MLflow's run page, the families a run leaves
out when their feature is off, the budget grid the budget-axis series share, and older runs read as today's."""

from __future__ import annotations

import json

import pytest

from ada_core import metrics as K
from ada_core.config import build_config
from ada_core.config.applies import Clause, lookup, metrics_off
from ada_core.data.suites import WEIGHTED_KEY
from ada_core.data.suites import metric_key as suite_key
from ada_core.run.files import METRICS, RESULT, read_metrics, read_result
from flows.tracking.budget import BudgetGrid, grid_points


def every_key() -> set[str]:
    """Every metric key a run of ours can log: the constants, the key builders at sample arguments, the
    budget axes, a suite's keys and MLflow's own system metrics."""
    keys = {v for name, v in vars(K).items() if name.isupper() and isinstance(v, str) and "/" in v}
    keys |= {K.active_prompts_key(0), K.exit_reason_key("balance"), K.verifier_status_key("ok"),
             K.server_idle_key(0), K.token_staleness_key(0), suite_key("math500"), WEIGHTED_KEY, "system/cpu_utilization_percentage"}
    keys |= {K.budget_axis_key(axis, key) for axis in (K.VS_SAMPLES, K.VS_MFLOPS)
             for key in (K.EVAL_AVG_AT_K, K.EVAL_PASS_AT_K, K.REWARD_MEAN)}
    return keys


def mlflow_sections(keys: set[str]) -> list[str]:
    """The chart sections of MLflow's run page, in its order (`RunsChartsCardConfig.getBaseChartAndSectionConfigs`,
    MLflow 3): a key's section is the key without its last part; sections sort by name (JavaScript's default sort:
    UTF-16 code units, Python's order for ASCII), then "Model metrics" (no `/`) and "System metrics" (`system/`)."""
    named = {key.rsplit("/", 1)[0] for key in keys if "/" in key and not key.startswith("system/")}
    return sorted(named) + ["Model metrics", "System metrics"]


def test_held_out_accuracy_and_reward_are_the_first_section_mlflow_shows():
    sections = mlflow_sections(every_key())
    assert sections[0] == K.HEADLINE == "accuracy", sections
    assert {key.rsplit("/", 1)[0] for key in (K.EVAL_AVG_AT_K, K.EVAL_PASS_AT_K, K.REWARD_MEAN)} == {sections[0]}
    # The budget-axis curves follow it, before budget/, sampler/, time/ and the rest.
    assert sections[1:3] == [K.VS_MFLOPS, K.VS_SAMPLES], sections
    assert all(K.is_valid_key(key) for key in every_key())


# Each family's feature switched on: the config that turns it on (the rest of the tiny profile's grpo run).
FEATURE_ON = {
    "rollout.async_steps > 0": ("ada-balance", {"rollout": {"engine": "vllm", "async_steps": 1}, "loss": {"tis_cap": 2.0}}),
    "sampler.schedule == streaming": ("ada-balance", {"rollout": {"engine": "vllm"}, "sampler": {"schedule": "streaming"}}),
    "rollout.partial_rollout == true": ("ada-balance", {"rollout": {"engine": "vllm", "async_steps": 1, "partial_rollout": True},
                                                        "loss": {"tis_cap": 2.0}}),
    "sampler.carry_over == true": ("ada-balance", {"rollout": {"engine": "vllm", "async_steps": 1, "partial_rollout": True},
                                                   "sampler": {"schedule": "streaming", "carry_over": True},
                                                   "loss": {"tis_cap": 2.0}}),
    "rollout.stale == drop": ("ada-balance", {"rollout": {"engine": "vllm", "async_steps": 1, "partial_rollout": True,
                                                         "max_staleness": 2, "stale": "drop"},
                                              "sampler": {"schedule": "streaming", "carry_over": True},
                                              "loss": {"tis_cap": 2.0}}),
    "loss.kl_coef > 0": ("grpo", {"loss": {"kl_coef": 0.05}}),
    "distributed.num_ranks > 1": ("grpo", {"distributed": {"num_ranks": 2}}),
    "sampler.name in [ada, budgeted, est]": ("ada-balance", {}),
}


def test_a_feature_that_is_off_logs_none_of_its_family_and_one_that_is_on_logs_it():
    assert set(FEATURE_ON) == set(K.WHEN_ON)
    plain = build_config("grpo", "tiny")
    assert metrics_off(plain) == {key for keys in K.WHEN_ON.values() for key in keys}
    assert {key for key in metrics_off(plain) if key.startswith("async/")} == {
        K.ASYNC_STEPS, K.ASYNC_POLICY_VERSION, K.ASYNC_STALENESS_MEAN, K.ASYNC_STALENESS_MAX, K.ASYNC_WAIT_S,
        K.ASYNC_TOKEN_STALENESS_MEAN, K.ASYNC_TOKEN_STALENESS_MAX, K.ASYNC_SPANNING_SAMPLES}
    for clause, (preset, overrides) in FEATURE_ON.items():
        config = build_config(preset, "tiny", overrides=overrides)
        assert not set(K.WHEN_ON[clause]) & metrics_off(config), clause
        for atom in Clause.parse(clause).atoms:  # each clause names a real field
            lookup(config, atom.path)
    # A family's keys are real keys, each in one family.
    keys = [key for family in K.WHEN_ON.values() for key in family]
    assert len(keys) == len(set(keys)) and set(keys) <= every_key()


def test_the_grid_is_round_numbers_shared_by_any_scale():
    assert grid_points(-1, 130) == [0, 1, 2, 3, 4, 5, 6, 8, 10, 12, 15, 20, 25, 30, 40, 50, 60, 80, 100, 120]
    assert grid_points(1280, 7680) == [1500, 2000, 2500, 3000, 4000, 5000, 6000]
    assert grid_points(2.4e6, 3.1e6) == [2_500_000, 3_000_000]
    assert grid_points(5, 5) == [] and grid_points(0, 0.5) == []


def _curve(grid: BudgetGrid, per_step: float, values: list[float]) -> dict[int, float]:
    """Evaluations after steps 0, 1, 2, ... of a run spending `per_step` samples a step, through `grid`."""
    out: dict[int, float] = {}
    for step, value in enumerate(values):
        for x, y in grid.add("accuracy/vs_samples/heldout_avg_at_k", step * per_step, value):
            assert x not in out
            out[x] = y
    return out


def test_runs_with_different_per_step_budgets_read_their_curves_off_the_same_budgets():
    """GRPO's 128 samples a step against an adaptive run's 371.5: different budgets at every evaluation, the
    same grid points over the range both cover, each the run's own curve interpolated, none past its end."""
    grpo = _curve(BudgetGrid(), 128.0, [0.1, 0.2, 0.3, 0.35])
    ada = _curve(BudgetGrid(), 371.5, [0.1, 0.3, 0.4, 0.45])
    both = [x for x in grpo if x in ada]
    assert both == [x for x in grpo if x <= 384] == [x for x in ada if x <= 384] == grid_points(-1, 384)
    assert max(grpo) <= 3 * 128 and max(ada) <= 3 * 371.5
    assert grpo[0] == 0.1 and grpo[200] == pytest.approx(0.2 + 0.1 * (200 - 128) / 128)
    assert ada[500] == pytest.approx(0.3 + 0.1 * (500 - 371.5) / 371.5)


def test_a_first_point_off_the_grid_gives_nothing_until_the_next_and_no_budget_no_point():
    grid = BudgetGrid()
    assert grid.add("r", 128.0, 0.2) == []  # the reward's first step: nothing to interpolate from
    assert grid.add("r", 128.0, 0.9) == []  # no budget spent since
    assert grid.add("r", 256.0, 0.4) == [(150, pytest.approx(0.2 + 0.2 * 22 / 128)), (200, pytest.approx(0.2 + 0.2 * 72 / 128)),
                                         (250, pytest.approx(0.2 + 0.2 * 122 / 128))]


def test_a_run_written_before_the_rename_reads_as_today(tmp_path):
    rows = [{"step": 0, "eval/avg_at_k": 0.1, "eval/pass_at_k": 0.2},
            {"step": 1, "reward/mean": 0.3, "time/step_s": 0.5}]
    (tmp_path / METRICS).write_text("".join(json.dumps(row) + "\n" for row in rows))
    (tmp_path / RESULT).write_text(json.dumps({"variant": "grpo", "metrics": {"eval/avg_at_k": 0.1}}))
    assert read_metrics(tmp_path) == [{"step": 0, K.EVAL_AVG_AT_K: 0.1, K.EVAL_PASS_AT_K: 0.2},
                                      {"step": 1, K.REWARD_MEAN: 0.3, K.TIME_STEP_S: 0.5}]
    assert read_result(tmp_path) == {"variant": "grpo", "metrics": {K.EVAL_AVG_AT_K: 0.1}}
