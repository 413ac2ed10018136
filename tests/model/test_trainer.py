"""The real trainer on the tiny model: a few steps of GRPO and Ada-balance, checkpoints and resume."""

from __future__ import annotations

import json
import math
import os

import pytest
import torch
from support import listeners_beyond_loopback
from support import tiny_config as _config

from ada_core import metrics as K
from ada_core.run.checkpoints import latest_checkpoint
from ada_core.run.files import read_metrics
from ada_core.training import run_steps, setup

pytestmark = pytest.mark.slow

# Every step must log these, whatever the preset: the budget and time split make comparisons honest.
REQUIRED = [
    K.SAMPLER_EFFECTIVE_RATIO, K.SAMPLER_ALL_CORRECT_FRAC, K.SAMPLER_ALL_WRONG_FRAC,
    K.SAMPLER_SAMPLES_PER_PROMPT_MEAN, K.SAMPLER_SAMPLES_PER_PROMPT_MAX, K.SAMPLER_P_HAT_MEAN,
    K.BUDGET_GENERATED_SAMPLES_CUM, K.BUDGET_GENERATED_TOKENS_CUM, K.BUDGET_TRAINED_SAMPLES_CUM,
    K.BUDGET_TRAINED_TOKENS_CUM, K.BUDGET_LOGPROB_TOKENS_CUM,
    K.TIME_GENERATE_S, K.TIME_REWARD_S, K.TIME_UPDATE_S, K.TIME_SYNC_S, K.TIME_STEP_S, K.TIME_ELAPSED_S,
    K.REWARD_MEAN, K.RESPONSE_LENGTH_MEAN, K.RESPONSE_TRUNCATED_FRAC,
    K.TRAIN_LOSS, K.TRAIN_ENTROPY, K.TRAIN_CLIP_FRAC, K.TRAIN_APPROX_KL, K.TRAIN_GRAD_NORM, K.TRAIN_LR,
    K.THROUGHPUT_GEN_TOKENS_PER_S, "verifier/ok",
]


@pytest.mark.parametrize("preset", ["grpo", "ada-balance"])
def test_a_few_steps_train_for_real(preset, tmp_path):
    state = setup(_config(preset, steps=3), tmp_path / preset)
    try:
        before = [p.detach().clone() for p in state.updater.module.parameters()]
        last = run_steps(state)
        after = list(state.updater.module.parameters())
        # The 1-rank process group listens on loopback alone (torch's TCPStore took `::` before).
        assert listeners_beyond_loopback(os.getpid()) == []
    finally:
        state.close()

    assert math.isfinite(last[K.TRAIN_LOSS])
    assert any(not torch.equal(a, b) for a, b in zip(before, after)), "no weight changed"
    missing = [k for k in REQUIRED if k not in last]
    assert not missing, f"metric keys missing: {missing}"
    assert all(K.is_valid_key(k) for k in last)

    rows = read_metrics(tmp_path / preset)
    step_rows = [r for r in rows if K.TRAIN_LOSS in r]
    assert [r["step"] for r in step_rows] == [1, 2, 3]
    cum = [r[K.BUDGET_GENERATED_SAMPLES_CUM] for r in step_rows]
    assert cum == sorted(cum) and cum[-1] == sum(r[K.BUDGET_GENERATED_SAMPLES] for r in step_rows)
    evals = [r for r in rows if K.EVAL_AVG_AT_K in r]
    assert [r["step"] for r in evals] == [0, 2, 3]
    assert all(0.0 <= r[K.EVAL_AVG_AT_K] <= r[K.EVAL_PASS_AT_K] <= 1.0 for r in evals)
    generations = (tmp_path / preset / "generations.jsonl").read_text().splitlines()
    assert generations and {"prompt", "completion", "reward"} <= set(json.loads(generations[0]))
    if preset == "ada-balance":
        # Ada draws more than n per prompt on average: the budget must show it.
        assert step_rows[-1][K.SAMPLER_SAMPLES_PER_PROMPT_MEAN] >= 4
    assert latest_checkpoint(tmp_path / preset).name == "step_000003"


def test_resume_gives_the_same_next_prompts(tmp_path):
    first = setup(_config("ada-balance", steps=2), tmp_path / "a")
    try:
        run_steps(first)
        expected_ids = [p.id for p in first.source.take(8)]
        expected_draw = first.rng.random()
        expected_weights = [p.detach().clone() for p in first.updater.module.parameters()]
    finally:
        first.close()

    resumed = setup(_config("ada-balance", steps=4), tmp_path / "b", resume=tmp_path / "a")
    try:
        assert resumed.step == 2
        assert [p.id for p in resumed.source.take(8)] == expected_ids
        assert resumed.rng.random() == expected_draw
        for a, b in zip(expected_weights, resumed.updater.module.parameters()):
            torch.testing.assert_close(a, b.detach())
        # Totals carry over, so cumulative budgets continue instead of restarting at zero.
        assert resumed.totals[K.BUDGET_GENERATED_SAMPLES_CUM] > 0
        assert [r["step"] for r in read_metrics(tmp_path / "b") if K.TRAIN_LOSS in r] == [1, 2]
    finally:
        resumed.close()


