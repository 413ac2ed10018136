"""Samplers: how a step's groups are drawn. Read this file top to bottom to learn Reinforce-Ada.

A step takes B prompts and hands the update engine one `Group` of exactly n scored samples per kept
prompt. A prompt whose n rewards are all equal gets zero advantage and teaches nothing, and at the
start (hard prompts) and end (easy prompts) of training most groups are like that. Four samplers,
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

- `budgeted` (ours, beyond the paper): GRPO's B x n samples a step (or `sampler.budget`), spent by a
  history-informed allocation policy; `BudgetedSampler` below and ada_core/allocation.py.

Every sampler draws through `draw_and_score` (one engine call plus the verifier, with the input
checks) and reports `ada_core.sampler_metrics.step_metrics`. The rng passed to `sample` seeds
every engine call and every downsampling draw, so a step is reproducible given its rng.
"""

from __future__ import annotations

import logging
import math
import numbers
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from ada_core import metrics as mk
from ada_core.advantages import compute_advantages
from ada_core.allocation import PromptHistory, greedy_allocation, mixed_prob, select_prompts, step_budget
from ada_core.config import AdvantageConfig, SamplerConfig
from ada_core.protocols import PromptSource, RolloutEngine, SamplingParams, Verifier
from ada_core.records import Group, Prompt, PromptPool, RolloutBatch, Sample, VerifierStatus
from ada_core.sampler_metrics import StepClock, step_metrics

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------------------
# One round: a single batched engine call, then the verifier, with every input checked.
# ---------------------------------------------------------------------------------------------------
def draw_and_score(
    requests: Sequence[tuple[Prompt, int]],
    round_index: int,
    engine: RolloutEngine,
    verifier: Verifier,
    sampling: SamplingParams,
    rng: np.random.Generator,
    clock: StepClock,
) -> list[list[Sample]]:
    """Draw k samples for each (prompt, k) in one engine call, score them, and tag them with the round.

    The call's seed is drawn from `rng`, so the same rng gives the same samples. Raises ValueError,
    naming the prompt, when the engine or the verifier returns the wrong count or a reward is not a
    finite number.
    """
    params = replace(sampling, seed=int(rng.integers(0, 2**31 - 1)))
    meter = getattr(engine, "meter", None)  # engines that know their occupancy (ada_core/occupancy.py)
    before = meter.read() if meter is not None else None
    t0 = time.perf_counter()
    drawn = engine.generate(list(requests), params)
    clock.generate_s += time.perf_counter() - t0
    if before is not None:
        after = meter.read()
        clock.below_capacity_s = (clock.below_capacity_s or 0.0) + after.below_s - before.below_s
        clock.metered_s += after.at - before.at
        clock.slot_s += after.slot_s - before.slot_s
        clock.capacity = meter.capacity
    if len(drawn) != len(requests):
        raise ValueError(f"engine returned {len(drawn)} sample lists for {len(requests)} requests (round {round_index})")
    for (prompt, k), samples in zip(requests, drawn):
        if len(samples) != k:
            raise ValueError(f"engine returned {len(samples)} samples for prompt {prompt.id!r}, expected {k}")
        for s in samples:
            if s.prompt_id != prompt.id:
                raise ValueError(f"engine returned a sample of prompt {s.prompt_id!r} for prompt {prompt.id!r}")

    items = [(prompt, s.text) for (prompt, _), samples in zip(requests, drawn) for s in samples]
    t0 = time.perf_counter()
    verdicts = verifier.verify(items)
    clock.reward_s += time.perf_counter() - t0
    if len(verdicts) != len(items):
        ids = sorted({p.id for p, _ in requests})
        shown = ids[:5] + (["..."] if len(ids) > 5 else [])
        raise ValueError(
            f"verifier returned {len(verdicts)} verdicts for {len(items)} completions "
            f"(round {round_index}, prompts {shown})"
        )
    for (prompt, _), sample, verdict in zip(items, (s for ss in drawn for s in ss), verdicts):
        apply_verdict(prompt, sample, verdict, round_index)
    return drawn


