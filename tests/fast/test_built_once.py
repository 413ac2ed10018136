"""Cached builds (named models, SFT warm starts) are built once when several processes need them at once."""

from __future__ import annotations

import json
import multiprocessing
import os
import time
from pathlib import Path

from ada_core.models.build import atomic_build, build_lock, built_once, read_marker

MARKER = {"name": "probe", "version": 1}


def _build_probe(out: str, log: str, started: str) -> str:
    """Build `out` with a builder that records each call in `log` and holds the lock until `started` exists."""
    def build() -> Path:
        with open(log, "a") as handle:
            handle.write(f"{os.getpid()}\n")
        Path(started).touch()
        time.sleep(0.5)  # the other process asks meanwhile; what it does then is the point, not this time
        return atomic_build(Path(out), lambda tmp: (tmp / "weights").write_text("w"), MARKER)

    return str(built_once(Path(out), MARKER, build))


def test_a_second_process_waits_for_the_first_build_and_reuses_it(tmp_path):
    out, log, started = tmp_path / "model", tmp_path / "calls.log", tmp_path / "started"
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(1) as first_pool:
        first = first_pool.apply_async(_build_probe, (str(out), str(log), str(started)))
        deadline = time.monotonic() + 60
        while not started.exists():  # the first process holds the lock and is building
            assert time.monotonic() < deadline, "the first build never started"
            time.sleep(0.05)
        second = _build_probe(str(out), str(log), str(started))
        assert first.get(timeout=60) == second == str(out)
    assert len(log.read_text().split()) == 1  # one build, not one per process
    assert read_marker(out) == MARKER and (out / "weights").read_text() == "w"


def test_a_finished_build_is_returned_without_building_or_locking(tmp_path):
    out = atomic_build(tmp_path / "model", lambda tmp: (tmp / "weights").write_text("w"), MARKER)
    calls = []
    assert built_once(out, MARKER, lambda: calls.append(1)) == out and calls == []
    assert not (tmp_path / ".model.lock").exists()


def test_a_stale_marker_is_rebuilt_and_a_failed_build_frees_the_lock(tmp_path):
    out = atomic_build(tmp_path / "model", lambda tmp: (tmp / "weights").write_text("old"), {"name": "probe"})
    try:
        built_once(out, MARKER, lambda: (_ for _ in ()).throw(RuntimeError("builder failed")))
    except RuntimeError as err:
        assert "builder failed" in str(err)
    else:
        raise AssertionError("the builder's error was swallowed")
    rebuilt = built_once(out, MARKER, lambda: atomic_build(out, lambda tmp: (tmp / "weights").write_text("new"), MARKER))
    assert (rebuilt / "weights").read_text() == "new"
    assert json.loads((out / "ada_model.json").read_text()) == MARKER
    with build_lock(out):  # nothing holds it any more
        pass
