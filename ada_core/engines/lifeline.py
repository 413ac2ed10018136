"""End what a driver started when the driver dies, however it dies (SIGKILL included).

    python lifeline.py <lifeline fd> <tag> [path ...]

`Lifeline` (the driver's end) starts this file as a watcher in a session of its own, holding the
read end of a pipe whose only write end is in the driver. When the driver ends, the kernel closes
the write end and the watcher's read returns EOF. The watcher then SIGKILLs the processes it was
told of, and every process of this user whose environment carries `ADA_LIFELINE=<tag>`, removes
the paths it was given, and exits. `Lifeline.close` (the driver's own tear-down) closes the pipe the
same way, so the watcher also sweeps up whatever a clean shutdown left.

Two marks, because neither finds every process alone:
- `watch(pids)`: the driver writes the processes it knows of now into the pipe, each with its start
  time, so a pid reused by another process later is never killed (each kill goes through a pidfd
  opened before the start time is checked: ada_core/processes.py). Ray's own servers die with the
  driver (a parent-death signal) and orphan their children at once, so the tree cannot be walked
  after the death; `RankGroup` sends the local Ray's process tree (its agents included) once Ray is
  up and again once the ranks are.
- the tag: `start_ray` gives it to the processes Ray starts for a local cluster (their own
  environment, never the driver's), so every worker its raylet starts, later ones included,
  inherits it and nothing else does. It does
  not mark every process: Ray's agents retitle themselves (setproctitle), which zeroes the
  environment /proc shows, hence the list. The tag is a fresh random value per driver.

No SIGTERM first: the driver is gone and the run cannot continue, so nothing these processes hold is
worth a grace period. The watcher runs by path and imports nothing of ada_core but the stdlib-only
ada_core.processes (found through the PYTHONPATH it is started with).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

from ada_core.processes import signal_process, start_time

TAG_ENV = "ADA_LIFELINE"
_SWEEP_S = 10.0  # keep sweeping this long while tagged processes remain (a dying worker may fork)
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])  # the folder holding this ada_core, for the watcher


class Lifeline:
    """The driver's end: a watcher that, on this process's death or on `close`, kills the processes
    given to `watch` and those tagged `env()`, and removes `paths`. Its output goes to `log_path`."""

    def __init__(self, paths: Sequence[str | Path], log_path: str | Path):
        self.tag = uuid.uuid4().hex
        Path(log_path).parent.mkdir(parents=True, exist_ok=True)
        read_end, self._write_end = os.pipe()  # both non-inheritable: only the watcher gets the read end
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [_PACKAGE_ROOT, os.environ.get("PYTHONPATH")]))}
        try:
            with open(log_path, "ab") as log:
                self.process: subprocess.Popen | None = subprocess.Popen(
                    [sys.executable, __file__, str(read_end), self.tag, *map(str, paths)], env=env,
                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, pass_fds=(read_end,),
                    start_new_session=True)  # Ctrl-C at the terminal goes to the driver, not the watcher
        except BaseException:
            os.close(self._write_end)
            raise
        finally:
            os.close(read_end)

    def env(self) -> dict[str, str]:
        """The variable a process started now must carry to be ended with this driver."""
        return {TAG_ENV: self.tag}

    def watch(self, pids: Sequence[int]) -> None:
        """Have these processes killed too (those still the same process: pid and start time)."""
        if self.process is not None:
            lines = "".join(f"{pid} {start}\n" for pid in pids if (start := start_time(pid)) is not None)
            os.write(self._write_end, lines.encode())

    def close(self, timeout: float = _SWEEP_S + 5) -> None:
        """Let the watcher sweep now and wait for it. Idempotent."""
        process, self.process = self.process, None
        if process is None:
            return
        os.close(self._write_end)
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def tagged(tag: str) -> list[int]:
    """This user's processes whose environment carries TAG_ENV=tag (others' environments are unreadable)."""
    marker = f"{TAG_ENV}={tag}".encode()
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as fh:
                if marker in fh.read().split(b"\0"):
                    pids.append(int(entry))
        except OSError:  # gone, another user's, or a kernel thread
            continue
    return pids


def descendants(roots: Sequence[int]) -> list[int]:
    """`roots` and every process below them, now."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    children.setdefault(int(fh.read().rsplit(")", 1)[1].split()[1]), []).append(int(entry))
            except OSError:
                continue
    found, todo = [], list(roots)
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def sweep(tag: str, watched: dict[int, int], paths: Sequence[str]) -> tuple[int, list[str]]:
    """SIGKILL the watched processes (pid -> start time) and the tagged ones until none is left (or
    _SWEEP_S passed), then remove `paths`. Returns how many processes were killed and which paths
    were removed."""
    killed: set[int] = set()
    deadline = time.monotonic() + _SWEEP_S
    while time.monotonic() < deadline:
        targets = {p: start for p, start in watched.items() if start_time(p) == start}
        targets.update((p, start) for p in tagged(tag) if (start := start_time(p)) is not None)
        targets = {p: start for p, start in targets.items() if _running(p)}
        if not targets:
            break
        killed.update(p for p, start in targets.items() if signal_process(p, start, signal.SIGKILL))
        time.sleep(0.1)
    removed = []
    for path in paths:
        if os.path.lexists(path):
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                os.unlink(path)
            removed.append(path)
    return len(killed), removed


def _running(pid: int) -> bool:
    """False for a zombie: it has exited, and only its parent has not reaped it yet."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def main() -> int:
    lifeline, tag, paths = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    received = b""
    while chunk := os.read(lifeline, 65536):  # b"": the driver has gone (or closed its end)
        received += chunk
    lines = received.decode().split("\n")[:-1]  # whole lines only: the driver may have died mid-write
    watched = dict(tuple(map(int, line.split())) for line in lines)
    start = time.monotonic()
    killed, removed = sweep(tag, watched, paths)
    print(f"lifeline {tag}: closed (the driver ended or closed it); killed {killed} process(es), removed {removed} "
          f"in {time.monotonic() - start:.1f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
