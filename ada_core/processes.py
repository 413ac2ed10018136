"""Which processes are ours, and signals that reach only those.

A pid alone does not name a process. Once a process has exited and been reaped, the kernel hands its
number to a later one, and a process group's number to a later group leader of that pid. A pid kept
in a file (`make ui`'s servers.json, read again after a reboot) or in memory for hours may name a
stranger by the time it is signalled, and SIGKILL then ends someone else's work.

So a process is named by its pid together with its start time (clock ticks since boot, field 22 of
/proc/<pid>/stat) and the boot it started in (/proc/sys/kernel/random/boot_id: start times repeat
after a reboot). A signal goes through a pidfd (`os.pidfd_open`) opened *before* the start time is
checked: if the pid was reused in between, the pidfd names the process that has gone, and the signal
reaches no one.

A process group is signalled one proven member at a time (`OwnedGroup`), never with `killpg`: its
members are ours while a process we proved ours is still in it, since the kernel does not reuse a
group's number while any process holds it.

Stdlib only, Linux (/proc, pidfd: kernel 5.3).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Mapping
from pathlib import Path

_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


def boot_id() -> str:
    """This boot's random id: a start time read in another boot names no process of this one."""
    return _BOOT_ID.read_text().strip()


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, process group, start time) of `pid`, or None when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()  # after "pid (comm)": state, ppid, pgrp, ...
        return fields[0], int(fields[2]), int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (with the pid and the boot, it names one process)."""
    stat = _stat(pid)
    return stat[2] if stat else None


def identity(pid: int) -> dict[str, int | str] | None:
    """What names the process `pid` now, to be written down and checked later (`is_running`)."""
    start = start_time(pid)
    return None if start is None else {"pid": pid, "start": start, "boot": boot_id()}


def is_running(ident: Mapping) -> bool:
    """Whether the process `identity` recorded is still there (this boot, that pid, that start time)."""
    return ident.get("boot") == boot_id() and start_time(int(ident["pid"])) == ident.get("start")


def signal_process(pid: int, start: int, sig: int) -> bool:
    """Send `sig` to `pid` only if it is still the process that started at `start`; True if it was sent.

    Another user's process under a reused pid (PermissionError) is not ours either: False."""
    try:
        fd = os.pidfd_open(pid)
    except OSError:  # no such process (or a thread id)
        return False
    try:
        if start_time(pid) != start:
            return False
        signal.pidfd_send_signal(fd, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False
    finally:
        os.close(fd)


def group_members(pgid: int, live_only: bool = True) -> dict[int, int]:
    """pid -> start time of the processes in process group `pgid` now (without zombies if `live_only`)."""
    found = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (stat := _stat(int(entry))) is not None and stat[1] == pgid:
            if not (live_only and stat[0] == "Z"):
                found[int(entry)] = stat[2]
    return found


class OwnedGroup:
    """A process group proven ours through one process of it (its leader, pid `pgid`, started at `start`).

    `refresh` re-proves it and learns its members, `signal` reaches each proven member through a pidfd;
    once no process we know is left in the group, the group's number may be someone else's and nothing
    is signalled any more."""

    def __init__(self, pgid: int, start: int):
        self.pgid = pgid
        self.known: dict[int, int] = {pgid: start}

    def refresh(self) -> bool:
        """Whether the group is still ours (a known process is in it, zombie included); if so, everyone in
        it now is ours too, and known from here on."""
        now = group_members(self.pgid, live_only=False)
        ours = any(now.get(pid) == start for pid, start in self.known.items())
        if ours:
            self.known.update(now)
        return ours

    def live(self) -> list[int]:
        """The known members still running (not zombies)."""
        now = group_members(self.pgid)
        return [pid for pid, start in self.known.items() if now.get(pid) == start]

    def signal(self, sig: int) -> int:
        """`sig` to every known member still the same process; how many got it."""
        return sum(signal_process(pid, start, sig) for pid, start in list(self.known.items()))


def stop_group(pgid: int, start: int, timeout_s: float, poll_s: float = 0.2) -> str:
    """SIGTERM the group led by `pgid` (started at `start`), SIGKILL what is left after `timeout_s`.

    Returns what happened, for a log line: `stopped`, `killed` (SIGKILL was needed), `not running` (no
    process of the group is the one recorded: it exited, or its pid is now someone else's) or `not
    permitted` (another user's)."""
    group = OwnedGroup(pgid, start)
    if not group.refresh() or not group.live():
        return "not running"
    if not group.signal(signal.SIGTERM):
        return "not permitted" if group.live() else "stopped"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        time.sleep(poll_s)
        if not group.refresh() or not group.live():
            return "stopped"
    group.signal(signal.SIGKILL)
    return "killed"
