"""The cluster tier: two hosts on this machine (tests/cluster/hosts.py), a Ray cluster across them.

`two_hosts` builds them once for the module: namespaces, the veth pair, a Ray head on host a and a Ray
worker on host b, started as infra/GPU.md tells a user to; everything is torn down at the end whatever
happened. Where namespaces cannot be made (not root, no CAP_NET_ADMIN, no `ip`), the tier skips and says why.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from hosts import TwoHosts, namespaces_possible  # noqa: E402


def skip_without_namespaces() -> None:
    why = namespaces_possible()
    if why is None:
        name = f"adaprobe{os.getpid()}"
        probe = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True, timeout=30)
        if probe.returncode != 0:
            why = f"cannot create a network namespace ({probe.stderr.strip() or probe.returncode})"
        else:
            subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)
    if why is not None:
        pytest.skip(f"cluster tier: {why}")


@pytest.fixture(scope="module")
def two_hosts(tiny_model):
    skip_without_namespaces()
    with TwoHosts() as hosts:
        hosts.start_ray()
        yield hosts


@pytest.fixture(scope="module")
def bare_hosts(tiny_model):
    """Two hosts without Ray: for the services a run reaches across the network (tests/cluster/test_remote_services.py)."""
    skip_without_namespaces()
    with TwoHosts() as hosts:
        yield hosts
