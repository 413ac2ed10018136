"""Helpers more than one test tier uses (tests/ is on sys.path through its conftest.py)."""

from __future__ import annotations

import numpy as np

from ada_core.data.source import PromptSource
from ada_core.protocols import SamplingParams
from ada_core.run.ledger import Ledger
from ada_core.sampling.simulate import (
    BernoulliEngine,
    BernoulliVerifier,
    budgeted_methods,
    default_methods,
    make_prompts,
)


def simulated_run(ledgers: list[Ledger], steps: int = 3, prompts: int = 24, method: str = "ada-est"):
    """Drive a sampler on the Bernoulli engine, recording every step in each ledger; returns the batches."""
    sampler = {**default_methods(), **budgeted_methods()}[method]
    source = PromptSource(make_prompts(48, np.random.default_rng(0)), seed=0)
    batches = []
    for step in range(1, steps + 1):
        batch = sampler.sample(source.take(prompts), BernoulliEngine(), BernoulliVerifier(), SamplingParams(max_tokens=14),
                               np.random.default_rng(step), source=source)
        for ledger in ledgers:
            ledger.record(step, batch.pools, {g.prompt.id for g in batch.groups})
        batches.append(batch)
    for ledger in ledgers:
        ledger.flush()
    return batches
