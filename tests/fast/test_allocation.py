"""The budgeted sampler and its allocation policies: the budget is never exceeded, every kept group
has exactly n, a skipped prompt is retested within the exploration floor's bound, and with the same
prior for every prompt and no history the policies reduce to GRPO's allocation.

Outcomes come from the simulation's Bernoulli engine; the verifier is the simulation's real one.
"""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ada_core import metrics as mk
from ada_core.config import AdvantageConfig, ConfigError, SamplerConfig, build_config
from ada_core.data import PromptSource
from ada_core.protocols import SamplingParams
from ada_core.records import Prompt
from ada_core.sampling import BudgetedSampler, FixedSampler, make_sampler
from ada_core.sampling.allocation import (
    PromptHistory,
    greedy_allocation,
    mixed_prob,
    moment,
)
from ada_core.sampling.simulate import (
    BernoulliEngine,
    BernoulliVerifier,
    budgeted_methods,
    run_simulation,
)

GLOBAL_MEAN = AdvantageConfig(name="global_mean")
SAMPLING = SamplingParams(max_tokens=14)


def prompts_with(*rates, prefix="p"):
    return [Prompt(id=f"{prefix}{i}", text="q", answer="1", meta={"pass_rate": float(r)}) for i, r in enumerate(rates)]


def budgeted(**kw) -> BudgetedSampler:
    return BudgetedSampler(SamplerConfig(name="budgeted", **kw), GLOBAL_MEAN)


def run(sampler, prompts, seed=0):
    return sampler.sample(prompts, BernoulliEngine(), BernoulliVerifier(), SAMPLING, np.random.default_rng(seed))


# --- the value function -----------------------------------------------------------------------------
def test_mixed_probability_worked_examples():
    assert moment(1, 1, 2) == pytest.approx(1 / 3)
    assert mixed_prob(1, 1, 4) == pytest.approx(0.6)  # flat prior: 1 - 2/5
    assert mixed_prob(1, 9, 4) == pytest.approx(1 - 9 / 13 - moment(1, 9, 4))
    assert mixed_prob(1, 1, 1) == 0.0 and mixed_prob(5, 5, 0) == 0.0
    # known p (no spread): 1 - p^k - (1-p)^k
    assert mixed_prob(0.3e9, 0.7e9, 4) == pytest.approx(1 - 0.3**4 - 0.7**4, rel=1e-6)


def test_greedy_allocation_gives_uncertain_prompts_more_and_respects_the_cap():
    alloc = greedy_allocation([(1, 1), (0.5, 20), (3, 3)], n=4, budget=20, max_per_prompt=8)
    assert sum(alloc) <= 20 and all(k == 0 or 4 <= k <= 8 for k in alloc)
    assert alloc[2] >= alloc[1]  # Beta(3, 3) mixes far more often than a near-certain 0
    # a second chunk of n no longer fits, so the last 3 go one at a time to the prompt already started
    assert greedy_allocation([(1, 1)] * 3, n=4, budget=7, max_per_prompt=8) == [7, 0, 0]


# --- the baseline: same prior, no history -> GRPO -----------------------------------------------------
@pytest.mark.parametrize("allocation", ["posterior", "elimination"])
@pytest.mark.parametrize("strength", [1.0, 2.0])
def test_same_prior_no_history_reduces_to_grpo(allocation, strength):
    prompts = prompts_with(*np.random.default_rng(2).random(40))
    batch = run(budgeted(allocation=allocation, prior_strength=strength, n=4, M=4, N=4), prompts, seed=5)
    grpo = run(FixedSampler(SamplerConfig(n=4), AdvantageConfig(name="grpo")), prompts, seed=5)
    assert [len(p.samples) for p in batch.pools] == [4] * 40
    assert batch.metrics[mk.SAMPLER_ROUNDS] == 1.0  # one engine call, as GRPO
    # the same seeded call: the very same samples and so the same informative groups
    assert [[s.text for s in p.samples] for p in batch.pools] == [[s.text for s in g.samples] for g in grpo.groups]
    assert batch.metrics[mk.SAMPLER_EFFECTIVE_RATIO] == pytest.approx(grpo.metrics[mk.SAMPLER_EFFECTIVE_RATIO])


