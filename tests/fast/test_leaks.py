"""What a part makes, it releases: when it closes, and when it fails half-way through its own set-up."""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path

import pytest
import support

from ada_core.engines.vllm_engine import VLLMRolloutEngine
from ada_core.engines.vllm_server import VLLMServerError
from ada_core.engines.vllm_stream import VLLMSampleStreamer
from ada_core.occupancy import OccupancyMeter


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_engine_whose_server_does_not_answer_leaves_no_sync_folder_thread_or_client(tmp_path):
    before = set(threading.enumerate())
    with pytest.raises(VLLMServerError, match="cannot list models") as failure:
        VLLMRolloutEngine(f"http://127.0.0.1:{_closed_port()}", sync_root=tmp_path, request_timeout_s=5)
    assert list(tmp_path.iterdir()) == []  # its ada-weight-sync-* folder went with it
    engine = support.locals_of(failure, "__init__")["self"]
    assert engine._client.is_closed and engine._pool._shutdown  # its HTTP client and request threads
    assert set(threading.enumerate()) <= before


def test_a_closed_streamer_closes_its_event_loop_and_thread():
    streamer = VLLMSampleStreamer(f"http://127.0.0.1:{_closed_port()}", "m", concurrency=2, request_timeout_s=5,
                                  meter=OccupancyMeter(2), error=RuntimeError)
    thread = streamer._thread
    streamer.close()
    assert streamer._loop.is_closed() and not thread.is_alive()
    streamer.close()  # idempotent


class _Part:
    """A run's part that records its close, and fails it when told to."""

    def __init__(self, closed: list[str], name: str, fails: bool = False):
        self.closed, self.name, self.fails = closed, name, fails

    def close(self) -> None:
        self.closed.append(self.name)
        if self.fails:
            raise RuntimeError(f"{self.name} failed to close")


def test_run_state_closes_every_part_when_one_fails_to_close():
    from ada_core.training.loop import RunState

    closed: list[str] = []
    state = RunState(config=None, output_dir=None, tokenizer=None, rollout=_Part(closed, "rollout"),
                     updater=_Part(closed, "updater"), verifier=_Part(closed, "verifier", fails=True), source=None,
                     eval_prompts=[], rng=None, ledger=_Part(closed, "ledger"))
    with pytest.raises(RuntimeError, match="verifier failed to close"):
        state.close()
    assert closed == ["ledger", "verifier", "rollout", "updater"]  # the rollout engine (a vLLM server) too


def test_a_killed_runs_staged_weights_are_removed_by_the_next_start(tmp_path):
    """A run SIGKILLed with weights staged in its sync folder (on /dev/shm, a full copy of the model in RAM)
    leaves them behind; the next engine's start removes them. A live process's folder, another machine's or
    boot's (a shared sync_dir), and one whose name says no owner stay."""
    import signal
    import subprocess
    import sys

    from ada_core.engines.vllm_engine import SYNC_PREFIX, make_sync_dir

    code = ("import os, sys; from ada_core.engines.vllm_engine import make_sync_dir; "
            "d = make_sync_dir(sys.argv[1]); (d / 'v3').mkdir(); (d / 'v3' / 'model.safetensors').write_bytes(b'w' * 1024); "
            "print(d, flush=True); sys.stdin.read()")
    killed = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[2])
    left = Path(killed.stdout.readline().strip())
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    assert (left / "v3" / "model.safetensors").is_file()
    live = make_sync_dir(tmp_path)  # this process's: alive
    other_host = tmp_path / f"{SYNC_PREFIX}{os.getpid()}.1.00000000-abc"
    unnamed = tmp_path / f"{SYNC_PREFIX}k2j3h4"
    for folder in (other_host, unnamed):
        folder.mkdir()
    mine = make_sync_dir(tmp_path)
    assert not left.exists()
    assert live.is_dir() and mine.is_dir() and other_host.is_dir() and unnamed.is_dir()
