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
from ada_core.training.feed import load_ahead

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


def test_a_failed_weight_load_is_seen_before_the_steps_evaluation(vllm_server, tmp_path, monkeypatch):
    """The server's reload of update 2's weights fails (it keeps version 1): step 2's evaluation is not
    scored on version 1 and logged as step 2's; the run stops with one error naming the load. The same
    on the in-process engine: tests/model/test_async_feed.py."""
    from ada_core.engines.vllm_engine import VLLMRolloutEngine, WeightSyncError
    from ada_core.training.feed import WeightLoadError

    reload = VLLMRolloutEngine.reload_weights

    def failing(self, folder, version):
        if version == 2:
            raise WeightSyncError("weight sync to version 2: /collective_rpc answered 500")
        return reload(self, folder, version)

    monkeypatch.setattr(VLLMRolloutEngine, "reload_weights", failing)
    run = tmp_path / "run"
    state = setup(_config("grpo", vllm_server.base_url, 3, eval_every=2, eval_k=2), run)
    try:
        with pytest.raises(WeightLoadError, match="weight version 2") as failure:
            run_steps(state)
        assert state.rollout.server_weight_version() == "1"
    finally:
        state.close()
    assert [r["step"] for r in read_metrics(run) if K.EVAL_AVG_AT_K in r] == [0]
    assert "evaluation" in str(failure.value) and "answered 500" in str(failure.value)


class Killed(RuntimeError):
    pass


def test_a_killed_and_resumed_async_run_loses_and_repeats_no_sample(vllm_server, tmp_path):
    """Est (per-prompt pass-rate estimates kept across steps) with async_steps=1: when the step-2 checkpoint is
    written, batch 3 is already being drawn on version 1; the checkpoint waits for it and holds it with
    the state after it, so the resumed run trains that batch on version 1, as the uninterrupted run
    does, and the ledger has each (step, prompt) once. (Equal to the uninterrupted run row for row:
    tests/model/test_async_feed.py.)"""
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
    assert saved["source"]["position"] == 24 and saved["source"]["epoch"] == 0  # after batch 3, which it holds
    [ahead] = load_ahead(run_dir / "checkpoints" / "step_000002")
    assert (ahead.step, ahead.version) == (3, 1) and len(ahead.batch.pools) == 8
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
    # Batch 3 came from the checkpoint, drawn on version 1; batch 4 was drawn on the checkpoint's weights.
    assert [r[K.ASYNC_POLICY_VERSION] for r in steps] == [0, 0, 1, 2]
    assert [r[K.ASYNC_STALENESS_MAX] for r in steps] == [0, 1, 1, 1]
    assert all(r[K.ASYNC_STALENESS_MAX] <= r[K.ASYNC_STEPS] == 1 for r in steps)