# --- properties over random configs, pools and steps ---------------------------------------------------
budget_configs = st.builds(
    dict,
    allocation=st.sampled_from(["posterior", "elimination"]),
    n=st.integers(2, 5),
    M=st.integers(1, 6),
    N=st.integers(1, 4),
    budget=st.none() | st.integers(5, 120),
    skip_confidence=st.floats(0.3, 1.0),
    explore_after=st.integers(0, 3),
    forget=st.floats(0.5, 1.0),
    unresolved=st.sampled_from(["keep", "drop"]),
).filter(lambda c: c["budget"] is None or c["budget"] >= c["n"])
pool_rates = st.lists(st.sampled_from([0.0, 1.0]) | st.floats(0.0, 1.0), min_size=2, max_size=14)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(budget_configs, pool_rates, st.integers(1, 6), st.integers(0, 2**32 - 1))
def test_budgeted_invariants_over_steps(kw, rates, batch_size, seed):
    cfg = SamplerConfig(name="budgeted", **kw)
    sampler = BudgetedSampler(cfg, GLOBAL_MEAN)
    prompts = prompts_with(*rates)
    batch_size = min(batch_size, len(prompts))
    source = PromptSource(prompts, seed=seed % 1000)
    skipped_run: dict[str, int] = {}
    for step in range(8):
        drawn = source.take(batch_size)
        batch = run(sampler, drawn, seed=seed + step)
        budget = cfg.budget if cfg.budget is not None else batch_size * cfg.n
        m = batch.metrics
        assert m[mk.BUDGET_GENERATED_SAMPLES] <= budget and m[mk.SAMPLER_BUDGET] == budget
        assert m[mk.SAMPLER_SAMPLES_PER_PROMPT_MAX] <= cfg.max_samples_per_prompt
        for g in batch.groups:
            assert len(g.samples) == cfg.n == len(g.advantages)
            assert {s.prompt_id for s in g.samples} == {g.prompt.id}
            assert g.advantages == pytest.approx([s.reward - g.p_hat for s in g.samples])
        for pool in batch.pools:
            assert len(pool.samples) == 0 or len(pool.samples) >= cfg.n  # no pool too small for a group
            if pool.exit_reason == "skipped":
                skipped_run[pool.prompt.id] = skipped_run.get(pool.prompt.id, 0) + 1
            else:
                skipped_run[pool.prompt.id] = 0
            # The exploration floor: never more than explore_after skips in a row (budget >= B x n).
            if budget >= batch_size * cfg.n:
                assert skipped_run[pool.prompt.id] <= cfg.explore_after
        assert len(batch.pools) == batch_size


def test_a_hopeless_prompt_is_skipped_then_retested_on_schedule():
    # One p = 0 prompt among mixed ones, drawn every step: once its posterior is confident it is
    # skipped, and after explore_after skips in a row it is sampled again.
    sampler = budgeted(allocation="posterior", n=4, M=4, N=4, skip_confidence=0.8, explore_after=2)
    prompts = prompts_with(0.0, 0.5, 0.5, 0.5)
    sizes = []
    for step in range(12):
        batch = run(sampler, prompts, seed=step)
        sizes.append(len(batch.pools[0].samples))
    assert 0 in sizes  # it was skipped at some point
    runs, current = [], 0
    for k in sizes:
        current = current + 1 if k == 0 else 0
        runs.append(current)
    assert max(runs) <= 2
    assert sizes[sizes.index(0):].count(0) < len(sizes[sizes.index(0):])  # and retested after


def test_history_round_trips_through_its_state_dict():
    sampler = budgeted(n=4, M=4, N=2)
    prompts = prompts_with(0.0, 1.0, 0.5, 0.2)
    for step in range(3):
        run(sampler, prompts, seed=step)
    state = sampler.state_dict()
    again = budgeted(n=4, M=4, N=2)
    again.load_state_dict(state)
    assert again.state_dict() == state
    assert [again.history.posterior(p) for p in prompts] == [sampler.history.posterior(p) for p in prompts]
    with pytest.raises(ValueError, match="not a PromptHistory state dict"):
        again.load_state_dict({"beliefs": {}})


def test_curated_prior_and_forgetting():
    history = PromptHistory(prior_strength=1.0, prior_weight=1.0, forget=0.5)
    curated = Prompt(id="c", text="q", answer="1", difficulty=0.25, meta={"curation_k": 8})
    plain = Prompt(id="p", text="q", answer="1", difficulty=3.0)  # a generator level, not a pass rate
    assert history.posterior(curated) == pytest.approx((0.5 + 2, 0.5 + 6))
    assert history.posterior(plain) == (0.5, 0.5)
    history.observe("p", 4, 0)
    history.end_step()
    history.end_step()
    assert history.posterior(plain) == pytest.approx((0.5 + 4 * 0.25, 0.5))


def test_budget_below_n_is_a_config_error():
    with pytest.raises(ValueError, match="sampler.budget = 3 is below sampler.n = 4"):
        SamplerConfig(name="budgeted", n=4, budget=3)
    with pytest.raises(ConfigError, match="sampler.budget"):
        build_config("ada-posterior", "tiny", overrides={"sampler": {"budget": 0}})


def test_presets_build_the_budgeted_sampler():
    for preset, allocation in (("ada-posterior", "posterior"), ("ada-budget", "elimination")):
        cfg = build_config(preset, "tiny")
        sampler = make_sampler(cfg.sampler, cfg.advantage)
        assert isinstance(sampler, BudgetedSampler) and cfg.sampler.allocation == allocation
        assert cfg.sampler.budget is None and cfg.advantage.name == "global_mean"


# --- the simulation ---------------------------------------------------------------------------------------
def test_budgeted_policies_beat_grpo_at_grpo_samples_on_a_reused_pool():
    # The default mix on a pool of 512 reused over 8 steps of 128 (4 epochs): history pays off.
    methods = {**budgeted_methods(), "grpo-n4": make_sampler(SamplerConfig(name="fixed", n=4), AdvantageConfig())}
    r = run_simulation(num_prompts=128, steps=8, seed=1, pool=512, methods=methods)
    grpo = r["grpo-n4"]
    for name in ("ada-posterior", "ada-budget"):
        assert r[name]["generated_samples_per_step"] <= grpo["generated_samples_per_step"]
        assert r[name]["effective_ratio"] > grpo["effective_ratio"]
        assert r[name]["effective_ratio"] <= r["oracle-budget"]["effective_ratio"] + 0.02
