"""Every generated sample is counted once in the budget, and the training reward has a reading that compares
across samplers (issue: dropped samples reached only budget/dropped_*; the per-sample mean read low for Est)."""

from __future__ import annotations

import numpy as np
import pytest

from ada_core import metrics as mk
from ada_core.config import AdvantageConfig, SamplerConfig, build_config
from ada_core.records import Prompt, PromptPool, Sample
from ada_core.sampling.rounds import finish_batch, make_group
from ada_core.sampling.step_metrics import StepClock
from ada_core.training.loop import step_metrics
from ada_core.training.state import CUMULATIVE


def _pool(pid: str, rewards: list[float], tokens: int = 5) -> PromptPool:
    prompt = Prompt(id=pid, text=f"{pid}=", answer="1")
    samples = [Sample(pid, [1] * tokens, [0.0] * tokens, "x", reward=r) for r in rewards]
    return PromptPool(prompt, samples, exit_reason="fixed", rounds=1)


def _batch(pools, extra=None):
    cfg = SamplerConfig(name="fixed", n=2)
    groups = [make_group(p, p.samples, AdvantageConfig(name="grpo"), 0.7) for p in pools]
    return finish_batch(pools, groups, StepClock(), cfg, ["fixed"], extra)


def test_dropped_samples_enter_the_generated_budget_once_and_stay_visible():
    """3 prompts trained (4 samples of 10 tokens each) and one dropped after 4 samples (40 tokens): the step
    generated 16 samples and 160 tokens, 4 and 40 of them dropped."""
    pools = [_pool(f"p{i}", [1.0, 0.0, 1.0, 0.0], tokens=10) for i in range(3)]
    batch = _batch(pools, {mk.BUDGET_DROPPED_SAMPLES: 4.0, mk.BUDGET_DROPPED_TOKENS: 40.0})
    assert batch.metrics[mk.BUDGET_GENERATED_SAMPLES] == 16
    assert batch.metrics[mk.BUDGET_GENERATED_TOKENS] == 160
    assert batch.metrics[mk.BUDGET_DROPPED_SAMPLES] == 4 and batch.metrics[mk.BUDGET_DROPPED_TOKENS] == 40
    assert batch.metrics[mk.BUDGET_TRAINED_SAMPLES] == 12  # what was trained is unchanged

    class _State:  # what the loop's step_metrics reads of a run's state
        config = build_config("ada-balance", "tiny")
        totals = {k: 0.0 for k in CUMULATIVE.values()}
        elapsed_s = 0.0

    state = _State()
    first = step_metrics(state, batch, {}, 1.0)
    second = step_metrics(state, _batch([_pool("q", [1.0, 0.0], tokens=10)]), {}, 1.0)
    assert first[mk.BUDGET_GENERATED_SAMPLES_CUM] == 16 and first[mk.BUDGET_GENERATED_TOKENS_CUM] == 160
    assert second[mk.BUDGET_GENERATED_SAMPLES_CUM] == 18 and second[mk.BUDGET_GENERATED_TOKENS_CUM] == 180


def test_a_step_without_drops_counts_its_pools_alone():
    batch = _batch([_pool("a", [1.0, 0.0]), _pool("b", [0.0, 0.0])])
    assert batch.metrics[mk.BUDGET_GENERATED_SAMPLES] == 4 and batch.metrics[mk.BUDGET_GENERATED_TOKENS] == 20


def test_the_per_prompt_reward_mean_weighs_every_prompt_alike():
    """An Est-like step: 2 samples on an easy prompt (1 of 2 right), 6 on a hard one (none right). Per sample the
    reward is 1/8; per prompt it is (1/2 + 0) / 2 = 1/4, what a uniform sampler's mean estimates."""
    batch = _batch([_pool("easy", [1.0, 0.0]), _pool("hard", [0.0] * 6)])
    assert batch.metrics[mk.REWARD_MEAN] == pytest.approx(1 / 8)
    assert batch.metrics[mk.REWARD_PROMPT_MEAN] == pytest.approx(1 / 4)


def test_est_and_grpo_on_the_same_policy_agree_per_prompt_not_per_sample():
    """The same Bernoulli policy, sampled by GRPO n = 8 and by Est (more samples on the prompts it measured
    hard): the per-sample means differ, the per-prompt means estimate the same thing."""
    from ada_core.sampling import make_sampler
    from ada_core.sampling.simulate import BernoulliEngine, BernoulliVerifier, make_prompts
    from ada_core.protocols import SamplingParams

    prompts = make_prompts(400, np.random.default_rng(0), curation_k=16)
    reads = {}
    for name, n in (("fixed", 8), ("est", 8)):
        sampler = make_sampler(SamplerConfig(name=name, n=n), AdvantageConfig(name="global_mean"))
        batch = sampler.sample(prompts, BernoulliEngine(), BernoulliVerifier(), SamplingParams(max_tokens=14),
                               np.random.default_rng(1))
        reads[name] = (batch.metrics[mk.REWARD_MEAN], batch.metrics[mk.REWARD_PROMPT_MEAN])
    truth = float(np.mean([p.meta["pass_rate"] for p in prompts]))
    assert reads["est"][0] < reads["fixed"][0] - 0.02  # per sample, Est reads low: its samples sit on hard prompts
    for name in reads:
        assert reads[name][1] == pytest.approx(truth, abs=0.03)