def apply_verdict(prompt: Prompt, sample: Sample, verdict, round_index: int) -> None:
    """Fill in the sample's reward, status and round; raise ValueError, naming the prompt, on a bad verdict."""
    reward, status = verdict.reward, verdict.status
    if type(reward) is not float:  # the common case skips the slower checks
        if isinstance(reward, (str, bytes)) or not isinstance(reward, (numbers.Real, np.bool_)):
            raise ValueError(f"verifier gave prompt {prompt.id!r} a non-numeric reward {reward!r}")
        reward = float(reward)
    if not math.isfinite(reward):
        raise ValueError(f"verifier gave prompt {prompt.id!r} a non-finite reward {reward!r}")
    if type(status) is not VerifierStatus:
        try:
            status = VerifierStatus(status)
        except ValueError:
            raise ValueError(f"verifier gave prompt {prompt.id!r} an unknown status {status!r}") from None
    sample.reward, sample.status, sample.round = reward, status, round_index


# ---------------------------------------------------------------------------------------------------
# Exit rules and downsampling, each chosen by name.
# ---------------------------------------------------------------------------------------------------
# An exit rule says how many positives and negatives a pool needs before its prompt stops sampling.
EXIT_RULES = {
    "pos": lambda n: (1, 0),
    "balance": lambda n: (n // 2, n - n // 2),
    "mixed": lambda n: (1, 1),  # the fewest for a nonzero advantage; the budgeted sampler's rule
}


def has_exited(pool: PromptPool, rule: str, n: int, threshold: float) -> bool:
    """True when the pool meets `rule` AND holds at least n samples (so it can fill a group).

    The size condition only matters for `pos` with M0 or M below n; the reference setting has M >= n.
    """
    need_pos, need_neg = EXIT_RULES[rule](n)
    pos = pool.num_positive(threshold)
    return len(pool.samples) >= n and pos >= need_pos and len(pool.samples) - pos >= need_neg


def downsample_balanced(samples: list[Sample], n: int, threshold: float, rng: np.random.Generator) -> list[Sample]:
    """A seeded random n of the pool: n//2 positives and n - n//2 negatives, the shortfall of one class
    filled from the other. Returned in draw order.

    Pool 2 positives + 10 negatives, n = 4 -> both positives and 2 random negatives.
    Pool 1 positive + 10 negatives, n = 4 -> the positive and 3 random negatives.
    """
    shuffled = rng.permutation(len(samples)).tolist()  # random, not the reference code's first-k
    pos = [i for i in shuffled if samples[i].reward > threshold]  # type: ignore[operator]
    neg = [i for i in shuffled if not samples[i].reward > threshold]  # type: ignore[operator]
    take_pos = min(len(pos), max(n // 2, n - len(neg)))
    return [samples[i] for i in sorted(pos[:take_pos] + neg[: n - take_pos])]


def downsample_random(samples: list[Sample], n: int, threshold: float, rng: np.random.Generator) -> list[Sample]:
    """A uniform seeded random n of the pool, returned in draw order."""
    return [samples[i] for i in sorted(rng.permutation(len(samples))[:n].tolist())]


DOWNSAMPLERS = {"balanced": downsample_balanced, "random": downsample_random}


def allocate_round(want: int, pool_sizes: list[int], remaining: int | None) -> list[int]:
    """Samples for each active prompt this round, shrunk to fit a global cap of `remaining` samples.

    Under the cap every prompt gets `remaining // A`; the spare ones go to the prompts with the fewest
    samples so far, ties to the earlier prompt: deterministic and fair across rounds.
    want 8, pool sizes [8, 0, 8], remaining 10 -> [3, 4, 3].
    """
    if remaining is None or want * len(pool_sizes) <= remaining:
        return [want] * len(pool_sizes)
    base, spare = divmod(remaining, len(pool_sizes))
    alloc = [base] * len(pool_sizes)
    for j in sorted(range(len(pool_sizes)), key=lambda j: (pool_sizes[j], j))[:spare]:
        alloc[j] += 1
    return alloc


def make_group(pool: PromptPool, samples: list[Sample], advantage: AdvantageConfig, threshold: float) -> Group:
    """The trained group: `samples` with advantages computed against the WHOLE pool's rewards."""
    pool_rewards = pool.rewards()
    group_rewards = [s.reward for s in samples]
    return Group(
        prompt=pool.prompt,
        samples=samples,
        advantages=compute_advantages(advantage.name, group_rewards, pool_rewards, advantage.eps),
        pool_size=len(pool_rewards),
        pool_positives=sum(r > threshold for r in pool_rewards),
        p_hat=sum(pool_rewards) / len(pool_rewards),
        exit_reason=pool.exit_reason,
    )


# ---------------------------------------------------------------------------------------------------
# The three samplers. Each returns a RolloutBatch of kept groups plus the step's metrics.
# ---------------------------------------------------------------------------------------------------
@dataclass
class FixedSampler:
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
        _check_prompts(prompts)
        pools = [PromptPool(p, exit_reason="fixed", rounds=1) for p in prompts]
        clock.active_per_round.append(len(pools))
        drawn = draw_and_score([(p, self.cfg.n) for p in prompts], 0, engine, verifier, sampling, rng, clock)
        for pool, samples in zip(pools, drawn):
            pool.samples.extend(samples)
        groups = [make_group(pool, pool.samples, self.advantage, self.cfg.positive_threshold) for pool in pools]
        return _finish(pools, groups, clock, self.cfg, ["fixed"])


@dataclass
class DynamicFilterSampler:
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
        _check_prompts(prompts)
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
        return _finish(pools, groups, clock, self.cfg, ["varied", "uniform"], extra)


@dataclass
class AdaSampler:
    """Reinforce-Ada successive elimination (see the module docstring)."""

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
        if self.cfg.schedule == "streaming":  # per-sample exits with aborts: ada_core/streaming.py
            from ada_core.streaming import run_streaming

            return run_streaming(self.cfg, self.advantage, prompts, engine, verifier, sampling, rng)
        clock = StepClock()
        _check_prompts(prompts)
        cfg, threshold = self.cfg, self.cfg.positive_threshold
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
            groups.append(make_group(pool, downsample(pool.samples, cfg.n, threshold, rng), self.advantage, threshold))
        return _finish(pools, groups, clock, cfg, [cfg.exit_rule, "unresolved"])


@dataclass
class BudgetedSampler:
    """A fixed budget of samples per step (`sampler.budget`, default B x n), spent by an allocation
    policy that remembers every prompt across steps (ada_core/allocation.py explains both).

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

    def state_dict(self) -> dict:
        return self.history.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.history.load_state_dict(state)

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
        _check_prompts(prompts)
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
        return _finish(pools, groups, clock, cfg, ["mixed", "unresolved", "skipped"], extra, needed=(1, 1))

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


Sampler = FixedSampler | DynamicFilterSampler | AdaSampler | BudgetedSampler
SAMPLERS: dict[str, type[Sampler]] = {
    "fixed": FixedSampler, "dynamic_filter": DynamicFilterSampler, "ada": AdaSampler, "budgeted": BudgetedSampler,
}


def make_sampler(sampler_cfg: SamplerConfig, advantage_cfg: AdvantageConfig) -> Sampler:
    """The sampler named by `sampler_cfg.name`; call `.sample(prompts, engine, verifier, sampling, rng, source)`."""
    if sampler_cfg.name not in SAMPLERS:
        raise ValueError(f"sampler.name: unknown sampler {sampler_cfg.name!r}; choose from {sorted(SAMPLERS)}")
    return SAMPLERS[sampler_cfg.name](sampler_cfg, advantage_cfg)


def _check_prompts(prompts: Sequence[Prompt]) -> None:
    if not prompts:
        raise ValueError("sampler got no prompts: a step needs at least one")
    ids = [p.id for p in prompts]
    if len(set(ids)) != len(ids):
        dup = sorted({i for i in ids if ids.count(i) > 1})[:5]
        raise ValueError(f"sampler got duplicate prompt ids {dup}: each prompt appears once per step")


def _finish(pools, groups, clock, cfg: SamplerConfig, exit_reasons, extra=None, needed=None) -> RolloutBatch:
    """Wrap the kept groups with the step's metrics (ada_core.sampler_metrics) and every pool."""
    if needed is None:
        needed = EXIT_RULES[cfg.exit_rule](cfg.n) if cfg.name == "ada" else (0, 0)
    metrics = step_metrics(pools, groups, clock, cfg.positive_threshold, exit_reasons, needed)
    metrics.update(extra or {})
    metrics[mk.SAMPLER_TIME_S] = clock.bookkeeping_s()  # last, so it includes computing the metrics
    return RolloutBatch(groups=groups, metrics=mk.check_keys(metrics), pools=pools)


