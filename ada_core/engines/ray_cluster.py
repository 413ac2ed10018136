"""The Ray cluster a multi-rank run trains on: a local one it starts, or the one `distributed.ray_address`
names (rank_group.RankGroup builds on it).

A local Ray has no dashboard, no usage stats, token authentication on (Ray's default, its token file
held to its owner), a 1 GiB object store and its workers at this process's niceness. An address where no Ray answers is refused at once, one
line naming the field.
"""

from __future__ import annotations

import functools
import inspect
import math
import os
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ada_core.errors import InputError

WORKER_NICENESS = "RAY_worker_niceness"
OBJECT_STORE_BYTES = 1 << 30  # Ray's default is 30% of RAM; only sequences and log-probs go through it


def start_ray(distributed, env: dict[str, str] | None = None) -> bool:
    """Connect to the configured Ray, or start a local one; False when this process already had Ray.
    A local Ray's processes (its servers, and every worker its raylet starts later) get `env` (a
    `Lifeline`'s tag) in their own environment; this process's environment never holds it, so nothing
    else it starts (a subprocess of another thread while `ray.init` runs) inherits the tag."""
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
        # Ray starts its workers (the ranks) at a niceness 15 above its own; the ranks are the run's work, and
        # on a shared, loaded machine they then got almost no CPU (setup past its 240 s timeout). Unless set.
        env = {WORKER_NICENESS: os.environ.get(WORKER_NICENESS, "0"), **(env or {})}
        with _ray_processes_get(env):
            ray.init(address="local", num_cpus=max(os.cpu_count() or 1, need), include_dashboard=False,
                     object_store_memory=OBJECT_STORE_BYTES, log_to_driver=False, configure_logging=False,
                     namespace="ada")
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


_SPAWN_LOCK = threading.Lock()


@contextmanager
def _ray_processes_get(env: dict[str, str]) -> Iterator[None]:
    """While `ray.init` starts a local cluster, every process Ray starts (GCS, raylet, log monitor, ...)
    gets `env` on top of a copy of this process's environment: Ray 2.60 starts each through
    `services.start_ray_process`, which takes `env_updates` for exactly that. `ray.init` has no argument
    for it, so the function is wrapped for the call's duration; `os.environ` is never changed."""
    if not env:
        yield
        return
    from ray._private import services

    with _SPAWN_LOCK:
        original = services.start_ray_process

        signature = inspect.signature(original)

        @functools.wraps(original)
        def start_ray_process(*args: Any, **kwargs: Any) -> Any:
            call = signature.bind(*args, **kwargs)
            call.arguments["env_updates"] = {**env, **(call.arguments.get("env_updates") or {})}
            return original(*call.args, **call.kwargs)

        services.start_ray_process = start_ray_process
        try:
            yield
        finally:
            services.start_ray_process = original


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
