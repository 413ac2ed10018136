"""Helpers more than one test tier uses (tests/ is on sys.path through its conftest.py)."""

from __future__ import annotations

import numpy as np

from ada_core.config import build_config
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


# A short run on the tiny profile: small data, frequent evaluation and checkpoints.
SMALL = {
    "prompts_per_step": 8,
    "eval_every": 2,
    "checkpoint_every": 2,
    "data": {"train_size": 96, "eval_size": 16},
    "eval_k": 2,
}


def tiny_config(preset: str, steps: int, **extra):
    """`preset` on the tiny profile for `steps` steps, with SMALL and `extra` layered on."""
    return build_config(preset, "tiny", overrides={**SMALL, "steps": steps, **extra})


def write_run_folder(run_dir, label: str, seed: int, accuracy: list[float], samples_per_step: float,
                     num_params: int = 1000):
    """A run folder as a finished run leaves it (metrics.jsonl, run_info.json), with an eval at every step:
    step k has held-out accuracy `accuracy[k]` and generated `samples_per_step` samples (step 0: none)."""
    import json
    from pathlib import Path

    from ada_core import metrics as K

    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    rows = [{"step": 0, K.EVAL_AVG_AT_K: accuracy[0]}]
    for step in range(1, len(accuracy)):
        rows.append({"step": step, K.REWARD_MEAN: accuracy[step] / 2, K.BUDGET_GENERATED_SAMPLES: samples_per_step,
                     K.BUDGET_GENERATED_SAMPLES_CUM: samples_per_step * step})
        rows.append({"step": step, K.EVAL_AVG_AT_K: accuracy[step]})
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run_dir / "run_info.json").write_text(json.dumps({"label": label, "seed": seed, "num_params": num_params}))
    return run_dir
