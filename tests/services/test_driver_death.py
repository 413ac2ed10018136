"""A real 2-rank `ada train` process that loses a rank, and one that loses its driver (issue 22's drill).

Each test starts the CLI as a subprocess on the tiny model and waits for its first metrics row, so
Ray, both ranks and the reward workers are up and training. The processes of the run are the
driver's process tree at that moment (psutil), the /dev/shm entries of the run those processes hold
open or map, plus the rank weights folder (`ada-rank-weights-*`).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ada_core.run.files import METRICS

pytestmark = pytest.mark.slow

SHM = Path("/dev/shm")
TRAIN = ["train", "--preset", "grpo", "--steps", "10000", "--set", "distributed.num_ranks=2",
         "--set", "distributed.startup_timeout_s=240", "--set", "sft_steps=0", "--set", "eval_every=0",
         "--set", "prompts_per_step=4", "--set", "data.train_size=16", "--set", "data.eval_size=4"]


def _start(tiny_model, run: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")])),
           "OMP_NUM_THREADS": "1"}
    driver = subprocess.Popen([sys.executable, "-m", "ada_core.cli", *TRAIN, "--model", str(tiny_model),
                               "--output-dir", str(run)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, start_new_session=True)
    deadline = time.monotonic() + 240
    while not ((run / METRICS).is_file() and (run / METRICS).stat().st_size):
        if driver.poll() is not None or time.monotonic() > deadline:
            driver.kill()
            out, err = driver.communicate()
            pytest.fail(f"the run never trained (exit {driver.returncode}):\n{err[-3000:]}")
        time.sleep(0.2)
    return driver


def _tree(pid: int) -> list:
    import psutil

    return psutil.Process(pid).children(recursive=True)


def _shm_of(processes) -> set[Path]:
    """The /dev/shm entries these processes hold open or map that still have a name."""
    held = set()
    for process in processes:
        try:
            paths = [f.path for f in process.open_files()] + [m.path for m in process.memory_maps(grouped=True)]
        except Exception:  # noqa: BLE001 - gone, or unreadable: not the run's to check
            continue
        held |= {Path(p) for p in paths if p.startswith(f"{SHM}/") and not p.endswith(" (deleted)")}
    return held


def _alive(processes) -> list:
    import psutil

    left = []
    for process in processes:
        try:
            if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                left.append(process)
        except psutil.NoSuchProcess:
            pass
    return left


def _wait_gone(processes, timeout: float) -> list:
    deadline = time.monotonic() + timeout
    while (left := _alive(processes)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def _rank_process(processes, run: Path, rank: int):
    """The rank actor whose stdout is `ranks/rank_<rank>.log` (RankWorker redirects it there)."""
    log = str(run / "ranks" / f"rank_{rank}.log")
    for process in processes:
        try:
            if any(f.path == log for f in process.open_files()):
                return process
        except Exception:  # noqa: BLE001
            continue
    raise AssertionError(f"no process writes {log}")


def test_a_dead_rank_ends_the_cli_with_one_line_naming_it(tiny_model, tmp_path):
    """SIGKILL rank 1 mid-run: `ada train` exits 1 printing one `error:` line and no traceback, and
    its Ray is gone after it."""
    run = tmp_path / "run"
    driver = _start(tiny_model, run)
    try:
        processes = _tree(driver.pid)
        os.kill(_rank_process(processes, run, 1).pid, signal.SIGKILL)
        _, err = driver.communicate(timeout=120)
    finally:
        driver.kill()
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert driver.returncode == 1, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    assert len(errors) == 1, errors
    assert re.fullmatch(rf"error: .*training rank 1 on host \S+ died .*; log: {re.escape(str(run))}/ranks/rank_1\.log",
                        errors[0]), errors[0]
    assert _wait_gone(processes, 20) == []


def test_a_killed_driver_takes_its_ray_and_shm_with_it(tiny_model, tmp_path):
    """SIGKILL the driver mid-run: no handler, finally or atexit runs in it. Within 20 s every process
    it started (Ray's servers and agents, the ranks, the reward workers, the lifeline watcher) is gone,
    and so is every /dev/shm entry of the run."""
    run = tmp_path / "run"
    driver = _start(tiny_model, run)
    processes = []
    try:
        processes = _tree(driver.pid)
        names = " ".join(p.name() for p in processes)
        assert "gcs_server" in names and "raylet" in names, names
        watcher = [p for p in processes if any("lifeline.py" in part for part in p.cmdline())]
        assert watcher, "no lifeline watcher"
        ours = {Path(part) for part in watcher[0].cmdline()[4:]}  # its paths: this run's weights folder
        assert len(ours) == 1 and next(iter(ours)).name.startswith("ada-rank-weights-"), ours
        shm = _shm_of(processes) | ours
        driver.kill()
        driver.wait(timeout=30)
        killed = time.monotonic()
        left = _wait_gone(processes, 20)
        took = time.monotonic() - killed
    finally:
        driver.kill()
        for process in _alive(processes):
            process.kill()
    assert left == [], f"{[(p.pid, p.name()) for p in left]} outlived their driver by 20 s"
    assert not [p for p in shm if p.exists()], "/dev/shm entries of the run outlived its driver"
    print(f"every process of the run gone {took:.1f}s after the driver's SIGKILL")



def test_a_ray_address_where_no_cluster_answers_is_one_line_and_exit_2(tiny_model, tmp_path, free_port):
    """`distributed.ray_address`: the run joins the cluster named there instead of starting a local Ray.
    Where none answers it fails at once, naming the field, with no Ray of its own started (Ray's own
    client retried such an address for over 10 minutes)."""
    address = f"127.0.0.1:{free_port()}"  # nothing listens there
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")]))}
    result = subprocess.run([sys.executable, "-m", "ada_core.cli", *TRAIN, "--set", f"distributed.ray_address={address}",
                             "--model", str(tiny_model), "--output-dir", str(tmp_path / "run")],
                            env=env, capture_output=True, text=True, timeout=300)
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert len(errors) == 1 and f"distributed.ray_address={address}: no Ray cluster answers there" in errors[0], errors
    assert not list((tmp_path / "run").rglob("rank_*.log"))  # no rank was started
