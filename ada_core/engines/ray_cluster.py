"""The Ray cluster a multi-rank run trains on: a local one it starts, or the one `distributed.ray_address`
names (rank_group.RankGroup builds on it).

A local Ray has no dashboard, no usage stats, token authentication on (Ray's default, its token file
held to its owner) and a 1 GiB object store. An address where no Ray answers is refused at once, one
line naming the field.
"""

from __future__ import annotations

import math
import os
import socket
from pathlib import Path

from ada_core.errors import InputError

OBJECT_STORE_BYTES = 1 << 30  # Ray's default is 30% of RAM; only sequences and log-probs go through it


def start_ray(distributed, env: dict[str, str] | None = None) -> bool:
    """Connect to the configured Ray, or start a local one; False when this process already had Ray.
    A local Ray's processes (its servers, and every worker started later) inherit `env` (a
    `Lifeline`'s tag), which this process itself keeps only while `ray.init` runs."""
    import ray

    if ray.is_initialized():
        return False
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if distributed.ray_address is None:
        need = math.ceil(distributed.num_ranks * distributed.cpus_per_rank)
        # Logical CPUs only bound how many actors Ray places; the ranks' own threads follow cpus_per_rank.
        # Ray 2.60 turns a 127.0.0.1 node address into the machine's own IP (services.resolve_ip_for_localhost),
        # so its servers cannot be held to loopback; its token authentication (on by default) guards them.
        _private_token()
        previous = {key: os.environ.get(key) for key in env or {}}
        os.environ.update(env or {})
        try:
            ray.init(address="local", num_cpus=max(os.cpu_count() or 1, need), include_dashboard=False,
                     object_store_memory=OBJECT_STORE_BYTES, log_to_driver=False, configure_logging=False,
                     namespace="ada")
        finally:
            for key, value in previous.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
        _private_token()
    else:
        address = distributed.ray_address
        check_ray_address(address, min(10.0, distributed.startup_timeout_s))
        try:
            ray.init(address=address, log_to_driver=False, configure_logging=False, namespace="ada")
        except ConnectionError as err:
            why = (str(err).strip() or type(err).__name__).splitlines()[0]
            raise InputError(f"distributed.ray_address={address}: cannot join that Ray cluster ({why}); "
                             "start it first (`ray start --head`, infra/GPU.md), or unset ray_address to start a "
                             "local Ray") from None
    return True


def check_ray_address(address: str, timeout_s: float) -> None:
    """A `host:port` that no process listens on is refused at once: Ray's own client retries such an
    address for many minutes (over 10 here) before it gives up."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        return  # `auto`, or a `ray://` client address: Ray finds or checks it itself
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as err:
        raise InputError(f"distributed.ray_address={address}: no Ray cluster answers there ({err}); start it first "
                         "(`ray start --head`, infra/GPU.md), or unset ray_address to start a local Ray") from None


def _private_token() -> None:
    """Ray 2.60 writes the token of a new local cluster to ~/.ray/auth_token readable by everyone (0644):
    any local user could then join the cluster the ranks run on. Held to its owner."""
    token = Path.home() / ".ray" / "auth_token"
    if token.is_file():
        token.chmod(0o600)
