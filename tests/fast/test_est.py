"""Reinforce-Ada-Est (`sampler.name: est`, preset `ada-est`): the allocation rule, the discounted estimate,
the gradient weighting, and the hard-pool curation band the paper tables run on."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ada_core.config import AdvantageConfig, ConfigError, SamplerConfig, build_config
from ada_core.data.curation import curate
from ada_core.protocols import SamplingParams
from ada_core.records import Prompt
from ada_core.sampling.allocation import EstHistory, est_allocation, est_weights
from ada_core.sampling.samplers import BudgetedSampler, EstSampler, make_sampler
from ada_core.sampling.simulate import BernoulliEngine, BernoulliVerifier, make_prompts

SAMPLING = SamplingParams(max_tokens=14)


# --- the allocation rule: N_x ~ 1/sqrt(p_hat), clipped, summing to the budget -----------------------------
def test_allocation_matches_hand_computed_cases():
    # 1/sqrt(p) = [2, 4, 1]; the scale c = 2 spends 14 exactly, nothing clipped.
    assert est_allocation([1 / 4, 1 / 16, 1.0], budget=14, n_min=2, n_max=8) == [4, 8, 2]
    # 1/sqrt(p) = [8, 2, 1], bounds [2, 6]: c = 2 gives [16 -> 6, 4, 2 -> 2] = 12.
    assert est_allocation([1 / 64, 1 / 4, 1.0], budget=12, n_min=2, n_max=6) == [6, 4, 2]
    # Equal estimates share the budget equally: GRPO's n each at the default budget B x n.
    assert est_allocation([0.3] * 5, budget=20, n_min=2, n_max=16) == [4] * 5
    # Rounding: p = [0.3, 0.5, 0.1, 0.05, 0.9], budget 20: c = 18 / 10.874 clips p = 0.9 up to 2, the
    # others 3.02, 2.34, 5.23, 7.40; floors sum to 19 and the largest fraction (7.40) takes the last one.
    assert est_allocation([0.3, 0.5, 0.1, 0.05, 0.9], budget=20, n_min=2, n_max=16) == [3, 2, 5, 8, 2]


def test_allocation_sums_to_the_budget_and_respects_the_bounds():
    rng = np.random.default_rng(0)
    for _ in range(300):
        count = int(rng.integers(1, 40))
        n_min = int(rng.integers(2, 5))
        n_max = int(rng.integers(n_min, 20))
        budget = int(rng.integers(count * n_min, count * n_max + 1))
        p_hat = rng.uniform(1e-3, 1.0, size=count).tolist()
        alloc = est_allocation(p_hat, budget, n_min, n_max)
        assert sum(alloc) == budget
        assert all(n_min <= k <= n_max for k in alloc)
        # harder prompts never get fewer samples than easier ones, up to the one rounding sample
        order = np.argsort(p_hat)
        assert all(alloc[order[i]] >= alloc[order[j]] - 1 for i in range(count) for j in range(i + 1, count))


def test_allocation_refuses_a_budget_the_bounds_cannot_spend():
    with pytest.raises(ValueError, match="cannot give 3 prompts 2..4 each"):
        est_allocation([0.5, 0.5, 0.5], budget=13, n_min=2, n_max=4)
    with pytest.raises(ValueError, match="cannot give 3 prompts 2..4 each"):
        est_allocation([0.5, 0.5, 0.5], budget=5, n_min=2, n_max=4)


def test_weights_are_the_log_objectives_normalised_to_mean_one():
    assert est_weights([0.5, 0.25]) == pytest.approx([2 / 3, 4 / 3])
    weights = est_weights([0.9, 0.1, 0.3, 0.05])
    assert sum(weights) / 4 == pytest.approx(1.0)
    assert weights == pytest.approx([w / (sum(1 / p for p in [0.9, 0.1, 0.3, 0.05]) / 4) for w in
                                     [1 / 0.9, 1 / 0.1, 1 / 0.3, 1 / 0.05]])


# --- the estimate: discounted counts with a Beta prior, decayed at each visit ---------------------------------
def test_estimate_decays_at_each_visit():
    history = EstHistory(prior_strength=1.0, discount=0.5)  # Jeffreys: Beta(1/2, 1/2)
    prompt = Prompt(id="x", text="1+1=", answer="2")
    assert history.estimate(prompt) == pytest.approx(0.5)
    history.visit("x", positives=2, negatives=2)
    assert history.estimate(prompt) == pytest.approx(2.5 / 5)
    history.visit("x", positives=0, negatives=4)  # old counts halve first: pos 1, neg 1 + 4
    assert history.counts["x"] == [1.0, 5.0, 2]
    assert history.estimate(prompt) == pytest.approx(1.5 / 7)
    history.visit("x", positives=4, negatives=0)  # pos 0.5 + 4, neg 2.5
    assert history.estimate(prompt) == pytest.approx(5.0 / 8)
    # a prompt that is not visited keeps its estimate however many steps pass: decay is per visit
    other = Prompt(id="y", text="2+2=", answer="4")
    history.visit("y", positives=1, negatives=3)
    before = history.estimate(other)
    for _ in range(5):
        history.visit("x", positives=1, negatives=1)
    assert history.estimate(other) == before
    # discount 1 keeps every count
    keep = EstHistory(discount=1.0)
    keep.visit("x", 1, 3)
    keep.visit("x", 1, 3)
    assert keep.counts["x"][:2] == [2.0, 6.0]


def test_estimate_starts_from_the_curated_measurement():
    history = EstHistory(prior_strength=1.0, prior_weight=1.0)
    curated = Prompt(id="c", text="9+9=", answer="18", difficulty=2 / 16, meta={"curation_k": 16})
    assert history.estimate(curated) == pytest.approx((0.5 + 2) / (1 + 16))
    state = history.state_dict()
    history.visit("c", 0, 4)
    restored = EstHistory(prior_strength=1.0, prior_weight=1.0)
    restored.load_state_dict(history.state_dict())
    assert restored.estimate(curated) == pytest.approx(history.estimate(curated))
    assert state == {"est": {}}
    with pytest.raises(ValueError, match="not an EstHistory state dict"):
        restored.load_state_dict({"beliefs": {}})


# --- the sampler -------------------------------------------------------------------------------------------
def _est(**kw) -> EstSampler:
    return make_sampler(SamplerConfig(name="est", n=4, **kw), AdvantageConfig(name="global_mean"))


def test_est_sampler_spends_the_budget_by_the_rule_and_weights_the_gradient():
    prompts = make_prompts(16, np.random.default_rng(3), curation_k=16)
    sampler = _est()
    p_hat = [sampler.history.estimate(p) for p in prompts]
    expected = est_allocation(p_hat, 16 * 4, 2, 16)
    batch = sampler.sample(prompts, BernoulliEngine(), BernoulliVerifier(), SAMPLING, np.random.default_rng(1))
    assert [len(pool.samples) for pool in batch.pools] == expected
    assert sum(expected) == 64 and len(set(expected)) > 1  # the curated priors differ, so the sizes do
    weights = est_weights(p_hat)
    for group in batch.groups:
        i = prompts.index(group.prompt)
        assert len(group.samples) == expected[i]  # the whole pool is trained on
        rewards = [s.reward for s in group.samples]
        plain = [r - sum(rewards) / len(rewards) for r in rewards]
        scale = weights[i] * 4 / expected[i]
        assert group.advantages == pytest.approx([a * scale for a in plain])
    # every visit folded into the history, which the checkpoint carries
    assert set(sampler.state_dict()["est"]) == {p.id for p in prompts}


def test_est_sampler_without_weighting_trains_like_grpo_and_drops_uniform_pools_on_request():
    prompts = make_prompts(24, np.random.default_rng(4))
    batch = _est(est_weighting="none", unresolved="drop").sample(
        prompts, BernoulliEngine(), BernoulliVerifier(), SAMPLING, np.random.default_rng(2))
    kept = {g.prompt.id for g in batch.groups}
    for pool in batch.pools:
        pos = pool.num_positive(0.7)
        assert (pool.prompt.id in kept) == (0 < pos < len(pool.samples))
    for group in batch.groups:
        rewards = [s.reward for s in group.samples]
        assert group.advantages == pytest.approx([r - sum(rewards) / len(rewards) for r in rewards])
    # no history and a flat prior: every prompt gets n, GRPO's allocation
    assert all(len(pool.samples) == 4 for pool in batch.pools)


def test_history_moves_samples_to_the_prompts_it_finds_hard():
    easy = Prompt(id="easy", text="e", answer="1", meta={"pass_rate": 0.95})
    hard = Prompt(id="hard", text="h", answer="1", meta={"pass_rate": 0.1})
    sampler = _est()
    for step in range(6):
        batch = sampler.sample([easy, hard], BernoulliEngine(), BernoulliVerifier(), SAMPLING,
                               np.random.default_rng(step))
    sizes = {pool.prompt.id: len(pool.samples) for pool in batch.pools}
    assert sizes["hard"] > sizes["easy"] and sum(sizes.values()) == 8


# --- presets and config ------------------------------------------------------------------------------------
def test_presets_name_the_papers_rows():
    est = build_config("ada-est", "tiny")
    assert isinstance(make_sampler(est.sampler, est.advantage), EstSampler)
    posterior = build_config("ada-posterior", "tiny")
    assert isinstance(make_sampler(posterior.sampler, posterior.advantage), BudgetedSampler)
    assert posterior.sampler.allocation == "posterior"
    for preset, n in (("grpo", 4), ("grpo-n8", 8), ("grpo-n16", 16)):
        cfg = build_config(preset, "tiny")
        assert cfg.sampler.name == "fixed" and cfg.sampler.n == n
        assert cfg.model_dump(exclude={"preset", "sampler"}) == build_config("grpo", "tiny").model_dump(
            exclude={"preset", "sampler"})


def test_every_preset_is_a_flow_parameter_choice():
    from ada_core.config import PRESETS
    from flows.params import TrainParams

    assert set(TrainParams.model_json_schema()["properties"]["preset"]["enum"]) == set(PRESETS)


def test_est_budget_outside_the_bounds_is_a_config_error():
    with pytest.raises(ConfigError, match=r"sampler.budget: 600 samples a step cannot be spread over "
                                          r"prompts_per_step = 32 prompts"):
        build_config("ada-est", "tiny", overrides={"sampler": {"budget": 600}})
    with pytest.raises(ConfigError, match="sampler.est_min = 5 is above sampler.est_max = 4"):
        build_config("ada-est", "tiny", overrides={"sampler": {"est_min": 5, "est_max": 4}})
    with pytest.raises(ConfigError, match="data.keep_pass_rate"):
        build_config("grpo", "tiny", overrides={"data": {"keep_pass_rate": [0.5, 0.25]}})


# --- the hard pool: curation by a pass-rate band -------------------------------------------------------------
class _Verifier(BernoulliVerifier):
    def parses(self, answers):
        return [True] * len(answers)


def test_curation_band_keeps_exactly_the_prompts_inside_it():
    prompts = make_prompts(400, np.random.default_rng(5))
    for p in prompts:
        p.prompt_ids = [1]
    band = [1 / 16, 2 / 16]
    result = curate(prompts, BernoulliEngine(), _Verifier(), SAMPLING, k=16, seed=0, band=band)
    stage = result.report["stages"][-1]
    rates = stage["pass_rates"]
    kept = {p.id for p in result.prompts}
    assert kept == {pid for pid, r in rates.items() if r in (1 / 16, 2 / 16)} and kept
    dropped = stage["dropped"]
    assert set(dropped["never_solved"]["ids"]) == {pid for pid, r in rates.items() if r == 0}
    assert set(dropped["too_hard"]["ids"]) == set()  # nothing lies between 0 and 1/16 at k = 16
    assert set(dropped["too_easy"]["ids"]) == {pid for pid, r in rates.items() if r > 2 / 16}
    assert all(math.isclose(p.difficulty, rates[p.id]) and p.meta["curation_k"] == 16 for p in result.prompts)
    # the default rule is unchanged: 0 < rate <= ceiling
    default = curate(prompts, BernoulliEngine(), _Verifier(), SAMPLING, k=16, ceiling=0.5, seed=0)
    assert {p.id for p in default.prompts} == {pid for pid, r in rates.items() if 0 < r <= 0.5}
    with pytest.raises(ValueError, match="keep_pass_rate"):
        curate(prompts, BernoulliEngine(), _Verifier(), SAMPLING, k=16, seed=0, band=[0.3, 0.2])
