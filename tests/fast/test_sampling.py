"""Samplers: exit rules on scripted outcomes, downsampling, the global cap, DAPO's fallback, metrics,
bad input, reproducibility, and property tests over random configs.

Outcomes come from the simulation's Bernoulli engine (pass rates 0, 1 or a seeded draw) or, where a
test needs an exact sequence, from `ScriptedEngine`: the same RolloutEngine interface, replaying a
fixed string of outcomes per prompt. The verifier is the simulation's real one.
"""

import logging
import math
from dataclasses import dataclass, field

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ada_core import metrics as mk
from ada_core.config import AdvantageConfig, SamplerConfig
from ada_core.data import PromptSource
from ada_core.protocols import RolloutEngine, SamplingParams, Verdict
from ada_core.records import Prompt, Sample
from ada_core.sampling import (
    AdaSampler,
    DynamicFilterSampler,
    FixedSampler,
    allocate_round,
    downsample_balanced,
    make_sampler,
)
from ada_core.sampling.simulate import BernoulliEngine, BernoulliVerifier

GLOBAL_MEAN, GRPO = AdvantageConfig(name="global_mean"), AdvantageConfig(name="grpo")
SAMPLING = SamplingParams(max_tokens=14)


@dataclass
class ScriptedEngine(RolloutEngine):
    """Replays `scripts[prompt_id]` ("1" correct, "0" wrong, "x" unparseable) in order; logs each call."""

    scripts: dict[str, str]
    calls: list[list[tuple[str, int]]] = field(default_factory=list)
    position: dict[str, int] = field(default_factory=dict)

    def generate(self, requests, sampling):
        self.calls.append([(p.id, k) for p, k in requests])
        out = []
        for prompt, k in requests:
            start = self.position.get(prompt.id, 0)
            chunk = self.scripts[prompt.id][start : start + k]
            assert len(chunk) == k, f"script of {prompt.id} ran out"
            self.position[prompt.id] = start + k
            out.append([Sample(prompt.id, [7] * (i % 3 + 1), [-0.5] * (i % 3 + 1), c) for i, c in enumerate(chunk)])
        return out


def prompts_with(*rates: float) -> list[Prompt]:
    return [Prompt(id=f"p{i}", text="q", answer="1", meta={"pass_rate": r}) for i, r in enumerate(rates)]


def scripted(**scripts: str) -> tuple[list[Prompt], ScriptedEngine]:
    return [Prompt(id=k, text="q", answer="1") for k in scripts], ScriptedEngine(dict(scripts))


def ada(**kw) -> AdaSampler:
    return AdaSampler(SamplerConfig(name="ada", **kw), GLOBAL_MEAN)


def run(sampler, prompts, engine, seed=0, source=None):
    return sampler.sample(prompts, engine, BernoulliVerifier(), SAMPLING, np.random.default_rng(seed), source=source)


def by_id(batch):
    return {g.prompt.id: g for g in batch.groups}


# --- fixed (GRPO) ---------------------------------------------------------------------------------
def test_fixed_draws_n_per_prompt_in_one_call():
    prompts, engine = scripted(a="1000", b="1111", c="0000")
    batch = run(FixedSampler(SamplerConfig(n=4), GRPO), prompts, engine)
    assert engine.calls == [[("a", 4), ("b", 4), ("c", 4)]]
    groups = by_id(batch)
    assert groups["a"].advantages == pytest.approx([1.5, -0.5, -0.5, -0.5], rel=1e-5)
    assert groups["b"].is_uniform and groups["c"].is_uniform
    m = batch.metrics
    assert m[mk.SAMPLER_EFFECTIVE_RATIO] == pytest.approx(1 / 3)
    assert m[mk.SAMPLER_ALL_CORRECT_FRAC] == pytest.approx(1 / 3)
    assert m[mk.SAMPLER_ALL_WRONG_FRAC] == pytest.approx(1 / 3)
    assert m[mk.exit_reason_key("fixed")] == 3.0
    assert m[mk.BUDGET_GENERATED_SAMPLES] == m[mk.BUDGET_TRAINED_SAMPLES] == 12.0


