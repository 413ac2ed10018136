"""Samplers: how a step's groups are drawn. Read this file top to bottom to learn Reinforce-Ada.

A step takes B prompts and hands the update engine one `Group` of exactly n scored samples per kept
prompt. A prompt whose n rewards are all equal gets zero advantage and teaches nothing, and at the
start (hard prompts) and end (easy prompts) of training most groups are like that. Five samplers,
chosen by `SamplerConfig.name`, answer this differently:

- `fixed` (GRPO): one engine call, n samples per prompt; keep every group.
- `dynamic_filter` (DAPO): keep only groups whose rewards vary, drawing whole extra batches of prompts
  until B are kept or `max_gen_batches` is reached.
- `ada` (Reinforce-Ada): successive elimination, spending samples where the signal is missing:

      active = all B prompts
      for round in 0 .. N-1:                      (stop early if nobody is active or the cap is spent)
          ONE engine call: M samples (M0 in round 0) for every active prompt; score them
          at the END of the round, a prompt leaves `active` once its pool meets the exit rule
              pos:     >= 1 positive                      balance: >= n//2 positives and >= n - n//2 negatives
      prompts still active are unresolved: `keep` them (reference code) or `drop` them (paper)
      group = downsample(pool, n); advantages = estimator(group rewards, WHOLE pool rewards)

- `est` (Reinforce-Ada-Est, the paper's v3): each prompt's pass rate p_hat an EMA of its history,
  N_x proportional to 1/sqrt(p_hat) samples, clipped and scaled to the step's budget, in one engine
  call; every sample trained, each prompt's advantages weighted by 1/sqrt(its pass rate this step).
  `EstSampler` below and `est_allocation` in ada_core/sampling/allocation.py.
- `budgeted` (ours, beyond the paper): GRPO's B x n samples a step (or `sampler.budget`), spent by a
  history-informed allocation policy; `BudgetedSampler` below and ada_core/sampling/allocation.py.

Every sampler is built from the round primitives of rounds.py: it draws through `draw_and_score`
(one engine call plus the verifier, with the input checks), builds groups with `make_group` and
reports `step_metrics` (step_metrics.py) through `finish_batch`. The rng passed to `sample` seeds
every engine call and every downsampling draw, so a step is reproducible given its rng.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field

import numpy as np

from ada_core import metrics as mk
from ada_core.config import AdvantageConfig, SamplerConfig
from ada_core.config.registry import get_sampler, register_sampler
from ada_core.data.source import PromptSource
from ada_core.protocols import RolloutEngine, Sampler, SamplingParams, Verifier
from ada_core.records import Group, Prompt, PromptPool, RolloutBatch
from ada_core.sampling.allocation import (EstHistory, PromptHistory, est_allocation, est_weights, greedy_allocation,
                                         mixed_prob, select_prompts, step_budget)
from ada_core.sampling.rounds import (DOWNSAMPLERS, allocate_round, check_prompts, draw_and_score, finish_batch, has_exited,
                                     make_group)
from ada_core.sampling.step_metrics import StepClock
from ada_core.sampling.stream_session import StreamSession, run_streaming


log = logging.getLogger(__name__)


class _NoState:
    """Samplers that keep nothing between steps: their checkpoint entry is None."""

    def state_dict(self) -> dict | None:
        return None

    def load_state_dict(self, state: dict | None) -> None:
        pass

    def close(self) -> None:
        pass


class _KeepsHistory:
    """Samplers that remember every prompt across steps in `self.history`: their checkpoint entry is it."""

    history: PromptHistory | EstHistory

    def state_dict(self) -> dict:
        return self.history.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.history.load_state_dict(state)

    def close(self) -> None:
        pass


# ---------------------------------------------------------------------------------------------------
# The samplers. Each returns a RolloutBatch of kept groups plus the step's metrics.
# ---------------------------------------------------------------------------------------------------
@register_sampler("fixed", presets={})  # its presets: ada_core/config/presets.py
@dataclass
class FixedSampler(_NoState):
    """GRPO: n samples per prompt in one engine call; every group is kept."""

    cfg: SamplerConfig
    advantage: AdvantageConfig

    def sample(
        self,
        prompts: list[Prompt],
        engine: RolloutEngine,
        verifier: Verifier,
        sampling: SamplingParams,
        rng: np.random.Generator,
        source: PromptSource | None = None,
    ) -> RolloutBatch:
        clock = StepClock()
        check_prompts(prompts)
        pools = [PromptPool(p, exit_reason="fixed", rounds=1) for p in prompts]
        clock.active_per_round.append(len(pools))
        drawn = draw_and_score([(p, self.cfg.n) for p in prompts], 0, engine, verifier, sampling, rng, clock)
        for pool, samples in zip(pools, drawn):
            pool.samples.extend(samples)
        groups = [make_group(pool, pool.samples, self.advantage, self.cfg.positive_threshold) for pool in pools]
        return finish_batch(pools, groups, clock, self.cfg, ["fixed"])


@register_sampler("dynamic_filter", presets={})  # its presets: ada_core/config/presets.py
@dataclass
class DynamicFilterSampler(_NoState):
    """DAPO dynamic sampling: keep varied groups, drawing extra prompt batches until B are kept.

    Batch 0 is the given prompts; each later batch takes ceil(B * gen_batch_multiplier) prompts from
    `source`. After `max_gen_batches` it falls back to the groups kept so far (metric
    sampler/fell_back = 1 and a warning) instead of raising. If no group varied at all, the batch
    has no groups: a valid outcome the trainer must skip.
    """

    cfg: SamplerConfig
    advantage: AdvantageConfig

    def sample(
        self,
        prompts: list[Prompt],
        engine: RolloutEngine,
        verifier: Verifier,
        sampling: SamplingParams,
        rng: np.random.Generator,
        source: PromptSource | None = None,
    ) -> RolloutBatch:
        clock = StepClock()
        check_prompts(prompts)
        if source is None and self.cfg.max_gen_batches > 1:
            raise ValueError("sampler.name=dynamic_filter needs a PromptSource (`source=`) to draw extra batches")
        target, batch = len(prompts), list(prompts)
        pools: list[PromptPool] = []
        groups: list[Group] = []
        for b in range(self.cfg.max_gen_batches):
            if b > 0:
                batch = source.take(math.ceil(target * self.cfg.gen_batch_multiplier))  # type: ignore[union-attr]
            clock.active_per_round.append(len(batch))
            drawn = draw_and_score([(p, self.cfg.n) for p in batch], b, engine, verifier, sampling, rng, clock)
            for prompt, samples in zip(batch, drawn):
                pool = PromptPool(prompt, samples=samples, rounds=1)
                varied = float(np.std(pool.rewards())) > self.cfg.std_eps
                pool.exit_reason = "varied" if varied else "uniform"
                pools.append(pool)
                if varied and len(groups) < target:
                    groups.append(make_group(pool, samples, self.advantage, self.cfg.positive_threshold))
            if len(groups) >= target:
                break
        fell_back = len(groups) < target
        if fell_back:
            log.warning(
                "dynamic_filter: kept %d of %d groups after max_gen_batches=%d; training on what was kept%s",
                len(groups), target, self.cfg.max_gen_batches, " (none: the trainer skips this step)" if not groups else "",
            )
        extra = {mk.SAMPLER_FELL_BACK: float(fell_back), mk.SAMPLER_GEN_BATCHES: float(len(clock.active_per_round))}
        return finish_batch(pools, groups, clock, self.cfg, ["varied", "uniform"], extra)


@register_sampler("ada", presets={})  # its presets: ada_core/config/presets.py
@dataclass
class AdaSampler:
    """Reinforce-Ada successive elimination (see the module docstring). Under `sampler.carry_over` its
    streaming session outlives the step (`carry_step`; ada_core/sampling/stream_session.py), and its
    checkpoint entry is the session's open prompts; otherwise it keeps nothing between steps."""

    cfg: SamplerConfig
    advantage: AdvantageConfig
    session: StreamSession | None = field(default=None, repr=False)
    _restored: dict | None = field(default=None, repr=False)

    def state_dict(self) -> dict | None:
        if not self.cfg.carry_over:
            return None
        return self.session.state_dict() if self.session is not None else self._restored

    def load_state_dict(self, state: dict | None) -> None:
        if self.cfg.carry_over:
            self._restored = state

    def carry_step(self, take: int, source: PromptSource, engine: RolloutEngine, verifier: Verifier,
                   sampling: SamplingParams, rng: np.random.Generator, number: int, carry_steps: int | None = None,
                   stale: str = "wait", final: bool = False) -> RolloutBatch:
        """Step `number` under carry-over: its `take` prompts join the stream (unless the last step drew them
        ahead), and the batch is the first `take` prompts done, older first. `carry_steps`: how many steps
        after the one it joined in a prompt may enter a batch (rollout.max_staleness - rollout.async_steps;
        None: no bound); `stale` says what becomes of one not done by then; `final` (the run's last step) drops
        and counts the prompts left open."""
        if self.session is None:
            self.session = StreamSession(self.cfg, self.advantage, engine)
            if self._restored is not None:
                self.session.load_state_dict(self._restored)
                self._restored = None
        return self.session.carry_step(take, source, verifier, sampling, rng, number, carry_steps, stale, final)

    def close(self) -> None:
        if self.session is not None:
            self.session.close()

    def sample(
        self,
        prompts: list[Prompt],
        engine: RolloutEngine,
        verifier: Verifier,
        sampling: SamplingParams,
        rng: np.random.Generator,
        source: PromptSource | None = None,
    ) -> RolloutBatch:
        if self.cfg.carry_over:
            raise RuntimeError("sampler.carry_over: the sampler draws its own prompts; call carry_step")  # a bug
        if self.cfg.schedule == "streaming":  # per-sample exits with aborts: ada_core/sampling/streaming.py
            return run_streaming(self.cfg, self.advantage, prompts, engine, verifier, sampling, rng)
        pools, groups, clock = elimination_rounds(self.cfg, self.advantage, prompts, engine, verifier, sampling, rng)
        return finish_batch(pools, groups, clock, self.cfg, [self.cfg.exit_rule, "unresolved"])


