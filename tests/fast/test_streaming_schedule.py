"""The streaming schedule's bookkeeping and seeds, with no engine: which samples start, commit and abort."""

from __future__ import annotations

import random

import numpy as np

from ada_core.config import SamplerConfig
from ada_core.sampling.streaming import StreamSchedule, sample_seed, shortest_prefix

CFG = {"name": "ada", "exit_rule": "balance", "n": 4, "M0": 4, "M": 4, "N": 4, "schedule": "streaming", "window": 6}


# --- the schedule alone ---------------------------------------------------------------------------
def _drive(schedule: StreamSchedule, rewards: list[list[float]], order: random.Random, threshold: float):
    """Finish started samples in a random order; return each prompt's committed rewards."""
    pools: list[list[float]] = [[] for _ in rewards]
    running = []
    while True:
        for i, j0, count in schedule.starts():
            running += [(i, j0 + k) for k in range(count)]
        if not running:
            return pools
        i, j = running.pop(order.randrange(len(running)))
        committed, aborted = schedule.finished(i, j, rewards[i][j] > threshold)
        pools[i] += [rewards[i][k] for k in committed]
        running = [(a, b) for a, b in running if not (a == i and b in aborted)]


def test_the_schedule_commits_the_shortest_qualifying_prefix_whatever_the_finish_order():
    cfg = SamplerConfig(**CFG)
    rng = np.random.default_rng(0)
    rates = [0.0, 1.0, 0.5, 0.1, 0.9, 0.3] * 4
    rewards = [(rng.random(cfg.max_samples_per_prompt) < p).astype(float).tolist() for p in rates]
    expected = [r[: shortest_prefix(r, cfg)] for r in rewards]
    for seed in range(3):
        schedule = StreamSchedule(len(rates), cfg, window=cfg.window, capacity=10)
        assert _drive(schedule, rewards, random.Random(seed), cfg.positive_threshold) == expected
        assert schedule.idle() and schedule.in_flight == 0

    # A global cap holds exactly: started-and-not-aborted samples never pass it, and all of it is spent.
    capped = SamplerConfig(**CFG, global_sample_cap=21)
    schedule = StreamSchedule(len(rates), capped, window=capped.window, capacity=10)
    pools = _drive(schedule, rewards, random.Random(5), capped.positive_threshold)
    assert sum(map(len, pools)) == 21
    assert all(pool == r[: len(pool)] for pool, r in zip(pools, rewards))


def test_sample_seeds_are_consecutive_per_prompt_and_differ_across_prompts_and_steps():
    assert sample_seed(3, "a", 5) == sample_seed(3, "a", 0) + 5
    assert len({sample_seed(3, "a", 0), sample_seed(3, "b", 0), sample_seed(4, "a", 0)}) == 3
    assert sample_seed(3, "a", 100) < 2**63


def test_a_server_with_fewer_slots_than_a_block_still_fills_every_pool():
    """rollout.vllm.concurrency < window // 4 once started nothing (every pool empty, the step trained on no
    group); a block now never waits for more slots than the server has."""
    cfg = SamplerConfig(**{**CFG, "window": 8})
    rng = np.random.default_rng(1)
    rates = [0.2, 0.5, 0.8]
    rewards = [(rng.random(cfg.max_samples_per_prompt) < p).astype(float).tolist() for p in rates]
    expected = [r[: shortest_prefix(r, cfg)] for r in rewards]
    for capacity in (1, 2):  # window // 4 = 2 slots a block wanted
        schedule = StreamSchedule(len(rates), cfg, window=cfg.window, capacity=capacity)
        assert _drive(schedule, rewards, random.Random(capacity), cfg.positive_threshold) == expected
        assert schedule.idle()


def test_a_carried_prompt_starts_its_samples_before_a_later_steps_prompts():
    """Carry-over: prompts of a later step join with sample index 0 while a carried one needs samples far
    down its sequence. Lowest index first would give every slot to the newcomers, step after step, and leave
    the carried pool (and the versions of its committed samples) to age; an older cohort starts first, and
    within a cohort the lowest index still does."""
    cfg = SamplerConfig(**CFG)
    schedule = StreamSchedule(0, cfg, window=cfg.window, capacity=cfg.window + 2)
    old = schedule.add_prompt([True, True, True], cohort=1)  # carried: 3 committed, one kind only
    new = [schedule.add_prompt(cohort=2) for _ in range(3)]
    # its whole window, though its next index is 3; the newcomers get the 2 slots it leaves
    assert schedule.starts() == [(old, 3, cfg.window), (new[0], 0, 2)]
    same = StreamSchedule(0, cfg, window=cfg.window, capacity=cfg.window)
    first = same.add_prompt([True, True, True], cohort=1)
    second = same.add_prompt(cohort=1)
    assert same.starts()[0][0] == second  # one cohort: the lowest next index first, as before
    assert first != second