# --- ada: exit rules fire at the END of a round ---------------------------------------------------
def test_pos_exits_at_end_of_round_with_the_whole_round_in_p_hat():
    prompts, engine = scripted(
        easy="10000000",  # a positive first: still draws the whole round
        late="00000000" + "00000001",
        never="0" * 32,
    )
    batch = run(ada(exit_rule="pos", n=4, M=8, N=4), prompts, engine)
    assert [len(c) for c in engine.calls] == [3, 2, 1, 1]  # one engine call per round
    groups = by_id(batch)
    assert (groups["easy"].pool_size, groups["easy"].p_hat, groups["easy"].exit_reason) == (8, 1 / 8, "pos")
    assert (groups["late"].pool_size, groups["late"].exit_reason) == (16, "pos")
    assert (groups["never"].pool_size, groups["never"].exit_reason) == (32, "unresolved")
    assert groups["never"].is_uniform  # kept (reference code), zero advantage
    # balanced downsampling keeps the lone positive; advantage is r - p_hat over the pool of 8
    assert sorted(groups["easy"].advantages) == pytest.approx([-0.125] * 3 + [0.875])
    m = batch.metrics
    assert [m[mk.active_prompts_key(r)] for r in range(4)] == [3.0, 2.0, 1.0, 1.0]
    assert (m[mk.exit_reason_key("pos")], m[mk.exit_reason_key("unresolved")]) == (2.0, 1.0)
    assert (m[mk.SAMPLER_UNRESOLVED_NO_POS], m[mk.SAMPLER_UNRESOLVED_NO_NEG]) == (1.0, 0.0)
    assert m[mk.SAMPLER_SAMPLES_PER_PROMPT_MAX] == 32.0
    assert m[mk.SAMPLER_EFFECTIVE_RATIO] == pytest.approx(2 / 3)


def test_balance_needs_both_classes():
    prompts, engine = scripted(
        mixed="11000000",  # 2 positives and 6 negatives: done after round 1
        easy="11111111" + "11111100",  # the second negative comes in round 2
        solved="1" * 32,
    )
    batch = run(ada(exit_rule="balance", n=4, M=8, N=4), prompts, engine)
    groups = by_id(batch)
    assert (groups["mixed"].exit_reason, groups["mixed"].pool_size) == ("balance", 8)
    assert (groups["easy"].exit_reason, groups["easy"].pool_size) == ("balance", 16)
    assert groups["solved"].exit_reason == "unresolved"
    for name in ("mixed", "easy"):
        assert sorted(s.text for s in groups[name].samples) == ["0", "0", "1", "1"]
    assert groups["mixed"].advantages.count(0.75) == 2 and groups["mixed"].advantages.count(-0.25) == 2
    m = batch.metrics
    assert (m[mk.SAMPLER_UNRESOLVED_NO_POS], m[mk.SAMPLER_UNRESOLVED_NO_NEG]) == (0.0, 1.0)


def test_unresolved_drop_policy_drops():
    prompts, engine = scripted(mixed="10101010", never="0" * 16)
    batch = run(ada(exit_rule="balance", n=4, M=8, N=2, unresolved="drop"), prompts, engine)
    assert list(by_id(batch)) == ["mixed"]
    assert batch.metrics[mk.SAMPLER_GROUPS_KEPT] == 1.0
    assert batch.metrics[mk.SAMPLER_UNRESOLVED] == 1.0


def test_pos_waits_until_the_pool_can_fill_a_group():
    # M0 = M = 1 < n: a positive in round 1 is not enough, the pool needs n samples first.
    prompts, engine = scripted(a="1000")
    batch = run(ada(exit_rule="pos", n=4, M=1, N=4), prompts, engine)
    assert [c[0][1] for c in engine.calls] == [1, 1, 1, 1]
    assert (batch.groups[0].exit_reason, batch.groups[0].pool_size) == ("pos", 4)


def test_first_round_size_m0():
    prompts, engine = scripted(a="1100" + "0" * 8)
    run(ada(exit_rule="balance", n=4, M=8, M0=4, N=2), prompts, engine)
    assert engine.calls == [[("a", 4)]]


# --- the global cap -------------------------------------------------------------------------------
def test_allocate_round_worked_example():
    assert allocate_round(8, [8, 0, 8], 10) == [3, 4, 3]
    assert allocate_round(8, [8, 0, 8], None) == [8, 8, 8]
    assert allocate_round(8, [8, 0, 8], 100) == [8, 8, 8]
    assert allocate_round(8, [8, 8], 0) == [0, 0]


def test_cap_below_one_sample_per_prompt_stops_and_drops_short_pools():
    batch = run(ada(exit_rule="pos", n=4, M=8, N=4, global_sample_cap=5), prompts_with(*[0.5] * 8), BernoulliEngine())
    assert batch.metrics[mk.BUDGET_GENERATED_SAMPLES] == 5.0
    assert batch.groups == []  # no pool reached n samples: nothing can be trained
    assert batch.metrics[mk.SAMPLER_UNRESOLVED] == 8.0