def elimination_rounds(cfg: SamplerConfig, advantage: AdvantageConfig, prompts: list[Prompt], engine: RolloutEngine,
                       verifier: Verifier, sampling: SamplingParams, rng: np.random.Generator,
                       ) -> tuple[list[PromptPool], list[Group], StepClock]:
    """Reinforce-Ada's successive elimination with round barriers (the module docstring): every pool, the kept
    groups (downsampled to n, advantages against the whole pool) and the step's clock. `AdaSampler` runs it, and
    so does a sampler that reweights Ada's groups (`ada_v3w`, ada_core/sampling/research.py)."""
    clock = StepClock()
    check_prompts(prompts)
    threshold = cfg.positive_threshold
    pools = [PromptPool(p) for p in prompts]
    active = list(range(len(pools)))
    spent = 0
    for r in range(cfg.N):
        if not active:
            break
        remaining = None if cfg.global_sample_cap is None else cfg.global_sample_cap - spent
        want = cfg.first_round if r == 0 else cfg.M
        alloc = allocate_round(want, [len(pools[i].samples) for i in active], remaining)
        sampled = [(i, k) for i, k in zip(active, alloc) if k > 0]
        if not sampled:
            break  # the global cap is spent
        clock.active_per_round.append(len(active))
        drawn = draw_and_score([(pools[i].prompt, k) for i, k in sampled], r, engine, verifier, sampling, rng, clock)
        for (i, _), samples in zip(sampled, drawn):
            pools[i].samples.extend(samples)
        spent += sum(alloc)
        for i in active:
            pools[i].rounds = r + 1
        # Exit is checked only here, at the END of the round: p_hat sees the whole last round.
        still_active = []
        for i in active:
            if has_exited(pools[i], cfg.exit_rule, cfg.n, threshold):
                pools[i].exit_reason = cfg.exit_rule
            else:
                still_active.append(i)
        active = still_active

    downsample, unresolved = DOWNSAMPLERS[cfg.downsample], set(active)
    groups = []
    for i, pool in enumerate(pools):
        if i in unresolved:
            pool.exit_reason = "unresolved"
            # A pool smaller than n cannot fill a group (the cap stopped it early): dropped either way.
            if cfg.unresolved == "drop" or len(pool.samples) < cfg.n:
                continue
        groups.append(make_group(pool, downsample(pool.samples, cfg.n, threshold, rng), advantage, threshold))
    return pools, groups, clock


