"""Advantage estimators: hand-computed cases, zero variance, properties, and bad input."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ada_core.config import AdvantageConfig
from ada_core.rl.advantages import ADVANTAGES, compute_advantages, register_advantage

EPS = 1e-6
rewards_01 = st.lists(st.sampled_from([0.0, 1.0]), min_size=2, max_size=16)


def test_registry_matches_config_choices():
    choices = set(AdvantageConfig.model_fields["name"].annotation.__args__)
    assert set(ADVANTAGES) == choices


def test_global_mean_three_of_eight():
    pool = [1, 1, 1, 0, 0, 0, 0, 0]  # p_hat = 3/8
    assert compute_advantages("global_mean", [1, 1, 0, 0], pool, EPS) == pytest.approx([0.625, 0.625, -0.375, -0.375])


def test_global_mean_group_does_not_sum_to_zero():
    # A balanced group of a hard prompt gets a net push toward its positives (DESIGN.md section 1).
    adv = compute_advantages("global_mean", [1, 1, 0, 0], [1, 1] + [0] * 14, EPS)
    assert sum(adv) == pytest.approx(4 * (0.5 - 2 / 16))


def test_grpo_worked_example_uses_unbiased_std():
    adv = compute_advantages("grpo", [1, 0, 0, 0], [1, 0, 0, 0, 0, 0, 0, 0], EPS)
    assert adv == pytest.approx([1.5, -0.5, -0.5, -0.5], rel=1e-5)


def test_group_mean_and_rloo_worked_examples():
    assert compute_advantages("group_mean", [1, 0, 0, 0], [1] * 8, EPS) == pytest.approx([0.75, -0.25, -0.25, -0.25])
    assert compute_advantages("rloo", [1, 0, 0, 0], [1] * 8, EPS) == pytest.approx([1.0, -1 / 3, -1 / 3, -1 / 3])


def test_global_mean_std_divides_by_pool_std():
    pool = [1, 0, 0, 0, 0, 0, 0, 0]
    std = np.std(pool, ddof=1)
    adv = compute_advantages("global_mean_std", [1, 0, 0, 0], pool, EPS)
    assert adv == pytest.approx([(1 - 0.125) / (std + EPS), -0.125 / (std + EPS), -0.125 / (std + EPS), -0.125 / (std + EPS)])


@pytest.mark.parametrize("name", sorted(ADVANTAGES))
def test_uniform_group_and_pool_give_zero(name):
    assert compute_advantages(name, [1, 1, 1, 1], [1] * 8, EPS) == [0.0, 0.0, 0.0, 0.0]


@pytest.mark.parametrize("name", ["grpo", "global_mean_std"])
def test_std_below_eps_counts_as_zero_variance(name):
    # Rewards that differ by less than eps are noise: no division blow-up, zero advantages.
    assert compute_advantages(name, [0.5, 0.5 + 1e-9], [0.5, 0.5 + 1e-9], 1e-6) == [0.0, 0.0]


def test_global_mean_std_uniform_group_from_mixed_pool_is_not_zero():
    adv = compute_advantages("global_mean_std", [0, 0, 0, 0], [1, 0, 0, 0, 0, 0, 0, 0], EPS)
    assert all(a < 0 for a in adv)


def test_returns_plain_floats():
    adv = compute_advantages("grpo", np.array([1.0, 0.0]), np.array([1.0, 0.0]), EPS)
    assert all(type(a) is float for a in adv)


@settings(max_examples=60, deadline=None)
@given(rewards_01)
def test_grpo_is_zero_mean_unit_std_when_mixed(group):
    adv = np.array(compute_advantages("grpo", group, group, 1e-12))
    if len(set(group)) == 1:
        assert np.all(adv == 0)
    else:
        assert adv.mean() == pytest.approx(0.0, abs=1e-9)
        assert adv.std(ddof=1) == pytest.approx(1.0, rel=1e-6)


@settings(max_examples=60, deadline=None)
@given(rewards_01)
def test_rloo_is_rescaled_group_mean(group):
    rloo = np.array(compute_advantages("rloo", group, group, EPS))
    gm = np.array(compute_advantages("group_mean", group, group, EPS))
    n = len(group)
    assert rloo == pytest.approx(n / (n - 1) * gm)


@settings(max_examples=60, deadline=None)
@given(rewards_01, rewards_01)
def test_global_mean_is_reward_minus_pool_mean(group, extra):
    pool = group + extra
    adv = compute_advantages("global_mean", group, pool, EPS)
    assert adv == pytest.approx([r - np.mean(pool) for r in group])


@pytest.mark.parametrize(
    "name, group, pool, eps, match",
    [
        ("nope", [1, 0], [1, 0], EPS, "unknown estimator 'nope'"),
        ("grpo", [1, float("nan")], [1, 0], EPS, "group_rewards: not all finite"),
        ("grpo", [1, 0], [1, float("inf")], EPS, "pool_rewards: not all finite"),
        ("grpo", [], [1, 0], EPS, "group_rewards: expected a non-empty 1-D array"),
        ("grpo", [[1, 0]], [1, 0], EPS, "group_rewards: expected a non-empty 1-D array"),
        ("grpo", [1, 0], [1, 0], 0.0, "eps: must be > 0"),
    ],
)
def test_bad_input_names_the_argument(name, group, pool, eps, match):
    with pytest.raises(ValueError, match=match):
        compute_advantages(name, group, pool, eps)


def test_registering_a_name_twice_raises():
    with pytest.raises(ValueError, match="already registered"):
        register_advantage("grpo")(lambda g, p, e: g)
