"""`rollout.async_steps` (ada_core/training/feed.py) on the session's real vLLM server: the next batch
is drawn while the trainer updates, staleness is logged and bounded, and a killed and resumed run
has each (step, prompt) once. Two servers: tests/services/test_vllm_pool.py."""

from __future__ import annotations

import json
import math
from collections import Counter

import pytest

from ada_core import metrics as K
from ada_core.config import build_config
from ada_core.run.files import read_metrics
from ada_core.run.ledger import read_rows
from ada_core.training import Callbacks, run_steps, setup

pytestmark = pytest.mark.slow

RUN = {"prompts_per_step": 8, "eval_every": 0, "checkpoint_every": 0, "sft_steps": 0,
       "data": {"train_size": 24, "eval_size": 8}, "loss": {"tis_cap": 2.0}}


def _config(preset, url, steps, async_steps=1, **extra):
    return build_config(preset, "tiny", overrides={**RUN, "steps": steps, **extra, "rollout": {
        "engine": "vllm", "async_steps": async_steps, "vllm": {"base_url": url}}})


@pytest.mark.parametrize("preset,sampler", [("grpo", {}), ("dapo", {}), ("ada-balance", {"schedule": "rounds"}),
                                            ("ada-posterior", {})])  # est: the kill-and-resume test below
def test_async_steps_1_trains_with_each_sampler(preset, sampler, vllm_server, tmp_path):
    evals = {"eval_every": 2, "eval_k": 2} if preset == "grpo" else {}  # evaluation on the rollout thread, once
    state = setup(_config(preset, vllm_server.base_url, 2, sampler=sampler, **evals), tmp_path / "run")
    try:
        last = run_steps(state)
        assert state.rollout.server_weight_version() == "2"  # the last update's weights were loaded at the end
    finally:
        state.close()
    assert math.isfinite(last[K.TRAIN_LOSS]) and (K.EVAL_AVG_AT_K in last) == (preset == "grpo")
    rows = [r for r in read_metrics(tmp_path / "run") if K.TRAIN_LOSS in r]
    # Batch 2 was drawn on the initial weights while update 1 ran: one update old, never more.
    assert [r[K.ASYNC_POLICY_VERSION] for r in rows] == [0, 0]
    assert [r[K.ASYNC_STALENESS_MAX] for r in rows] == [0, 1] and rows[1][K.ASYNC_STALENESS_MEAN] == 1
    assert all(0 <= r[K.TIME_OVERLAP_S] <= r[K.TIME_STEP_S] for r in rows), [r[K.TIME_OVERLAP_S] for r in rows]
    assert all(0 <= r[K.server_idle_key(0)] <= 1 for r in rows)
    drawn = Counter(r["step"] for r in read_rows(tmp_path / "run"))  # dapo draws more batches per step
    assert [drawn[1], drawn[2]] == [r[K.SAMPLER_PROMPTS_DRAWN] for r in rows] and min(drawn.values()) >= 8


def test_async_steps_2_draws_two_batches_ahead_and_never_older(vllm_server, tmp_path):
    """k = 2: batch b is drawn on the weights of update max(0, b - 3), so from batch 3 on every batch is
    two updates old, the bound, and never older."""
    state = setup(_config("grpo", vllm_server.base_url, 4, async_steps=2), tmp_path / "run")
    try:
        run_steps(state)
    finally:
        state.close()
    rows = [r for r in read_metrics(tmp_path / "run") if K.TRAIN_LOSS in r]
    assert [r[K.ASYNC_POLICY_VERSION] for r in rows] == [0, 0, 0, 1]
    assert [r[K.ASYNC_STALENESS_MAX] for r in rows] == [0, 1, 2, 2]
    assert all(r[K.ASYNC_STEPS] == 2 for r in rows)


class Killed(RuntimeError):
    pass


def test_a_killed_and_resumed_async_run_loses_and_repeats_no_sample(vllm_server, tmp_path):
    """Est (per-prompt pass-rate estimates kept across steps) with async_steps=1: when the step-2 checkpoint is
    written, batch 3 is already being drawn; the checkpoint keeps the state from before it, so the
    resumed run draws batch 3 again and the ledger has each (step, prompt) once."""
    config = _config("ada-est", vllm_server.base_url, 4, checkpoint_every=2,
                     ledger={"url": f"sqlite:///{tmp_path / 'l.db'}"})
    run_dir = tmp_path / "run"

    def kill_at_3(step, _metrics):
        if step == 3:
            raise Killed("killed after step 3")

    state = setup(config, run_dir)
    try:
        with pytest.raises(Killed):
            run_steps(state, callbacks=Callbacks(on_step=kill_at_3))
    finally:
        state.close()
    saved = json.loads((run_dir / "checkpoints" / "step_000002" / "trainer_state.json").read_text())
    assert saved["source"]["position"] == 16 and saved["source"]["epoch"] == 0  # before batch 3, not after
    assert {r["step"] for r in read_rows(run_dir)} == {1, 2, 3}

    resumed = setup(config, run_dir, resume=run_dir)
    try:
        assert resumed.sampler.state_dict() == saved["sampler"]
        run_steps(resumed)
    finally:
        resumed.close()
    rows = read_rows(run_dir)
    assert max(Counter((r["step"], r["prompt_id"]) for r in rows).values()) == 1
    assert Counter(r["step"] for r in rows) == {1: 8, 2: 8, 3: 8, 4: 8}
    steps = [r for r in read_metrics(run_dir) if K.TRAIN_LOSS in r]
    assert [r["step"] for r in steps] == [1, 2, 3, 4]
    # Resumed at step 2 on the checkpoint's weights: batch 3 is fresh, batch 4 one update old again.
    assert [r[K.ASYNC_STALENESS_MAX] for r in steps] == [0, 1, 0, 1]
    assert all(r[K.ASYNC_STALENESS_MAX] <= r[K.ASYNC_STEPS] == 1 for r in steps)
