"""Research samplers (issue #37, item 2): four allocation ideas, each a sampler registered through the public API
(`register_sampler`, strict `SamplerOptions`, one preset each), so the paper grid, compare, sweep and `ada simulate`
run them like any other. docs/ALGORITHM.md ("Research samplers") gives each rule, its source and our choices.

- `knapsack` (Knapsack RL, arXiv 2509.25849): GRPO's B x n samples a step, allocated in ONE engine call by value
  per sample from each prompt's current Beta posterior; every sample trained.
- `pilot` (two-stage; ours): a pilot of `pilot` samples a prompt, then the rest of B x n to the prompts whose pool
  the pilot says will carry the most signal, in the same step with the same policy; every sample trained.
- `greso` (GRESO, arXiv 2506.02177): prompts whose history predicts a zero-variance group are skipped before
  rollout (with GRESO's random exploration and our deterministic floor); replacements come from the source, so
  the step still trains B prompts of n.
- `ada_v3w` (Reinforce-Ada v3's weight on Ada's elimination): Ada's successive elimination (`elimination_rounds`),
  each kept group's advantages times 1 / sqrt(p_hat_pool + eps), p_hat over the whole pool (arXiv 2510.04996v3,
  Algorithm 1's weight, unnormalised).

Every option is read by its sampler; a sampler's fields outside `sampler.options` are `n` (the matched GRPO
control's group size: the budget is B x n) and `positive_threshold`.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
from pydantic import Field, model_validator

from ada_core.config import AdvantageConfig, SamplerConfig
from ada_core.config.registry import SamplerOptions, options_of, register_sampler
from ada_core.data.source import PromptSource
from ada_core.protocols import RolloutEngine, SamplingParams, Verifier
from ada_core.records import Group, Prompt, PromptPool, RolloutBatch
from ada_core.sampling.allocation import PromptHistory, mixed_prob, moment, uniform_prob
from ada_core.sampling.rounds import EXIT_RULES, check_prompts, draw_and_score, finish_batch, make_group
from ada_core.sampling.samplers import elimination_rounds
from ada_core.sampling.step_metrics import StepClock

JEFFREYS = 0.5  # Beta(1/2, 1/2): every research sampler's prior of a prompt with no evidence (ours)


# ---------------------------------------------------------------------------------------------------
# Shared pieces: a greedy fill that spends a budget exactly, and the values it maximises.
# ---------------------------------------------------------------------------------------------------
def fill_budget(gain: Callable[[int, int], float], count: int, budget: int, first: int, cap: int,
                start: list[int] | None = None) -> list[int]:
    """Samples per prompt summing to exactly `budget`: k_i = start_i, or in [first, cap] for a prompt that gets any.

    Greedy by gain per sample: a prompt at 0 may take a chunk of `first` (per-sample gain gain(i, first) /
    first), one at k >= first one more (gain(i, k + 1) - gain(i, k)); the best that fits goes first, ties to the
    earlier prompt. A budget the gains leave (all zero) opens the next prompts with a chunk each, then goes one
    at a time to the open prompts below `cap` with the fewest samples; a remainder below `first` with every open
    prompt at `cap` opens one more prompt with samples moved from the largest.
    ValueError when `budget` cannot be spread: more than count x cap.
    """
    alloc = list(start) if start is not None else [0] * count
    if budget > count * cap or first > cap or sum(alloc) > budget:
        raise ValueError(f"a budget of {budget} samples cannot be spread over {count} prompts at most {cap} each")
    remaining = budget - sum(alloc)
    heap: list[tuple[float, int]] = []

    def push(i: int) -> None:
        k = alloc[i]
        if k >= cap:
            return
        step = first if k == 0 else 1
        value = (gain(i, k + step) - (gain(i, k) if k else 0.0)) / step
        if value > 1e-15:
            heapq.heappush(heap, (-value, i))

    for i in range(count):
        push(i)
    while heap and remaining > 0:
        _, i = heapq.heappop(heap)
        step = first if alloc[i] == 0 else 1
        if step > remaining:
            continue
        alloc[i] += step
        remaining -= step
        push(i)
    while remaining > 0:  # gains exhausted (or only whole chunks were left): keep the budget exact
        closed = [i for i in range(count) if alloc[i] == 0]
        open_ = [i for i in range(count) if 0 < alloc[i] < cap]
        if closed and remaining >= first:  # spread first: open the next prompt with a chunk
            alloc[closed[0]] += first
            remaining -= first
        elif open_:
            i = min(open_, key=lambda j: (alloc[j], j))
            alloc[i] += 1
            remaining -= 1
        else:  # every open prompt at cap, less than a chunk left: open one with samples moved from the largest
            take = first - remaining
            for i in sorted(range(count), key=lambda i: (-alloc[i], i)):
                moved = min(take, alloc[i] - first)
                if moved > 0:
                    alloc[i] -= moved
                    take -= moved
                if take == 0:
                    break
            alloc[closed[0]], remaining = first, 0
    return alloc


def knapsack_value(a: float, b: float, k: int) -> float:
    """Knapsack RL's task value for k samples, from a Beta(a, b) belief: P(the k-group is mixed) x InfoGain(p_hat),
    InfoGain(p) = p (1 - p)^2 (the paper's approximation), p_hat = a / (a + b). P(mixed) is the Beta-binomial
    1 - E[p^k] - E[(1-p)^k] (ours; the paper plugs p_hat in).
    Beta(1, 3), k = 4: (1 - 1/35 - 3/7) x (1/4)(3/4)^2 = 19/35 x 9/64."""
    p = a / (a + b)
    return mixed_prob(a, b, k) * p * (1.0 - p) ** 2


def pool_mixed_prob(a: float, b: float, pos: int, neg: int, extra: int) -> float:
    """P(a pool of `pos` positives and `neg` negatives is mixed after `extra` more draws), p ~ Beta(a, b) (the
    belief after the pool). Mixed already: 1. All positive: 1 - E[p^extra]; all negative: 1 - E[(1-p)^extra]."""
    if pos > 0 and neg > 0:
        return 1.0
    if pos == 0 and neg == 0:
        return mixed_prob(a, b, extra)
    return 1.0 - (moment(a, b, extra) if neg == 0 else moment(b, a, extra))


def _check_cap(cfg: SamplerConfig, cap: int, least: int) -> None:
    """Refuse, at the run's start, a cap the budget B x n cannot fit under (the options cannot see n)."""
    if cap < max(cfg.n, least):
        raise ValueError(f"sampler.options.max_samples: {cap} is below sampler.n = {cfg.n} (the budget is B x n, "
                         f"so some prompt needs n): use max_samples >= {max(cfg.n, least)}")


class _HistoryState:
    """A sampler whose memory is a PromptHistory: its checkpoint entry (`state_dict`) is the history's."""

    history: PromptHistory

    def state_dict(self) -> dict:
        return self.history.state_dict()

    def load_state_dict(self, state: dict | None) -> None:
        if state is not None:
            self.history.load_state_dict(state)

    def close(self) -> None:
        pass


def _all_trained(pools: list[PromptPool], advantage: AdvantageConfig, threshold: float) -> list[Group]:
    """Every pool with samples is trained whole; its exit reason says whether it is mixed."""
    groups = []
    for pool in pools:
        if not pool.samples:
            pool.exit_reason = "skipped"
            continue
        pos = pool.num_positive(threshold)
        pool.exit_reason = "mixed" if 0 < pos < len(pool.samples) else "unresolved"
        groups.append(make_group(pool, list(pool.samples), advantage, threshold))
    return groups


def _draw(pools: list[PromptPool], requests: list[tuple[int, int]], round_index: int, engine, verifier, sampling,
          rng, clock) -> None:
    if not requests:
        return
    clock.active_per_round.append(len(requests))
    drawn = draw_and_score([(pools[i].prompt, k) for i, k in requests], round_index, engine, verifier, sampling, rng,
                           clock)
    for (i, _), samples in zip(requests, drawn):
        pools[i].samples.extend(samples)
        pools[i].rounds = round_index + 1


# ---------------------------------------------------------------------------------------------------
# knapsack
# ---------------------------------------------------------------------------------------------------
class KnapsackOptions(SamplerOptions):
    min_samples: int = Field(2, ge=2, description="The fewest samples a prompt given any gets (2: the least that "
                             "can hold a positive and a negative). Ours.")
    max_samples: int = Field(16, ge=2, description="The most samples one prompt gets in a step (at least "
                             "sampler.n). Ours: 4n at the preset's n = 4.")
    forget: float = Field(0.9, gt=0.0, le=1.0, description="Each step since a prompt was seen multiplies its "
                          "training evidence by this (the policy moves). 1 = never forget. Ours.")
    prior_weight: float = Field(1.0, ge=0.0, description="A curated prompt's curation_k measurements count as "
                                "this many pseudo-observations each in its prior (0: ignore curation). Ours.")

    @model_validator(mode="after")
    def _ordered(self) -> KnapsackOptions:
        if self.max_samples < self.min_samples:
            raise ValueError(f"max_samples ({self.max_samples}) must be >= min_samples ({self.min_samples})")
        return self


@register_sampler("knapsack", options=KnapsackOptions,
                  presets={"knapsack": {"sampler": {"n": 4}, "advantage": {"name": "grpo"}}})
@dataclass
class KnapsackSampler(_HistoryState):
    """Knapsack RL (arXiv 2509.25849): a fixed budget per step spent by value per cost.

        belief_x  = Beta(1/2 + pos_x, 1/2 + neg_x)       training evidence (decayed by `forget`), plus the curated
                                                          measurement as pseudo-counts (PromptHistory)
        value_x(k) = P(k-group mixed | belief) x p_hat (1 - p_hat)^2          (knapsack_value)
        k = fill_budget(value, budget B x n, first min_samples, cap max_samples)   ONE engine call
        every sample trained (the whole pool is the group); the history observes every pool

    The paper's value, P(non-zero gradient) x InfoGain with InfoGain(p) ~ p (1-p)^2, from each task's success
    rate; it solves the knapsack by dynamic programming. Ours: the Beta posterior (its mean for InfoGain, its
    Beta-binomial for P(mixed)), greedy by marginal value per sample (the value is concave past the first chunk),
    the first chunk of `min_samples`, the cap, and spending the budget exactly (gains left at zero are spread to
    the open prompts). Exit reasons: `mixed`, `unresolved` (uniform, kept: zero advantage), `skipped` (0 samples).
    """

    cfg: SamplerConfig
    advantage: AdvantageConfig
    history: PromptHistory = field(init=False)

    def __post_init__(self) -> None:
        opts = options_of(self.cfg)
        _check_cap(self.cfg, opts.max_samples, opts.min_samples)
        self.history = PromptHistory(2 * JEFFREYS, opts.prior_weight, opts.forget)

    def sample(self, prompts: list[Prompt], engine: RolloutEngine, verifier: Verifier, sampling: SamplingParams,
               rng: np.random.Generator, source: PromptSource | None = None) -> RolloutBatch:
        clock = StepClock()
        check_prompts(prompts)
        opts, threshold = options_of(self.cfg), self.cfg.positive_threshold
        budget = len(prompts) * self.cfg.n
        beliefs = [self.history.posterior(p) for p in prompts]
        alloc = fill_budget(lambda i, k: knapsack_value(*beliefs[i], k), len(prompts), budget, opts.min_samples,
                            opts.max_samples)
        pools = [PromptPool(p) for p in prompts]
        _draw(pools, [(i, k) for i, k in enumerate(alloc) if k > 0], 0, engine, verifier, sampling, rng, clock)
        groups = _all_trained(pools, self.advantage, threshold)
        for pool in pools:
            if pool.samples:
                pos = pool.num_positive(threshold)
                self.history.observe(pool.prompt.id, pos, len(pool.samples) - pos)
        self.history.end_step()
        extra = {"sampler/budget": float(budget), "sampler/knapsack_max_k": float(max(alloc)),
                 "sampler/knapsack_zero_k": float(sum(k == 0 for k in alloc))}
        return finish_batch(pools, groups, clock, self.cfg, ["mixed", "unresolved", "skipped"], extra, needed=(1, 1))


# ---------------------------------------------------------------------------------------------------
# pilot
# ---------------------------------------------------------------------------------------------------
class PilotOptions(SamplerOptions):
    pilot: int = Field(2, ge=1, description="Stage 1: samples every prompt gets first, with the step's policy "
                       "(at most sampler.n; the rest of B x n is stage 2's). Ours.")
    max_samples: int = Field(8, ge=2, description="The most samples one prompt gets in the step, pilot included "
                             "(at least sampler.n). Ours: 2n at the preset's n = 4.")
    value: Literal["mixed", "signal"] = Field("mixed", description="What stage 2 maximises: `mixed` = the expected "
                                              "number of mixed pools (the effective ratio: samples go to uniform "
                                              "pilots likely to turn mixed); `signal` = the expected number of "
                                              "trained samples in mixed pools (mixed pilots filled first). Ours.")

    @model_validator(mode="after")
    def _ordered(self) -> PilotOptions:
        if self.max_samples < self.pilot:
            raise ValueError(f"max_samples ({self.max_samples}) must be >= pilot ({self.pilot})")
        return self


@register_sampler("pilot", options=PilotOptions,
                  presets={"pilot": {"sampler": {"n": 4}, "advantage": {"name": "grpo"}}})
@dataclass
class PilotSampler:
    """Two stages in one step, both with the current policy: a pilot, then the rest of the budget where the pilot
    says the signal is.

        stage 1: `pilot` samples for every prompt (ONE engine call)
        belief_x = Beta(1/2 + pilot positives, 1/2 + pilot negatives)
        value_x(k) = P(a pool of k is mixed | the pilot)   (`value: mixed`; pool_mixed_prob: 1 once the pilot is mixed)
                   = k x P(a pool of k is mixed | the pilot)   (`value: signal`)
        stage 2: the rest of B x n by fill_budget(value, start = the pilot, cap max_samples)   (ONE engine call)
        every sample trained (the whole pool is the group)

    `mixed` maximises the expected number of mixed pools: stage 2 goes to the uniform pilots most likely to turn
    mixed (a mixed pilot gains nothing more). `signal` maximises the expected number of trained samples whose
    advantage is not zero: a mixed pilot's prompt gains one per sample, so it is filled to the cap first, then the
    uncertain ones (fewer mixed pools, larger ones). Every sample is trained,
    not downsampled to n, so the step trains exactly GRPO's B x n samples. Two-stage sampling is an old idea
    (pilot studies; Ada's round 0 is one); this rule, its value, pilot size and cap are ours. It keeps nothing
    across steps. Metric `sampler/pilot_mixed_frac`: the share of prompts whose pilot was mixed.
    """

    cfg: SamplerConfig
    advantage: AdvantageConfig

    def __post_init__(self) -> None:
        opts = options_of(self.cfg)
        _check_cap(self.cfg, opts.max_samples, opts.pilot)
        if opts.pilot > self.cfg.n:
            raise ValueError(f"sampler.options.pilot: {opts.pilot} is more than sampler.n = {self.cfg.n}: the pilot "
                             "alone would pass the budget B x n")

    def sample(self, prompts: list[Prompt], engine: RolloutEngine, verifier: Verifier, sampling: SamplingParams,
               rng: np.random.Generator, source: PromptSource | None = None) -> RolloutBatch:
        clock = StepClock()
        check_prompts(prompts)
        opts, threshold = options_of(self.cfg), self.cfg.positive_threshold
        budget = len(prompts) * self.cfg.n
        pools = [PromptPool(p) for p in prompts]
        _draw(pools, [(i, opts.pilot) for i in range(len(pools))], 0, engine, verifier, sampling, rng, clock)
        counts = [(pool.num_positive(threshold), len(pool.samples) - pool.num_positive(threshold)) for pool in pools]
        mixed = sum(pos > 0 and neg > 0 for pos, neg in counts)

        def value(i: int, k: int) -> float:
            pos, neg = counts[i]
            mixed_p = pool_mixed_prob(JEFFREYS + pos, JEFFREYS + neg, pos, neg, k - pos - neg)
            return k * mixed_p if opts.value == "signal" else mixed_p

        alloc = fill_budget(value, len(pools), budget, 1, opts.max_samples, start=[opts.pilot] * len(pools))
        _draw(pools, [(i, k - opts.pilot) for i, k in enumerate(alloc) if k > opts.pilot], 1, engine, verifier,
              sampling, rng, clock)
        groups = _all_trained(pools, self.advantage, threshold)
        extra = {"sampler/budget": float(budget), "sampler/pilot_mixed_frac": mixed / len(pools),
                 "sampler/pilot_stage2": float(budget - opts.pilot * len(pools))}
        return finish_batch(pools, groups, clock, self.cfg, ["mixed", "unresolved"], extra, needed=(1, 1))

    def state_dict(self) -> None:
        return None

    def load_state_dict(self, state: dict | None) -> None:
        pass

    def close(self) -> None:
        pass


# ---------------------------------------------------------------------------------------------------
# greso
# ---------------------------------------------------------------------------------------------------
class GresoOptions(SamplerOptions):
    skip_above: float = Field(0.8, gt=0.0, le=1.0, description="Skip a prompt before rollout when its history "
                              "gives its n-group at least this probability of zero variance. Ours (GRESO skips on "
                              "consecutive zero-variance epochs).")
    explore_prob: float = Field(0.1, ge=0.0, le=1.0, description="GRESO's exploration: a prompt the rule would "
                                "skip is sampled anyway with this probability (drawn from the step's rng).")
    explore_after: int = Field(3, ge=1, description="The exploration floor: a prompt skipped this many draws in a "
                               "row is sampled on its next draw. Ours.")
    forget: float = Field(1.0, gt=0.0, le=1.0, description="Each step since a prompt was seen multiplies its "
                          "training evidence by this. 1 (GRESO's: its rule reads a prompt's last visits, however "
                          "long ago) = never forget; below 1 is ours, and a prompt back every s steps keeps forget^s "
                          "of its evidence (0.9 over the testbed's 20-step revisits: 12%, and nothing is ever skipped).")
    max_draw: float = Field(4.0, ge=1.0, description="At most this many times B prompts are examined a step, "
                            "replacements included; fewer than B trained prompts if the source runs short. Ours.")


@register_sampler("greso", options=GresoOptions,
                  presets={"greso": {"sampler": {"n": 4}, "advantage": {"name": "grpo"}}})
@dataclass
class GresoSampler(_HistoryState):
    """GRESO (arXiv 2506.02177): skip, before rollout, the prompts whose history predicts a zero-variance group.

        for each prompt offered (the step's B, then replacements from `source`), until B are chosen:
            P_uniform = P(an n-group is all-equal | Beta(1/2 + pos, 1/2 + neg) of its TRAINING history only)
            skip it if P_uniform >= skip_above, unless it was skipped explore_after draws in a row (the floor)
            or a draw of the step's rng < explore_prob (GRESO's exploration)
        ONE engine call: n samples for every chosen prompt; every group trained (GRPO's groups)

    The skipped prompts cost no samples; with replacements the step trains B prompts of n, GRPO's B x n samples
    (fewer only when `max_draw` x B prompts were examined first). GRESO's own rule predicts from the prompt's
    zero-variance streak over recent epochs and tunes its exploration probability to a target; ours reads the same
    history as a Beta posterior (curation ignored: GRESO uses training history alone) with a fixed explore_prob and
    a deterministic floor. It pays only where prompts come back (the `revisit` pool); on fresh prompts it is GRPO.
    Exit reasons: `mixed`, `uniform`, `skipped`. Metrics `sampler/skipped`, `sampler/explored`, `sampler/replaced`.
    """

    cfg: SamplerConfig
    advantage: AdvantageConfig
    history: PromptHistory = field(init=False)

    def __post_init__(self) -> None:
        self.history = PromptHistory(2 * JEFFREYS, 0.0, options_of(self.cfg).forget)

    def predicted_uniform(self, prompt: Prompt) -> float:
        return uniform_prob(*self.history.posterior(prompt), self.cfg.n)

    def sample(self, prompts: list[Prompt], engine: RolloutEngine, verifier: Verifier, sampling: SamplingParams,
               rng: np.random.Generator, source: PromptSource | None = None) -> RolloutBatch:
        clock = StepClock()
        check_prompts(prompts)
        opts, n, threshold = options_of(self.cfg), self.cfg.n, self.cfg.positive_threshold
        target, limit = len(prompts), math.floor(opts.max_draw * len(prompts))
        pools: list[PromptPool] = []
        chosen: list[int] = []
        seen = {p.id for p in prompts}
        offered, explored = list(prompts), 0
        while len(chosen) < target:
            for prompt in offered:
                if len(chosen) >= target:
                    break
                belief = self.history.belief(prompt.id)
                belief.draws += 1
                pools.append(PromptPool(prompt))
                explore = float(rng.random()) < opts.explore_prob  # drawn for every prompt: the rng's use is fixed
                would_skip = (self.predicted_uniform(prompt) >= opts.skip_above
                              and belief.skipped_in_a_row < opts.explore_after)
                if would_skip and not explore:
                    belief.skipped_in_a_row += 1
                    continue
                explored += int(would_skip)
                belief.skipped_in_a_row = 0
                chosen.append(len(pools) - 1)
            room = min(target - len(chosen), limit - len(pools))
            if room <= 0 or source is None:
                break
            offered = [p for p in source.take(room) if p.id not in seen]
            seen.update(p.id for p in offered)
            if not offered:
                break
        _draw(pools, [(i, n) for i in chosen], 0, engine, verifier, sampling, rng, clock)
        groups = []
        for pool in pools:
            if not pool.samples:
                pool.exit_reason = "skipped"
                continue
            pos = pool.num_positive(threshold)
            self.history.observe(pool.prompt.id, pos, len(pool.samples) - pos)
            pool.exit_reason = "mixed" if 0 < pos < len(pool.samples) else "uniform"
            groups.append(make_group(pool, list(pool.samples), self.advantage, threshold))
        self.history.end_step()
        extra = {"sampler/skipped": float(len(pools) - len(chosen)), "sampler/explored": float(explored),
                 "sampler/replaced": float(len(pools) - target)}
        return finish_batch(pools, groups, clock, self.cfg, ["mixed", "uniform", "skipped"], extra, needed=(1, 1))


# ---------------------------------------------------------------------------------------------------
# ada_v3w
# ---------------------------------------------------------------------------------------------------
class AdaV3wOptions(SamplerOptions):
    exit_rule: Literal["pos", "balance", "mixed"] = Field("balance", description="Ada's exit rule (sampler.exit_rule "
                                                          "of `ada`). Ref default: balance.")
    M: int = Field(8, ge=1, description="Ada's samples per active prompt per round. Ref: 8.")
    N: int = Field(4, ge=1, description="Ada's most rounds. Ref: 4.")
    unresolved: Literal["keep", "drop"] = Field("keep", description="Prompts still active after N rounds: kept "
                                                "(zero-advantage groups, ref code) or dropped (the paper).")
    eps: float = Field(1e-6, gt=0.0, description="The eps of the weight 1 / sqrt(p_hat + eps) (v3 does not give "
                       "it; an all-wrong pool has zero advantage, so it only keeps the weight finite). Ours.")


@register_sampler("ada_v3w", options=AdaV3wOptions,
                  presets={"ada-v3w": {"sampler": {"n": 4}, "advantage": {"name": "global_mean"}}})
@dataclass
class AdaV3wSampler:
    """Reinforce-Ada's elimination with v3's weighting (arXiv 2510.04996: Ada-balance of v1/v2, Algorithm 1's
    weight of v3).

        pools, groups = elimination_rounds(Ada with exit_rule, M, N, unresolved)   (AdaSampler's rounds, balanced
                                                                                     downsample to n)
        p_hat_x = positives / samples of x's WHOLE pool (every round)
        each kept group's advantages *= 1 / sqrt(p_hat_x + eps), unnormalised

    In v3 the weight rides on N_x ~ 1/sqrt(p_hat) samples trained whole, so a prompt's summed weight is ~ 1/p (the
    log objective). Here the group is Ada's n samples, so its weight alone is ~ 1/sqrt(p): hard prompts count
    more, not as much as in v3. The combination is ours. Exit reasons Ada's (`<exit_rule>`, `unresolved`); metric
    `sampler/v3w_weight_max` (largest weight of a mixed group). It keeps nothing across steps.
    """

    cfg: SamplerConfig
    advantage: AdvantageConfig
    ada: SamplerConfig = field(init=False)

    def __post_init__(self) -> None:
        opts = options_of(self.cfg)
        self.ada = SamplerConfig(name="ada", n=self.cfg.n, positive_threshold=self.cfg.positive_threshold,
                                 exit_rule=opts.exit_rule, M=opts.M, N=opts.N, unresolved=opts.unresolved)

    def sample(self, prompts: list[Prompt], engine: RolloutEngine, verifier: Verifier, sampling: SamplingParams,
               rng: np.random.Generator, source: PromptSource | None = None) -> RolloutBatch:
        eps, threshold = options_of(self.cfg).eps, self.cfg.positive_threshold
        pools, groups, clock = elimination_rounds(self.ada, self.advantage, prompts, engine, verifier, sampling, rng)
        weights = []
        for group in groups:
            weight = v3_weight(group.pool_positives, group.pool_size, eps)
            group.advantages = [a * weight for a in group.advantages]
            if 0 < group.pool_positives < group.pool_size:
                weights.append(weight)
        extra = {"sampler/v3w_weight_max": float(max(weights, default=1.0))}
        return finish_batch(pools, groups, clock, self.cfg, [self.ada.exit_rule, "unresolved"], extra,
                            needed=EXIT_RULES[self.ada.exit_rule](self.ada.n))

    def state_dict(self) -> None:
        return None

    def load_state_dict(self, state: dict | None) -> None:
        pass

    def close(self) -> None:
        pass


def v3_weight(positives: int, size: int, eps: float) -> float:
    """1 / sqrt(p_hat + eps), p_hat = positives / size of the whole pool. 2 of 8, eps 0 -> 2.0."""
    return 1.0 / math.sqrt(positives / size + eps)
