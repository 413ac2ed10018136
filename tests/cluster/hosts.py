"""Two hosts on one machine: network namespaces joined by a veth pair, a Ray head in one and a Ray worker in
the other, started the way infra/GPU.md tells a user to ("Joining a Ray cluster").

    host a (namespace <prefix>a, 10.231.0.1/24)  <-- veth pair -->  host b (namespace <prefix>b, 10.231.0.2/24)

Each namespace has its own loopback and its own address, and no route beyond 10.231.0.0/24: anything that
tries another address (a hub look-up, a DNS query) fails at once instead of waiting on a packet that no one
answers. Ray finds a node's IP by the route to a public address, which there is none of here, so each
`ray start` names its node's address (`--node-ip-address`, as on a machine whose default route is not the
interface the other nodes reach). They share the file system, `/dev/shm`, the process table and the hostname, which resolves to
127.0.0.1 here (as it resolves to 127.0.1.1 on stock Debian and Ubuntu): gloo's default choice.

Everything made is torn down by `close` whatever happened: every process whose network namespace is one of
ours (`ip netns pids`: only what we started runs there) is killed by its pid, then the namespaces (and
with them the veth pair) are deleted and the Ray temp folder removed. Nothing outside 10.231.0.0/24 is
ever addressed.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SUBNET = "10.231.0"
RAY_PORT = 6379
# The head's node health check (infra/GPU.md): a node that stops answering is declared dead after about
# threshold x (period + timeout) = 6 s, instead of ~65 s with Ray's defaults and a cut link. (With
# threshold 5 a cut host was named 12.2 s after the cut here, too close to the 15 s bound on a loaded machine.)
HEALTH_CHECK = {"health_check_period_ms": 1000, "health_check_timeout_ms": 1000, "health_check_failure_threshold": 3}


def namespaces_possible() -> str | None:
    """None when network namespaces can be made here, else why not."""
    if sys.platform != "linux":
        return "network namespaces are Linux-only"
    if os.geteuid() != 0:
        return "needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN) to create network namespaces"
    if shutil.which("ip") is None:
        return "needs iproute2's `ip` to create network namespaces"
    return None


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=30)


class Host:
    def __init__(self, netns: str, address: str, interface: str):
        self.netns, self.address, self.interface = netns, address, interface

    def command(self, args: list[str]) -> list[str]:
        """`args` run on this host (in its network namespace)."""
        return ["ip", "netns", "exec", self.netns, *args]

    def pids(self) -> list[int]:
        out = subprocess.run(["ip", "netns", "pids", self.netns], capture_output=True, text=True, timeout=30)
        return [int(p) for p in out.stdout.split()]

    def kill(self) -> list[int]:
        """SIGKILL every process on this host, by pid; returns them."""
        pids = self.pids()
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return pids

    def cut(self) -> None:
        """Take this host's end of the veth pair down: its link to the other host is cut."""
        _ip("-n", self.netns, "link", "set", self.interface, "down")


