"""Rollout across the training ranks: the `RolloutEngine` for the transformers engine with
`distributed.num_ranks > 1`. Each rank samples a contiguous run of a round's requests on its own
copy of the weights (identical on every rank: data parallelism), seeded by the requests' global
indices, so the round's samples are the ones one in-process engine would draw.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence

from ada_core.engines.requests import check_requests
from ada_core.protocols import RolloutEngine, SamplingParams
from ada_core.records import Prompt, Sample


class RankRolloutEngine(RolloutEngine):
    """`RolloutEngine` over the ranks' in-process engines: one call per round, split across ranks.

    Requests are cut into contiguous runs balanced by k x (prompt + max_tokens); rank r samples its run
    with the call's seed and the requests' global indices, so the result equals one engine's."""

    def __init__(self, group):  # a rank_group.RankGroup
        self.group = group

    def generate(self, requests: Sequence[tuple[Prompt, int]], sampling: SamplingParams) -> list[list[Sample]]:
        check_requests(requests, sampling)
        if sampling.seed is None:  # one base seed for every rank, as one engine would draw
            sampling = dataclasses.replace(sampling, seed=random.SystemRandom().getrandbits(63))
        costs = [k * (len(p.prompt_ids) + sampling.max_tokens) for p, k in requests]
        runs = split_contiguous(costs, self.group.num_ranks)
        busy = [r for r, (a, b) in enumerate(runs) if b > a]
        answers = self.group.generate_on([(r, list(requests[runs[r][0]:runs[r][1]]), runs[r][0]) for r in busy], sampling)
        out: list[list[Sample]] = []
        for part in answers:
            out.extend(part)
        return out if busy else [[] for _ in requests]


def split_contiguous(costs: list[int], parts: int) -> list[tuple[int, int]]:
    """Cut indices 0..n-1 into `parts` contiguous [start, end) runs of near-equal total cost.

    [4, 4, 4, 4], 2 -> [(0, 2), (2, 4)]; [9, 1, 1, 1], 2 -> [(0, 1), (1, 4)]."""
    total = sum(costs)
    bounds, start, acc = [], 0, 0
    for r in range(parts - 1):
        target = total * (r + 1) / parts
        end = start
        while end < len(costs) and acc + costs[end] / 2 < target:
            acc += costs[end]
            end += 1
        bounds.append((start, end))
        start = end
    bounds.append((start, len(costs)))
    return bounds
