"""What a sampler did in one step, as a flat dict of floats (keys from `ada_core.metrics`).

`docs/METRICS.md` explains each key. Kept apart from `sampling.py` so that file reads as the
algorithm alone; every sampler ends its step with `step_metrics`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from ada_core import metrics as mk
from ada_core.records import Group, PromptPool, VerifierStatus


@dataclass
class StepClock:
    """Wall time inside engine and verifier calls, so the sampler's own time can be told apart."""

    started: float = field(default_factory=time.perf_counter)
    generate_s: float = 0.0
    reward_s: float = 0.0
    active_per_round: list[int] = field(default_factory=list)
    """Prompts in each engine call (round or generation batch), in order."""
    reward_overlap_s: float = 0.0
    """Verifier time that ran while samples were generating (streaming), so not on the step's path."""
    aborted_samples: int = 0
    """Samples started and then aborted (streaming): they are no samples, but their tokens were generated."""
    aborted_tokens: int = 0
    below_capacity_s: float | None = None
    """Seconds the engine held fewer sequences than its concurrency while generating; None if it has no meter."""
    slot_s: float = 0.0
    """Busy slot-seconds over the metered time (ada_core/occupancy.py)."""
    capacity: int = 0
    metered_s: float = 0.0
    """Seconds the engine's occupancy meter covered (the generation calls)."""

    def bookkeeping_s(self) -> float:
        """The sampler's own wall time so far: everything but the engine and verifier calls."""
        busy = self.generate_s + self.reward_s - self.reward_overlap_s
        return max(0.0, time.perf_counter() - self.started - busy)


def step_metrics(
    pools: list[PromptPool],
    groups: list[Group],
    clock: StepClock,
    threshold: float,
    exit_reasons: list[str],
    needed: tuple[int, int] = (0, 0),
) -> dict[str, float]:
    """The metric dict of one step, without sampler/bookkeeping_s (the caller adds it last).

    pools: every prompt drawn this step (DAPO's extra batches included); groups: the kept ones.
    exit_reasons: the reasons this sampler can give, each logged (zeros too) as sampler/exit_{reason}.
    needed: (positives, negatives) the exit rule asks for, to split unresolved prompts by what they lack.
    """
    drawn = len(pools)
    sizes = [len(pool.samples) for pool in pools]
    positives = [pool.num_positive(threshold) for pool in pools]
    trained = [s for g in groups for s in g.samples]
    # One pass over every generated sample (~16k a step at paper scale).
    tokens = truncated = round0_count = 0
    round0_reward = 0.0
    prompt_rates = []  # each prompt's round-1 pass rate: every prompt weighs alike, whatever it was allocated
    statuses = dict.fromkeys(VerifierStatus, 0)
    for pool in pools:
        first = [s.reward for s in pool.samples if s.round == 0]
        if first:
            prompt_rates.append(sum(first) / len(first))  # type: ignore[arg-type]
        for s in pool.samples:
            tokens += len(s.completion_ids)
            truncated += s.truncated
            statuses[s.status] += 1
            if s.round == 0:
                round0_count += 1
                round0_reward += s.reward  # type: ignore[operator]
    generated = sum(sizes)

    out = {
        mk.SAMPLER_PROMPTS_DRAWN: drawn,
        mk.SAMPLER_GROUPS_KEPT: len(groups),
        mk.SAMPLER_EFFECTIVE_RATIO: sum(not g.is_uniform for g in groups) / drawn,
        mk.SAMPLER_ALL_CORRECT_FRAC: sum(0 < size == pos for size, pos in zip(sizes, positives)) / drawn,
        mk.SAMPLER_ALL_WRONG_FRAC: sum(size > 0 and pos == 0 for size, pos in zip(sizes, positives)) / drawn,
        mk.SAMPLER_ROUNDS: len(clock.active_per_round),
        mk.SAMPLER_SAMPLES_PER_PROMPT_MEAN: generated / drawn,
        mk.SAMPLER_SAMPLES_PER_PROMPT_MAX: max(sizes),
        mk.SAMPLER_P_HAT_MEAN: _mean([pool.p_hat for pool in pools if pool.samples]),
        mk.BUDGET_GENERATED_SAMPLES: generated,
        mk.BUDGET_GENERATED_TOKENS: tokens + clock.aborted_tokens,
        mk.BUDGET_COMMITTED_TOKENS: tokens,
        mk.BUDGET_ABORTED_TOKENS: clock.aborted_tokens,
        mk.BUDGET_ABORTED_SAMPLES: clock.aborted_samples,
        mk.BUDGET_TRAINED_SAMPLES: len(trained),
        mk.BUDGET_TRAINED_TOKENS: sum(len(s.completion_ids) for s in trained),
        mk.REWARD_MEAN: round0_reward / round0_count if round0_count else 0.0,
        mk.REWARD_PROMPT_MEAN: _mean(prompt_rates),
        mk.REWARD_TRAINED_MEAN: _mean([s.reward for s in trained]),  # type: ignore[misc]
        mk.RESPONSE_LENGTH_MEAN: tokens / generated if generated else 0.0,
        mk.RESPONSE_TRUNCATED_FRAC: truncated / generated if generated else 0.0,
        mk.TIME_GENERATE_S: clock.generate_s,
        mk.TIME_REWARD_S: clock.reward_s,
        mk.TIME_REWARD_OVERLAP_S: clock.reward_overlap_s,
    }
    if clock.below_capacity_s is not None and clock.metered_s > 0:
        out[mk.ROLLOUT_IDLE_FRACTION] = min(1.0, clock.below_capacity_s / clock.metered_s)
        out[mk.ROLLOUT_UNUSED_SLOT_FRACTION] = max(0.0, 1.0 - clock.slot_s / (clock.capacity * clock.metered_s))
    for r, active in enumerate(clock.active_per_round):
        out[mk.active_prompts_key(r)] = active
    for reason in exit_reasons:
        out[mk.exit_reason_key(reason)] = sum(pool.exit_reason == reason for pool in pools)
    for status, count in statuses.items():
        out[mk.verifier_status_key(status.value)] = count

    need_pos, need_neg = needed
    unresolved = [(size, pos) for size, pos, pool in zip(sizes, positives, pools) if pool.exit_reason == "unresolved"]
    out[mk.SAMPLER_UNRESOLVED] = len(unresolved)
    out[mk.SAMPLER_UNRESOLVED_NO_POS] = sum(pos < need_pos for _, pos in unresolved)
    out[mk.SAMPLER_UNRESOLVED_NO_NEG] = sum(size - pos < need_neg for size, pos in unresolved)
    return {k: float(v) for k, v in out.items()}


def _mean(values: list[float]) -> float:
    return float(sum(values) / len(values)) if values else 0.0
