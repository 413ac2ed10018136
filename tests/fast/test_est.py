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
from ada_core.sampling.allocation import EST_P_FLOOR, EstHistory, est_allocation, est_weights
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


def test_weights_are_v3s_from_the_steps_own_pass_rate_unnormalised():
    assert est_weights([0.25, 1.0], eps=0.0) == pytest.approx([2.0, 1.0])
    assert est_weights([0.0, 0.5], eps=1e-6) == pytest.approx([1 / math.sqrt(1e-6), 1 / math.sqrt(0.5 + 1e-6)])


# --- the estimate: an EMA of the prompt's history, started from its curation measurement ---------------------
def test_estimate_is_an_ema_started_from_the_curation_rate():
    history = EstHistory(ema=0.9, prior=(1.0, 16.0))
    curated = Prompt(id="c", text="9+9=", answer="18", difficulty=4 / 16, meta={"curation_k": 16})
    plain = Prompt(id="x", text="1+1=", answer="2")
    assert history.estimate(curated) == pytest.approx(0.25)
    assert history.estimate(plain) == pytest.approx(1 / 17)  # the prior's mean: no measurement
    history.visit(curated, positives=6, samples=8)
    assert history.estimate(curated) == pytest.approx(0.9 * 0.25 + 0.1 * 0.75)
    history.visit(curated, positives=0, samples=8)
    assert history.estimate(curated) == pytest.approx(0.9 * 0.3)
    assert history.rates["c"][1] == 2
    # a prompt that is not visited keeps its estimate however many steps pass
    before = history.estimate(plain)
    for _ in range(5):
        history.visit(curated, 1, 2)
    assert history.estimate(plain) == before
    # ema 0: the last visit alone; an estimate that reaches 0 is floored for the allocation
    last = EstHistory(ema=0.0)
    last.visit(plain, 0, 4)
    assert last.estimate(plain) == EST_P_FLOOR


def test_history_state_round_trips_and_refuses_the_earlier_format():
    history = EstHistory()
    curated = Prompt(id="c", text="9+9=", answer="18", difficulty=2 / 16, meta={"curation_k": 16})
    assert history.state_dict() == {"est_ema": {}}
    history.visit(curated, 0, 4)
    restored = EstHistory()
    restored.load_state_dict(history.state_dict())
    assert restored.estimate(curated) == pytest.approx(history.estimate(curated))
    with pytest.raises(ValueError, match="not an EstHistory state dict"):
        restored.load_state_dict({"beliefs": {}})
    with pytest.raises(ValueError, match="a checkpoint of the earlier `est`"):
        restored.load_state_dict({"est": {"c": [1.0, 2.0, 1]}})


# --- the sampler -------------------------------------------------------------------------------------------
def _est(n: int = 8, **kw) -> EstSampler:
    return make_sampler(SamplerConfig(name="est", n=n, **kw), AdvantageConfig(name="global_mean"))


def test_est_sampler_spends_the_budget_by_the_rule_and_weights_each_prompt_by_its_step():
    prompts = make_prompts(16, np.random.default_rng(3), curation_k=16)
    sampler = _est()
    p_hat = [sampler.history.estimate(p) for p in prompts]
    expected = est_allocation(p_hat, 16 * 8, 2, 32)
    batch = sampler.sample(prompts, BernoulliEngine(), BernoulliVerifier(), SAMPLING, np.random.default_rng(1))
    assert [len(pool.samples) for pool in batch.pools] == expected
    assert sum(expected) == 128 and len(set(expected)) > 1  # the curated starts differ, so the sizes do
    for group in batch.groups:
        i = prompts.index(group.prompt)
        assert len(group.samples) == expected[i]  # every sample is trained on
        rewards = [s.reward for s in group.samples]
        rate = sum(r > 0.7 for r in rewards) / len(rewards)
        plain = [r - sum(rewards) / len(rewards) for r in rewards]
        assert group.advantages == pytest.approx([a / math.sqrt(rate + 1e-6) for a in plain])
    # every visit moved its prompt's EMA, which the checkpoint carries
    state = sampler.state_dict()["est_ema"]
    assert set(state) == {p.id for p in prompts}
    for pool, before in zip(batch.pools, p_hat):
        rate = pool.num_positive(0.7) / len(pool.samples)
        assert state[pool.prompt.id][0] == pytest.approx(0.9 * max(before, 0.0) + 0.1 * rate, abs=1e-3)


def test_est_sampler_without_weighting_trains_like_grpo_and_drops_uniform_pools_on_request():
    prompts = make_prompts(24, np.random.default_rng(4))
    batch = _est(n=4, est_weighting="none", unresolved="drop").sample(
        prompts, BernoulliEngine(), BernoulliVerifier(), SAMPLING, np.random.default_rng(2))
    kept = {g.prompt.id for g in batch.groups}
    for pool in batch.pools:
        pos = pool.num_positive(0.7)
        assert (pool.prompt.id in kept) == (0 < pos < len(pool.samples))
    for group in batch.groups:
        rewards = [s.reward for s in group.samples]
        assert group.advantages == pytest.approx([r - sum(rewards) / len(rewards) for r in rewards])
    # no measurement: every prompt starts from the prior's mean, so each gets n, GRPO's allocation
    assert all(len(pool.samples) == 4 for pool in batch.pools)


def test_history_moves_samples_to_the_prompts_it_finds_hard():
    easy = Prompt(id="easy", text="e", answer="1", meta={"pass_rate": 0.95})
    hard = Prompt(id="hard", text="h", answer="1", meta={"pass_rate": 0.1})
    sampler = _est(n=4, est_ema=0.5)
    for step in range(6):
        batch = sampler.sample([easy, hard], BernoulliEngine(), BernoulliVerifier(), SAMPLING,
                               np.random.default_rng(step))
    sizes = {pool.prompt.id: len(pool.samples) for pool in batch.pools}
    assert sizes["hard"] > sizes["easy"] and sum(sizes.values()) == 8


# --- presets and config ------------------------------------------------------------------------------------
def test_presets_name_the_papers_rows():
    est = build_config("ada-est", "tiny")
    assert isinstance(make_sampler(est.sampler, est.advantage), EstSampler)
    assert est.sampler.n == 8  # v3: Est at about 8 samples a prompt, compared with GRPO n = 8
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
    with pytest.raises(ConfigError, match=r"sampler.budget: 1100 samples a step cannot be spread over "
                                          r"prompts_per_step = 32 prompts"):
        build_config("ada-est", "tiny", overrides={"sampler": {"budget": 1100}})
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
