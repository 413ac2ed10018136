"""Run a vLLM server as this process's child and end it when the launching process dies.

    python ada_vllm_launch.py <lifeline fd> <command...>

The launcher holds the read end of a pipe whose only write end is in the process that launched it
(ada_core/engines/vllm_server.py). When that process ends, however it ends (SIGKILL included), the
kernel closes the write end and a read here returns EOF: the launcher then sends SIGTERM to its
process group (the server and its engine-core processes: the launcher leads a session of its own),
and SIGKILL after a grace period. `prctl(PR_SET_PDEATHSIG)` would not do: it fires when the
launching *thread* exits, and servers of a pool are started from worker threads.

A SIGTERM to the launcher goes to the server; the launcher exits with the server's exit code
(-N for a signal, as `subprocess` reports it).
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time

GRACE_S = 10.0


def main() -> int:
    lifeline, command = int(sys.argv[1]), sys.argv[2:]
    server = subprocess.Popen(command)
    signal.signal(signal.SIGTERM, lambda *_: server.poll() is None and server.send_signal(signal.SIGTERM))
    while server.poll() is None:
        try:
            ready, _, _ = select.select([lifeline], [], [], 0.5)
        except InterruptedError:
            continue
        if ready and not os.read(lifeline, 1):  # EOF: the launching process is gone
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            os.killpg(0, signal.SIGTERM)
            deadline = time.monotonic() + GRACE_S
            while server.poll() is None and time.monotonic() < deadline:
                time.sleep(0.1)
            os.killpg(0, signal.SIGKILL)  # the engine-core processes too; ends this process
    if server.returncode < 0:  # die of the same signal, so the launching process sees -N as before
        signal.signal(-server.returncode, signal.SIG_DFL)
        os.kill(os.getpid(), -server.returncode)
    return server.returncode


if __name__ == "__main__":
    sys.exit(main())
