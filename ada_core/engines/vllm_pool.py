"""A pool of vLLM servers behind the one `RolloutEngine` protocol (and the one-server engine's sync API).

`rollout.vllm.num_servers` launched servers, or the servers at `rollout.vllm.base_urls`. The trainer
and the sampler cannot tell the pool from one `VLLMRolloutEngine`: `generate`, `sync_weights`,
`sleep`, `wake_up`, `close` mean the same.

- Dispatch: each `(prompt, k)` request goes whole to one server (so its k samples share the prompt's
  prefill), the one with the least outstanding work, counted as k x (prompt + max_tokens) tokens.
  Request i's seed is the one-server engine's, so with equal weights the pool draws the same samples
  as one server would.
- Weight sync, once per step: the weights are written once, then every live server reloads them in
  parallel; each must then report the new weight version, else the step fails (WeightSyncError).
- Failover: a request whose server stopped answering (connection refused, or a launched server's
  process exited) is retried on the others, and that server is dropped for the rest of the run with
  a warning in the log; `rollout/servers_alive` shows it. A server that answers with an error is a
  real error, not a death: it is raised. When no server is left, the last server's error (with its
  log tail, for a launched one) is raised, as with one server.
"""

from __future__ import annotations

import logging
import os
import random
import shutil
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ada_core import metrics as K
from ada_core.engines.requests import check_requests, row_seed
from ada_core.engines.vllm_engine import VLLMRolloutEngine, WeightSyncError, default_sync_root, write_weights
from ada_core.engines.vllm_server import VLLMServerError
from ada_core.protocols import RolloutEngine, SamplingParams
from ada_core.records import Prompt, Sample

log = logging.getLogger(__name__)