@register_sampler("budgeted", presets={})  # its presets: ada_core/config/presets.py
@dataclass
class BudgetedSampler(_KeepsHistory):
    """A fixed budget of samples per step (`sampler.budget`, default B x n), spent by an allocation
    policy that remembers every prompt across steps (ada_core/sampling/allocation.py explains both).

        forced, candidates = select_prompts(...)      exploration floor first; skip confident 0s and 1s
        posterior:   alloc = greedy_allocation(...)   ONE engine call, k_i in {0} or [n, cap]
        elimination: round 0 n each (as many as fit); then, while budget lasts, M per prompt whose
                     pool is not yet mixed, shrunk to fit (allocate_round); at most N rounds
        group = downsample(pool, n) for every pool of >= n; the history observes every pool

    Exit reasons: `mixed`, `unresolved` (a uniform pool; kept or dropped per `unresolved`) and
    `skipped` (no samples). The history lives on the sampler: `state_dict` / `load_state_dict`.
    """

    cfg: SamplerConfig
    advantage: AdvantageConfig
    history: PromptHistory = field(init=False)

    def __post_init__(self) -> None:
        self.history = PromptHistory(self.cfg.prior_strength, self.cfg.prior_weight, self.cfg.forget)

    def sample(
        self,
        prompts: list[Prompt],
        engine: RolloutEngine,
        verifier: Verifier,
        sampling: SamplingParams,
        rng: np.random.Generator,
        source: PromptSource | None = None,
    ) -> RolloutBatch:
        clock = StepClock()
        check_prompts(prompts)
        cfg, n, threshold, history = self.cfg, self.cfg.n, self.cfg.positive_threshold, self.history
        budget = step_budget(cfg.budget, len(prompts), n)
        cap = cfg.max_samples_per_prompt
        forced, candidates, post = select_prompts(prompts, history, n, budget, cfg.skip_confidence, cfg.explore_after)
        pools = [PromptPool(p) for p in prompts]
        if cfg.allocation == "posterior":
            chosen = forced + candidates
            start = [n] * len(forced) + [0] * len(candidates)
            alloc = greedy_allocation([post[i] for i in chosen], n, budget, cap, start)
            requests = [(i, k) for i, k in zip(chosen, alloc) if k > 0]
            self._draw(pools, requests, 0, engine, verifier, sampling, rng, clock)
        else:
            # Round 0: n for each forced prompt, then the likeliest to mix, as many as the budget allows.
            ranked = sorted(candidates, key=lambda i: -mixed_prob(*post[i], n))
            started = (forced + ranked)[: budget // n]
            self._draw(pools, [(i, n) for i in started], 0, engine, verifier, sampling, rng, clock)
            spent = n * len(started)
            active = [i for i in started if not has_exited(pools[i], "mixed", n, threshold)]
            for r in range(1, cfg.N):
                alloc = allocate_round(cfg.M, [len(pools[i].samples) for i in active], budget - spent)
                requests = [(i, k) for i, k in zip(active, alloc) if k > 0]
                if not requests:
                    break
                self._draw(pools, requests, r, engine, verifier, sampling, rng, clock)
                spent += sum(k for _, k in requests)
                active = [i for i in active if not has_exited(pools[i], "mixed", n, threshold)]
        expected = sum(mixed_prob(*post[i], len(pool.samples)) for i, pool in enumerate(pools))

        downsample, groups = DOWNSAMPLERS[cfg.downsample], []
        for i, pool in enumerate(pools):
            belief = history.belief(pool.prompt.id)
            belief.draws += 1
            if not pool.samples:
                pool.exit_reason = "skipped"
                belief.skipped_in_a_row += 1
                continue
            belief.skipped_in_a_row = 0
            pos = pool.num_positive(threshold)
            history.observe(pool.prompt.id, pos, len(pool.samples) - pos)
            pool.exit_reason = "mixed" if 0 < pos < len(pool.samples) else "unresolved"
            if pool.exit_reason == "unresolved" and cfg.unresolved == "drop":
                continue
            groups.append(make_group(pool, downsample(pool.samples, n, threshold, rng), self.advantage, threshold))
        history.end_step()
        extra = {mk.SAMPLER_BUDGET: float(budget), mk.SAMPLER_FORCED: float(len(forced)),
                 mk.SAMPLER_EXPECTED_INFORMATIVE: expected}
        return finish_batch(pools, groups, clock, cfg, ["mixed", "unresolved", "skipped"], extra, needed=(1, 1))

    @staticmethod
    def _draw(pools, requests, round_index, engine, verifier, sampling, rng, clock) -> None:
        if not requests:
            return
        clock.active_per_round.append(len(requests))
        drawn = draw_and_score([(pools[i].prompt, k) for i, k in requests], round_index, engine, verifier, sampling,
                               rng, clock)
        for (i, _), samples in zip(requests, drawn):
            pools[i].samples.extend(samples)
            pools[i].rounds = round_index + 1


@register_sampler("est", presets={})  # its presets: ada_core/config/presets.py
@dataclass
class EstSampler(_KeepsHistory):
    """Reinforce-Ada-Est as arXiv 2510.04996v3 specifies it (sections 3-4, Algorithm 1), for the objective
    f(p) = log p; docs/ALGORITHM.md cites the paper for each line and marks the choices that are ours.

        p_hat_x = EstHistory.estimate(x)          an EMA of the prompt's history, started from its curation rate
        N_x     = est_allocation(p_hat, budget, est_min, est_max)   ~ 1/sqrt(p_hat_x), sums to the budget (B x n)
        ONE engine call: N_x samples for every prompt; score them; the history visits every prompt
        group   = the WHOLE pool (every sample is trained); advantages by the configured estimator
        weight:  A_i *= 1 / sqrt(r_bar_x + eps),  r_bar_x = this step's pass rate of x, unnormalised

    With N_x ~ 1/sqrt(p) samples each weighted ~ 1/sqrt(p), a prompt's share of the gradient is ~ 1/p: the
    estimator of grad log p = grad p / p. `est_weighting: none` weights every sample alike. A uniform pool
    (all correct or all wrong) is `unresolved`: kept with zero advantage, or dropped (`unresolved: drop`).
    """

    cfg: SamplerConfig
    advantage: AdvantageConfig
    history: EstHistory = field(init=False)

    def __post_init__(self) -> None:
        self.history = EstHistory(self.cfg.est_ema, self.cfg.est_prior)

    def sample(
        self,
        prompts: list[Prompt],
        engine: RolloutEngine,
        verifier: Verifier,
        sampling: SamplingParams,
        rng: np.random.Generator,
        source: PromptSource | None = None,
    ) -> RolloutBatch:
        clock = StepClock()
        check_prompts(prompts)
        cfg, threshold = self.cfg, self.cfg.positive_threshold
        budget = step_budget(cfg.budget, len(prompts), cfg.n)
        p_hat = [self.history.estimate(p) for p in prompts]
        alloc = est_allocation(p_hat, budget, cfg.est_min, cfg.est_max)
        pools = [PromptPool(p, rounds=1) for p in prompts]
        clock.active_per_round.append(len(pools))
        drawn = draw_and_score(list(zip(prompts, alloc)), 0, engine, verifier, sampling, rng, clock)
        groups, weights = [], []
        for pool, samples in zip(pools, drawn):
            pool.samples.extend(samples)
            pos = pool.num_positive(threshold)
            self.history.visit(pool.prompt, pos, len(samples))
            weight = est_weights([pos / len(samples)], cfg.est_eps)[0] if cfg.est_weighting == "log" else 1.0
            pool.exit_reason = "mixed" if 0 < pos < len(samples) else "unresolved"
            if pool.exit_reason == "unresolved" and cfg.unresolved == "drop":
                continue
            group = make_group(pool, list(pool.samples), self.advantage, threshold)
            if weight != 1.0:
                group.advantages = [a * weight for a in group.advantages]
            groups.append(group)
            if pool.exit_reason == "mixed":
                weights.append(weight)
        extra = {mk.SAMPLER_BUDGET: float(budget), mk.SAMPLER_EST_P_HAT_MIN: float(min(p_hat)),
                 mk.SAMPLER_EST_WEIGHT_MAX: float(max(weights, default=1.0))}
        return finish_batch(pools, groups, clock, cfg, ["mixed", "unresolved"], extra, needed=(1, 1))


def make_sampler(sampler_cfg: SamplerConfig, advantage_cfg: AdvantageConfig) -> Sampler:
    """The sampler registered as `sampler_cfg.name` (ada_core/config/registry.py), built-in or a plugin;
    call `.sample(prompts, engine, verifier, sampling, rng, source)`."""
    return get_sampler(sampler_cfg.name).cls(sampler_cfg, advantage_cfg)
