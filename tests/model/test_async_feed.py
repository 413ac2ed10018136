"""`rollout.async_steps` (ada_core/training/feed.py) on the real tiny model in this process: the engine is the
transformers engine on a copy of the policy of its own, loaded only through `stage_weights` /
`load_staged` as a vLLM server is (tests/support.py `own_weights_engine`), so the feed, the real update
and the real sampling run here without a vLLM install. The same on the session's vLLM server:
tests/services/test_async_rollout.py."""

from __future__ import annotations

import pytest
import torch
from support import with_own_weights_engine

from ada_core import metrics as K
from ada_core.config import build_config
from ada_core.models import load_policy
from ada_core.run.files import read_generations, read_metrics
from ada_core.run.ledger import read_rows
from ada_core.training import Callbacks, run_steps, setup

pytestmark = pytest.mark.slow

RUN = {"prompts_per_step": 4, "eval_every": 0, "checkpoint_every": 0, "eval_k": 2,
       "data": {"train_size": 16, "eval_size": 4}, "loss": {"tis_cap": 2.0}}


def _config(preset: str, steps: int, **extra):
    return build_config(preset, "tiny", overrides={**RUN, "steps": steps, **extra, "rollout": {
        "engine": "vllm", "async_steps": 1, "vllm": {"base_url": "http://127.0.0.1:9"}}})  # never contacted


def test_a_failed_weight_load_ends_the_step_before_its_evaluation(monkeypatch, tiny_model, tmp_path):
    """Update 2's weights fail to load (the engine keeps version 1, as a server whose reload failed does):
    step 2's evaluation must not be scored on version 1 and logged as step 2's; the run stops with
    one error naming the load."""
    def fail(version):
        if version == 2:
            raise RuntimeError("reload_weights answered 500")

    engines = with_own_weights_engine(monkeypatch, fail_load=fail)
    run = tmp_path / "run"
    state = setup(_config("grpo", 3, eval_every=2, sft_steps=0), run)
    try:
        with pytest.raises(RuntimeError) as failure:
            run_steps(state)
    finally:
        state.close()
    rows = read_metrics(run)
    assert [r["step"] for r in rows if K.EVAL_AVG_AT_K in r] == [0], rows  # step 0's, never step 2's on version 1
    assert read_generations(run, 2) == []
    assert engines[0].loaded == [1] and engines[0].weight_version == 1
    from ada_core.training.feed import WeightLoadError

    assert isinstance(failure.value, WeightLoadError), repr(failure.value)
    message = str(failure.value)
    assert "weight version 2" in message and "reload_weights answered 500" in message
    assert "evaluation" in message and len(message.splitlines()) == 1, message


class Killed(RuntimeError):
    pass


def without_timing(rows: list[dict]) -> list[dict]:
    """The rows but for what wall time decides: durations, and `sync/*` (the newest weight load that had
    finished when the step's batch arrived, docs/METRICS.md)."""
    return [{k: v for k, v in r.items() if not (k.startswith(("time/", "throughput/", "sync/")) or k.endswith("_s"))}
            for r in rows]


def test_a_killed_and_resumed_async_run_is_the_uninterrupted_run(monkeypatch, tiny_model, tmp_path):
    """Est (per-prompt estimates kept across steps) with async_steps=1, 4 steps, a checkpoint at 2: when it
    is written batch 3 is already drawn on version 1. Killed after step 3 and resumed from step 2, the
    run must train that batch on version 1 again (not a fresh one on version 2) and from there be the
    uninterrupted run: every metrics row (but wall times), every ledger row, the final weights."""
    with_own_weights_engine(monkeypatch)

    def config(name):
        # The tiny profile's SFT start: rewards to learn from, so the versions differ.
        return _config("ada-est", 4, checkpoint_every=2, eval_every=2,
                       ledger={"url": f"sqlite:///{tmp_path / name}.db"})

    whole = tmp_path / "whole"
    state = setup(config("whole"), whole)
    try:
        run_steps(state)
    finally:
        state.close()

    def kill_at_3(step, _metrics):
        if step == 3:
            raise Killed("killed after step 3")

    run = tmp_path / "run"
    state = setup(config("run"), run)
    try:
        with pytest.raises(Killed):
            run_steps(state, callbacks=Callbacks(on_step=kill_at_3))
    finally:
        state.close()
    resumed = setup(config("run"), run, resume=run)
    try:
        assert resumed.step == 2
        run_steps(resumed)
    finally:
        resumed.close()

    steps = [r for r in read_metrics(run) if K.TRAIN_LOSS in r]
    assert [r[K.ASYNC_POLICY_VERSION] for r in steps] == [0, 0, 1, 2]  # batch 3 on version 1, as uninterrupted
    assert [r[K.ASYNC_STALENESS_MAX] for r in steps] == [0, 1, 1, 1]
    assert all(r[K.REWARD_MEAN] > 0 for r in steps), steps  # the updates learn: the versions differ
    assert without_timing(read_metrics(run)) == without_timing(read_metrics(whole))
    assert read_rows(run) == read_rows(whole)
    assert read_generations(run) == read_generations(whole)
    final = {k: v for k, v in load_policy(run / "checkpoints" / "step_000004" / "hf")[0].state_dict().items()}
    for name, tensor in load_policy(whole / "checkpoints" / "step_000004" / "hf")[0].state_dict().items():
        assert torch.equal(tensor, final[name]), name