def test_cap_shrinks_a_round_fairly():
    prompts, engine = scripted(a="0" * 12, b="0" * 12, c="0" * 12)
    batch = run(ada(exit_rule="pos", n=4, M=4, N=3, global_sample_cap=20), prompts, engine)
    assert engine.calls == [[("a", 4), ("b", 4), ("c", 4)], [("a", 3), ("b", 3), ("c", 2)]]
    assert batch.metrics[mk.BUDGET_GENERATED_SAMPLES] == 20.0


# --- downsampling ---------------------------------------------------------------------------------
def _pool(pos: int, neg: int) -> list[Sample]:
    return [Sample("p", [1], [0.0], "1", reward=1.0) for _ in range(pos)] + [
        Sample("p", [1], [0.0], "0", reward=0.0) for _ in range(neg)
    ]


@settings(max_examples=80, deadline=None)
@given(st.integers(0, 12), st.integers(0, 12), st.integers(2, 8), st.integers(0, 2**32 - 1))
def test_downsample_balanced_targets_half_and_fills_shortfall(pos, neg, n, seed):
    if pos + neg < n:
        return
    group = downsample_balanced(_pool(pos, neg), n, 0.7, np.random.default_rng(seed))
    got_pos = sum(s.reward == 1.0 for s in group)
    assert len(group) == n and len({id(s) for s in group}) == n
    assert got_pos == min(pos, max(n // 2, n - neg))
    if pos >= 1 and neg >= 1:
        assert 0 < got_pos < n  # both classes whenever the pool has both


def test_downsample_is_a_random_draw_not_first_k():
    pool = _pool(2, 30)
    picks = {tuple(id(s) for s in downsample_balanced(pool, 4, 0.7, np.random.default_rng(k))) for k in range(20)}
    assert len(picks) > 1


# --- DAPO -----------------------------------------------------------------------------------------
def test_dapo_draws_extra_batches_until_b_are_kept():
    first = [Prompt(id=f"u{i}", text="q", answer="1") for i in range(4)]
    extra = [Prompt(id=f"v{i}", text="q", answer="1") for i in range(6)]
    engine = ScriptedEngine({**{p.id: "1111" for p in first}, **{p.id: "1010" for p in extra}})
    cfg = SamplerConfig(name="dynamic_filter", n=4, gen_batch_multiplier=1.5, max_gen_batches=3)
    batch = run(DynamicFilterSampler(cfg, GRPO), first, engine, source=PromptSource(extra, shuffle=False))
    assert [len(c) for c in engine.calls] == [4, 6]  # second batch: ceil(4 * 1.5)
    assert [g.prompt.id for g in batch.groups] == ["v0", "v1", "v2", "v3"]
    m = batch.metrics
    assert (m[mk.SAMPLER_FELL_BACK], m[mk.SAMPLER_GEN_BATCHES], m[mk.SAMPLER_PROMPTS_DRAWN]) == (0.0, 2.0, 10.0)
    assert m[mk.SAMPLER_EFFECTIVE_RATIO] == pytest.approx(4 / 10)
    assert (m[mk.exit_reason_key("varied")], m[mk.exit_reason_key("uniform")]) == (6.0, 4.0)


def test_dapo_falls_back_at_the_cap_instead_of_raising(caplog):
    prompts = prompts_with(1.0, 1.0, 0.0, 0.0)
    cfg = SamplerConfig(name="dynamic_filter", n=4, max_gen_batches=2)
    with caplog.at_level(logging.WARNING, logger="ada_core.sampling"):
        batch = run(DynamicFilterSampler(cfg, GRPO), prompts, BernoulliEngine(), source=PromptSource(prompts))
    assert batch.groups == []  # a valid outcome: the trainer skips the step
    assert batch.metrics[mk.SAMPLER_FELL_BACK] == 1.0
    assert batch.metrics[mk.SAMPLER_GEN_BATCHES] == 2.0
    assert "kept 0 of 4 groups" in caplog.text


def test_dapo_needs_a_source_for_extra_batches():
    cfg = SamplerConfig(name="dynamic_filter", n=4, max_gen_batches=2)
    with pytest.raises(ValueError, match="needs a PromptSource"):
        run(DynamicFilterSampler(cfg, GRPO), prompts_with(0.5), BernoulliEngine())


# --- metrics --------------------------------------------------------------------------------------
def test_metrics_of_a_scripted_step():
    prompts, engine = scripted(a="1x00" + "1111", b="1100")
    batch = run(ada(exit_rule="balance", n=4, M=4, N=2), prompts, engine)
    m = batch.metrics
    assert all(type(v) is float and mk.is_valid_key(k) for k, v in m.items())
    assert m[mk.REWARD_MEAN] == pytest.approx(3 / 8)  # round 1 only: "1x00" and "1100"
    assert (m[mk.verifier_status_key("ok")], m[mk.verifier_status_key("parse_error")]) == (11.0, 1.0)
    assert m[mk.verifier_status_key("timeout")] == 0.0
    assert m[mk.BUDGET_GENERATED_SAMPLES] == 12.0 and m[mk.BUDGET_TRAINED_SAMPLES] == 8.0
    token_lengths = [i % 3 + 1 for i in range(4)]  # the scripted engine's lengths per call
    assert m[mk.BUDGET_GENERATED_TOKENS] == 3 * sum(token_lengths)
    assert m[mk.BUDGET_TRAINED_TOKENS] == sum(s.num_tokens for s in batch.samples)
    assert m[mk.REWARD_TRAINED_MEAN] == pytest.approx(0.5)  # two balanced groups
    assert m[mk.SAMPLER_SAMPLES_PER_PROMPT_MEAN] == 6.0 and m[mk.SAMPLER_P_HAT_MEAN] == pytest.approx((5 / 8 + 0.5) / 2)
    assert m[mk.SAMPLER_ROUNDS] == 2.0
    for key in (mk.TIME_GENERATE_S, mk.TIME_REWARD_S, mk.SAMPLER_TIME_S):
        assert m[key] >= 0.0


# --- bad input ------------------------------------------------------------------------------------
class ShortEngine(ScriptedEngine):
    def generate(self, requests, sampling):
        out = super().generate(requests, sampling)
        out[-1] = out[-1][:-1]
        return out


@dataclass
class FixedVerdicts:
    """Returns the given rewards (or a wrong count) instead of reading the text."""

    rewards: list

    def verify(self, items):
        return [Verdict(r) for r in self.rewards]


def test_engine_returning_too_few_samples_names_the_prompt():
    prompts, _ = scripted(a="1111", b="1111")
    engine = ShortEngine({"a": "1111", "b": "1111"})
    with pytest.raises(ValueError, match="engine returned 3 samples for prompt 'b', expected 4"):
        run(FixedSampler(SamplerConfig(n=4), GRPO), prompts, engine)


@pytest.mark.parametrize(
    "rewards, match",
    [
        ([1.0, 0.0, 1.0], "verifier returned 3 verdicts for 4 completions"),
        ([1.0, float("nan"), 0.0, 0.0], "prompt 'a' a non-finite reward nan"),
        ([1.0, 0.0, float("inf"), 0.0], "prompt 'a' a non-finite reward inf"),
        ([1.0, "yes", 0.0, 0.0], "prompt 'a' a non-numeric reward 'yes'"),
    ],
)
def test_bad_verifier_output_raises_clearly(rewards, match):
    prompts, engine = scripted(a="1100")
    sampler = FixedSampler(SamplerConfig(n=4), GRPO)
    with pytest.raises(ValueError, match=match):
        sampler.sample(prompts, engine, FixedVerdicts(rewards), SAMPLING, np.random.default_rng(0))


def test_integer_and_numpy_rewards_are_accepted():
    prompts, engine = scripted(a="1100")
    sampler = FixedSampler(SamplerConfig(n=4), GRPO)
    batch = sampler.sample(prompts, engine, FixedVerdicts([1, np.float32(0), True, 0]), SAMPLING, np.random.default_rng(0))
    assert [s.reward for s in batch.samples] == [1.0, 0.0, 1.0, 0.0]


def test_no_prompts_or_duplicates_are_rejected():
    with pytest.raises(ValueError, match="no prompts"):
        run(FixedSampler(SamplerConfig(n=4), GRPO), [], BernoulliEngine())
    with pytest.raises(ValueError, match="duplicate prompt ids \\['p0'\\]"):
        run(FixedSampler(SamplerConfig(n=4), GRPO), prompts_with(0.5) * 2, BernoulliEngine())


# --- reproducibility and the registry -------------------------------------------------------------
def _fingerprint(batch):
    metrics = {k: v for k, v in batch.metrics.items() if not k.startswith("time/") and k != mk.SAMPLER_TIME_S}
    samples = [(s.prompt_id, s.text, s.reward, s.round, tuple(s.completion_ids)) for s in batch.samples]
    return samples, [g.advantages for g in batch.groups], metrics


def test_same_rng_seed_gives_identical_batch():
    prompts = prompts_with(*np.random.default_rng(1).random(40))
    sampler = ada(exit_rule="balance", n=4, M=4, N=4)
    first, again = run(sampler, prompts, BernoulliEngine(), seed=7), run(sampler, prompts, BernoulliEngine(), seed=7)
    assert _fingerprint(first) == _fingerprint(again)
    assert _fingerprint(run(sampler, prompts, BernoulliEngine(), seed=8)) != _fingerprint(first)


def test_make_sampler_picks_by_name():
    for name, cls in [("fixed", FixedSampler), ("dynamic_filter", DynamicFilterSampler), ("ada", AdaSampler)]:
        assert isinstance(make_sampler(SamplerConfig(name=name), GRPO), cls)


# --- properties over random configs ---------------------------------------------------------------
ada_configs = st.builds(
    dict,
    n=st.integers(2, 6),
    M=st.integers(1, 8),
    N=st.integers(1, 4),
    M0=st.none() | st.integers(1, 8),
    global_sample_cap=st.none() | st.integers(1, 150),
    exit_rule=st.sampled_from(["pos", "balance"]),
    unresolved=st.sampled_from(["keep", "drop"]),
    downsample=st.sampled_from(["balanced", "random"]),
).filter(lambda c: (c["M0"] or c["M"]) + (c["N"] - 1) * c["M"] >= c["n"]
          and (c["global_sample_cap"] is None or c["global_sample_cap"] >= c["n"]))  # a cap below n is refused
pass_rates = st.lists(st.sampled_from([0.0, 1.0]) | st.floats(0.0, 1.0), min_size=1, max_size=12)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(ada_configs, pass_rates, st.integers(0, 2**32 - 1))
def test_ada_invariants(kw, rates, seed):
    cfg = SamplerConfig(name="ada", **kw)
    batch = run(AdaSampler(cfg, GLOBAL_MEAN), prompts_with(*rates), BernoulliEngine(), seed=seed)
    m, n = batch.metrics, cfg.n
    assert m[mk.SAMPLER_SAMPLES_PER_PROMPT_MAX] <= cfg.max_samples_per_prompt
    if cfg.global_sample_cap is not None:
        assert m[mk.BUDGET_GENERATED_SAMPLES] <= cfg.global_sample_cap
    need_pos, need_neg = (1, 0) if cfg.exit_rule == "pos" else (n // 2, n - n // 2)
    for g in batch.groups:
        assert len(g.samples) == n and len(g.advantages) == n
        assert {s.prompt_id for s in g.samples} == {g.prompt.id}
        assert n <= g.pool_size <= cfg.max_samples_per_prompt
        assert g.p_hat == pytest.approx(g.pool_positives / g.pool_size)
        if g.exit_reason == cfg.exit_rule:
            assert g.pool_positives >= need_pos and g.pool_size - g.pool_positives >= need_neg
        else:
            assert g.exit_reason == "unresolved" and cfg.unresolved == "keep"
        group_pos = sum(s.reward > 0.7 for s in g.samples)
        if cfg.downsample == "balanced":
            assert group_pos == min(g.pool_positives, max(n // 2, n - (g.pool_size - g.pool_positives)))
        assert g.advantages == pytest.approx([s.reward - g.p_hat for s in g.samples])
    assert m[mk.SAMPLER_GROUPS_KEPT] == len(batch.groups) <= len(rates)
    assert all(type(v) is float and not math.isnan(v) for v in m.values())


@pytest.mark.parametrize("method", ["ada-posterior", "ada-balance-m4", "ada-est", "dapo"])
def test_a_batch_survives_a_checkpoint_exactly(method):
    """rollout.async_steps: a checkpoint holds the batches drawn ahead of it as JSON (records.batch_to_dict);
    read back, each is the batch drawn, every float as drawn, and a sample a group shares with its pool
    is still one object."""
    import json

    from support import simulated_run

    from ada_core.records import batch_from_dict, batch_to_dict

    for batch in simulated_run([], steps=2, method=method):
        back = batch_from_dict(json.loads(json.dumps(batch_to_dict(batch))))
        assert back == batch
        pooled = {id(s) for p in back.pools for s in p.samples}
        assert all(id(s) in pooled for g in back.groups for s in g.samples)
        prompts = {p.prompt.id: p.prompt for p in back.pools}
        assert all(g.prompt is prompts[g.prompt.id] for g in back.groups)
