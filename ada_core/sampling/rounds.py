"""The round primitives every sampler shares: one engine call plus the verifier, exit rules,
downsampling, round allocation under a cap, group assembly and the step's batch.

The samplers (samplers.py) and the streaming schedule (streaming.py) are built from these alone.
"""

from __future__ import annotations

import logging
import math
import numbers
import time
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from ada_core import metrics as mk
from ada_core.config import AdvantageConfig, SamplerConfig
from ada_core.rl.advantages import compute_advantages
from ada_core.protocols import RolloutEngine, SamplingParams, Verifier
from ada_core.records import Group, Prompt, PromptPool, RolloutBatch, Sample, VerifierStatus
from ada_core.sampling.step_metrics import StepClock, step_metrics


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
    meter = engine.meter  # None: an engine that does not meter its occupancy (RolloutEngine.meter)
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


def check_prompts(prompts: Sequence[Prompt]) -> None:
    if not prompts:
        raise ValueError("sampler got no prompts: a step needs at least one")
    ids = [p.id for p in prompts]
    if len(set(ids)) != len(ids):
        dup = sorted({i for i in ids if ids.count(i) > 1})[:5]
        raise ValueError(f"sampler got duplicate prompt ids {dup}: each prompt appears once per step")


def finish_batch(pools, groups, clock, cfg: SamplerConfig, exit_reasons, extra=None, needed=None) -> RolloutBatch:
    """Wrap the kept groups with the step's metrics (ada_core.sampling.step_metrics) and every pool."""
    if needed is None:
        needed = EXIT_RULES[cfg.exit_rule](cfg.n) if cfg.name == "ada" else (0, 0)
    metrics = step_metrics(pools, groups, clock, cfg.positive_threshold, exit_reasons, needed)
    metrics.update(extra or {})
    # Samples a step dropped (carry-over's stale: drop, a resume's in-flight ones, the pools open at a run's end)
    # were generated all the same: the budget counts them once, here, and budget/dropped_* says how many.
    metrics[mk.BUDGET_GENERATED_SAMPLES] += metrics.get(mk.BUDGET_DROPPED_SAMPLES, 0.0)
    metrics[mk.BUDGET_GENERATED_TOKENS] += metrics.get(mk.BUDGET_DROPPED_TOKENS, 0.0)
    metrics[mk.SAMPLER_TIME_S] = clock.bookkeeping_s()  # last, so it includes computing the metrics
    return RolloutBatch(groups=groups, metrics=mk.check_keys(metrics), pools=pools)
