"""How a DeepSpeed process joins its process group, and which network interface gloo and NCCL use.

The engine's `_initialize` (deepspeed_engine.py) asks `rendezvous_method` before
`deepspeed.init_distributed`. With every rank on one machine (the rank group sets `RENDEZVOUS_ENV`),
or the engine alone in the driver, the ranks meet in a file store and gloo stays on loopback, so no
port opens to the network. Across machines they meet in DeepSpeed's `env://` TCPStore on rank 0's
address, and each rank's gloo and NCCL sockets take the interface that reaches it (`route_interface`).

Apart from the engine because it is networking, not the update: the rank group (rank_group.py) and
the docs on running across machines (infra/GPU.md) point here.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import tempfile
import uuid
from pathlib import Path

log = logging.getLogger(__name__)

# Set by RankGroup when every rank runs on one machine: the name of the ranks' shared rendezvous file.
RENDEZVOUS_ENV = "ADA_DIST_RENDEZVOUS"


def rendezvous_method() -> str | None:
    """How this process joins its process group: `file://` (torch's FileStore) when every rank is on this
    machine, None (DeepSpeed's `env://`: a TCPStore on MASTER_ADDR:MASTER_PORT) across machines.

    torch's TCPStore listens on every interface (`::`), whatever MASTER_ADDR says, so a plain
    1-rank run opened a port to the network; a file store opens none. On Linux gloo's own
    connections are then held to loopback (GLOO_SOCKET_IFNAME=lo, unless set). MASTER_ADDR and
    MASTER_PORT stay set: DeepSpeed's CPU shm all-reduce names its segments after them.

    Across machines gloo (and NCCL) would otherwise take this host's address from its hostname, which
    resolves to loopback on many machines (127.0.1.1 on stock Debian and Ubuntu), and every rank would
    advertise an address no other host can reach: each rank's GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME
    are set (unless set) to the interface this host reaches MASTER_ADDR through (`route_interface`)."""
    name = os.environ.get(RENDEZVOUS_ENV)
    if name is None and os.environ["WORLD_SIZE"] != "1":
        interface = route_interface(os.environ["MASTER_ADDR"])
        if interface is not None:
            for key in SOCKET_IFNAME_ENVS:
                os.environ.setdefault(key, interface)
            log.info("rendezvous at %s:%s through interface %s", os.environ["MASTER_ADDR"],
                     os.environ.get("MASTER_PORT"), os.environ["GLOO_SOCKET_IFNAME"])
        return None  # ranks on several machines (or launched by something else): its rendezvous
    if sys.platform.startswith("linux"):
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    path = Path(tempfile.gettempdir()) / (name or f"ada-dist-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    return f"file://{path}"  # the store removes the file once its last member is gone


# The variables gloo and NCCL read the interface for their own connections from.
SOCKET_IFNAME_ENVS = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")


def route_interface(address: str) -> str | None:
    """The name of this host's interface that reaches `address`: the source address the kernel picks for
    it (a UDP socket's connect sends nothing), mapped to the interface that holds that address. For this
    host's own address (rank 0's MASTER_ADDR), the interface that holds it. None when no route or no
    interface is found (the library then falls back to its own choice)."""
    try:
        infos = socket.getaddrinfo(address, 9, type=socket.SOCK_DGRAM)
    except OSError:
        return None
    for family, _, _, _, sockaddr in infos:
        try:
            with socket.socket(family, socket.SOCK_DGRAM) as s:
                s.connect(sockaddr)
                source = s.getsockname()[0]
        except OSError:
            continue
        name = interface_of(source)
        if name is not None:
            return name
    return None


def interface_of(ip: str) -> str | None:
    """The interface that holds address `ip` (psutil.net_if_addrs), or None."""
    import psutil

    ip = ip.split("%", 1)[0]
    for name, addresses in psutil.net_if_addrs().items():
        if any(a.address.split("%", 1)[0] == ip for a in addresses if a.family in (socket.AF_INET, socket.AF_INET6)):
            return name
    return None