class TwoHosts:
    """Two namespaces on a veth pair; `start_ray()` then makes them a Ray cluster (head on `a`)."""

    def __init__(self):
        tag = f"ada{os.getpid() % 100000}"
        self.a = Host(f"{tag}a", f"{SUBNET}.1", f"{tag}va")
        self.b = Host(f"{tag}b", f"{SUBNET}.2", f"{tag}vb")
        self.temp = Path(tempfile.mkdtemp(prefix="adac", dir="/tmp"))  # short: Ray's socket paths live under it
        # What a user exports on every node: usage stats off, token authentication with the cluster's own token
        # (a user copies ~/.ray/auth_token to each node; here one token for this cluster, not the home's).
        self.env = {**{k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "MASTER_", "GLOO_", "NCCL_"))
                       and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")},
                    "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(16),
                    "PYTHONPATH": os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]),
                    "MLFLOW_DISABLE_TELEMETRY": "true", "DO_NOT_TRACK": "1", "OMP_NUM_THREADS": "1",
                    "TOKENIZERS_PARALLELISM": "false", "TQDM_DISABLE": "1",
                    # Ray starts its workers at niceness 15 above the raylet's; on a shared, loaded machine
                    # the training ranks then got almost no CPU (a 5-second model load took 5 minutes).
                    "RAY_worker_niceness": "0"}
        self.ray_address = f"{self.a.address}:{RAY_PORT}"
        self.made: list[str] = []

    def __enter__(self) -> "TwoHosts":
        try:
            self.build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def build(self) -> None:
        for host in (self.a, self.b):
            _ip("netns", "add", host.netns)
            self.made.append(host.netns)
        _ip("link", "add", self.a.interface, "type", "veth", "peer", "name", self.b.interface)
        for host in (self.a, self.b):
            _ip("link", "set", host.interface, "netns", host.netns)
            _ip("-n", host.netns, "addr", "add", f"{host.address}/24", "dev", host.interface)
            _ip("-n", host.netns, "link", "set", host.interface, "up")
            _ip("-n", host.netns, "link", "set", "lo", "up")

    def ray(self, host: Host, args: list[str], timeout: float = 180) -> str:
        """`ray <args>` on `host`; its output (raises with it on failure)."""
        ray = str(Path(sys.executable).with_name("ray"))
        done = subprocess.run(host.command([ray, *args]), env=self.env, capture_output=True, text=True,
                              timeout=timeout, cwd=REPO)
        if done.returncode != 0:
            raise RuntimeError(f"ray {' '.join(args)} on {host.address} failed ({done.returncode}):\n"
                               f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
        return done.stdout + done.stderr

    def start_ray(self, cpus_per_host: int = 2) -> None:
        """infra/GPU.md: `ray start --head --port=6379` on the first node, `ray start --address=<head-ip>:6379`
        on the other, with usage stats off; plus each node's address (no default route here), what a test needs on
        a shared machine (its own temp folder, logical CPUs, a small object store, no dashboard) and the head's
        health-check bounds."""
        common = [f"--num-cpus={cpus_per_host}", "--object-store-memory=200000000", f"--temp-dir={self.temp}",
                  "--disable-usage-stats"]
        self.ray(self.a, ["start", "--head", f"--port={RAY_PORT}", "--include-dashboard=false",
                          f"--system-config={json.dumps(HEALTH_CHECK)}", f"--node-ip-address={self.a.address}", *common])
        self.start_worker(cpus_per_host)

    def start_worker(self, cpus_per_host: int = 2) -> None:
        """`ray start --address=<head-ip>:6379` on host b (again, after it was killed), until 2 nodes are alive."""
        self.ray(self.b, ["start", f"--address={self.ray_address}", f"--node-ip-address={self.b.address}",
                          f"--num-cpus={cpus_per_host}", "--object-store-memory=200000000", f"--temp-dir={self.temp}",
                          "--disable-usage-stats"])
        self.wait_nodes(2)

    def python(self, host: Host, code: str, timeout: float = 120) -> str:
        done = subprocess.run(host.command([sys.executable, "-c", code]), env=self.env, capture_output=True,
                              text=True, timeout=timeout, cwd=REPO)
        if done.returncode != 0:
            raise RuntimeError(f"python on {host.address} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
        return done.stdout

    def wait_nodes(self, count: int, timeout: float = 120) -> list[str]:
        """The alive nodes' IPs once `count` are alive (a driver on host a asks the head)."""
        code = (f"import json, time, ray\nray.init(address={self.ray_address!r}, log_to_driver=False)\n"
                f"deadline = time.monotonic() + {timeout}\n"
                "while True:\n"
                "    alive = sorted(n['NodeManagerAddress'] for n in ray.nodes() if n['Alive'])\n"
                f"    if len(alive) >= {count} or time.monotonic() > deadline: break\n"
                "    time.sleep(0.5)\n"
                "print(json.dumps(alive))\n")
        alive = json.loads(self.python(self.a, code, timeout=timeout + 60).strip().splitlines()[-1])
        if len(alive) < count:
            raise RuntimeError(f"only {alive} of {count} Ray nodes came up")
        return alive

    def close(self) -> None:
        """Kill every process in our namespaces by pid, delete them (and the veth pair), remove the temp folder."""
        for _ in range(3):
            pids = [p for host in (self.a, self.b) if host.netns in self.made for p in host.kill()]
            if not pids:
                break
            time.sleep(0.5)
        for netns in self.made:
            subprocess.run(["ip", "netns", "del", netns], capture_output=True, timeout=30)
        self.made = []
        subprocess.run(["ip", "link", "del", self.a.interface], capture_output=True, timeout=30)  # if never moved
        shutil.rmtree(self.temp, ignore_errors=True)