class VLLMServerPool(RolloutEngine):
    """`RolloutEngine` over several `VLLMRolloutEngine`s (one per server), with failover."""

    def __init__(self, members: Sequence[VLLMRolloutEngine], sync_root: str | Path | None = None):
        if not members:
            raise ValueError("a vLLM server pool needs at least one server")
        self.members = list(members)
        self.alive = [True] * len(self.members)
        self.sleep_during_update = self.members[0].sleep_during_update
        self.weight_version: int | None = None
        self._outstanding = [0] * len(self.members)
        self.served = [0] * len(self.members)  # requests each server answered, for logs and tests
        self._lock = threading.Lock()
        self._requests = ThreadPoolExecutor(max_workers=sum(m.concurrency for m in self.members),
                                            thread_name_prefix="vllm-pool-request")
        self._fanout = ThreadPoolExecutor(max_workers=len(self.members), thread_name_prefix="vllm-pool-sync")
        self._sync_dir = Path(tempfile.mkdtemp(prefix="ada-weight-sync-", dir=sync_root or default_sync_root()))
        self._closed = False

    # --- the rollout protocol ----------------------------------------------------------------

    @property
    def num_alive(self) -> int:
        return sum(self.alive)

    def generate(self, requests: Sequence[tuple[Prompt, int]], sampling: SamplingParams) -> list[list[Sample]]:
        """Return, for each `(prompt, k)` request, exactly k unscored Samples, in request order."""
        check_requests(requests, sampling)
        base_seed = sampling.seed if sampling.seed is not None else random.SystemRandom().getrandbits(62)
        futures = {i: self._requests.submit(self._request, prompt, k, row_seed(base_seed, i, 0) >> 1, sampling)
                   for i, (prompt, k) in enumerate(requests) if k > 0}
        return [futures[i].result() if i in futures else [] for i in range(len(requests))]

    def _request(self, prompt: Prompt, k: int, seed: int, sampling: SamplingParams) -> list[Sample]:
        work = k * (len(prompt.prompt_ids) + sampling.max_tokens)
        last: VLLMServerError | None = None
        while True:
            with self._lock:
                live = [i for i in range(len(self.members)) if self.alive[i]]
                if not live:
                    raise self._none_left(last)
                index = min(live, key=lambda i: (self._outstanding[i], i))
                self._outstanding[index] += work
            try:
                samples = self.members[index]._complete(prompt, k, seed, sampling)
                with self._lock:
                    self.served[index] += 1
                return samples
            except VLLMServerError as err:
                if self._still_serving(index):
                    raise
                self._drop(index, err)
                last = err
            finally:
                with self._lock:
                    self._outstanding[index] -= work

    # --- weight sync -----------------------------------------------------------------------------

    def sync_weights(self, module, version: int) -> dict[str, float]:
        """Write `module`'s weights once, reload them on every live server in parallel, and check each
        reports `version`. A server that died meanwhile is dropped; one that failed while alive fails the sync."""
        folder = self._sync_dir / f"v{version}"
        start = time.perf_counter()
        write_weights(module, folder, version)
        write_s = time.perf_counter() - start
        start = time.perf_counter()
        try:
            self._each_live(lambda m: m.reload_weights(folder, version), what=f"weight sync to version {version}")
            reported = self._each_live(lambda m: m.server_weight_version(), what="weight version check")
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        stale = {self.members[i].base_url: v for i, v in reported.items() if v != str(version)}
        if stale:
            raise WeightSyncError(f"weight sync to version {version}: servers report other versions {stale}")
        self.weight_version = version
        return {K.SYNC_WRITE_S: write_s, K.SYNC_RELOAD_S: time.perf_counter() - start,
                K.SYNC_WEIGHT_VERSION: float(version), K.ROLLOUT_NUM_SERVERS: float(len(self.members)),
                K.ROLLOUT_SERVERS_ALIVE: float(self.num_alive)}

    def set_weight_version(self, version: int) -> None:
        self._each_live(lambda m: m.set_weight_version(version), what="update_weight_version")
        self.weight_version = version

    def server_weight_versions(self) -> list[str | None]:
        """The weight version each live server reports, in server order."""
        return list(self._each_live(lambda m: m.server_weight_version(), what="weight version check").values())

    def server_weight_version(self) -> str | None:
        """The version the live servers agree on (None when they disagree)."""
        versions = set(self.server_weight_versions())
        return versions.pop() if len(versions) == 1 else None

    def sleep(self) -> None:
        if self.sleep_during_update:
            self._each_live(lambda m: m.sleep(), what="sleep")

    def wake_up(self) -> None:
        if self.sleep_during_update:
            self._each_live(lambda m: m.wake_up(), what="wake_up")

    # --- plumbing --------------------------------------------------------------------------------

    def close(self) -> None:
        """Stop every launched server (in parallel) and release the clients. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._requests.shutdown(wait=False, cancel_futures=True)
        for future in [self._fanout.submit(m.close) for m in self.members]:
            try:
                future.result()
            except Exception as err:  # noqa: BLE001 - stop every server even if one fails to
                log.warning("closing a vLLM pool member failed: %s", err)
        self._fanout.shutdown(wait=False)
        shutil.rmtree(self._sync_dir, ignore_errors=True)

    def _each_live(self, call: Callable[[VLLMRolloutEngine], Any], what: str) -> dict[int, Any]:
        """`call` on every live member in parallel; members that died are dropped, other errors raised."""
        live = [i for i in range(len(self.members)) if self.alive[i]]
        futures = {i: self._fanout.submit(call, self.members[i]) for i in live}
        results, last = {}, None
        for i, future in futures.items():
            try:
                results[i] = future.result()
            except (VLLMServerError, WeightSyncError, OSError) as err:
                if self._still_serving(i):
                    raise
                self._drop(i, err)
                last = err
        if not any(self.alive):
            raise self._none_left(last, what)
        return results

    def _still_serving(self, index: int) -> bool:
        member = self.members[index]
        if member.server is not None:
            process = member.server.process
            return process is not None and process.poll() is None and member.server.healthy()
        try:
            with urllib.request.urlopen(f"{member.base_url}/health", timeout=5) as response:
                return response.status == 200
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            return False

    def _drop(self, index: int, err: Exception) -> None:
        with self._lock:
            if not self.alive[index]:
                return
            self.alive[index] = False
            left = sum(self.alive)
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        log.warning("vLLM server %s stopped serving (%s); %d of %d left, its requests go to the others",
                    self.members[index].base_url, first, left, len(self.members))

    def _none_left(self, last: Exception | None, what: str = "rollout") -> VLLMServerError:
        detail = f"\n{last}" if last is not None else ""
        return VLLMServerError(f"{what}: no vLLM server left ({len(self.members)} of {len(self.members)} "
                               f"stopped serving){detail}")


def cpu_blocks(parts: int) -> list[str]:
    """This process's CPUs cut into `parts` contiguous blocks for VLLM_CPU_OMP_THREADS_BIND: 2 servers on
    cores 0-3 -> ["0-1", "2-3"]; more servers than cores share them round-robin."""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    size = max(1, len(cores) // parts)
    blocks = []
    for i in range(parts):
        block = cores[(i * size) % len(cores):][:size]
        blocks.append(str(block[0]) if len(block) == 1 else ",".join(str(c) for c in block))
    return blocks
