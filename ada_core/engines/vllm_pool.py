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
- Streaming (`sampler.schedule: streaming`, `submit`): each block of samples goes whole to the server
  with the least outstanding work, the same count; `cancel` reaches the server that holds each of
  its samples. A sample is identified by its seed alone, so with equal weights the pool commits the
  same pools as one server. A server that dies mid-stream: the samples it had already handed over
  stay (each future resolves once), the unfinished ones are re-sent one by one, with their own
  seeds, to the servers left; the tokens it generated for them are lost to the counts.
- Partial rollout (`rollout.partial_rollout`): `generate` is streamed too, and at each load every live
  server freezes its samples in flight, reloads and resumes them (VLLMRolloutEngine.reload_in_flight);
  a server that dies during the load is dropped and the samples it had frozen are re-sent to the others
  from their first token, as any sample of a dead server is.
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
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ada_core import metrics as K
from ada_core.engines.requests import check_requests, row_seed
from ada_core.engines.vllm_engine import (StagedWeights, VLLMRolloutEngine, WeightSyncError, generate_streamed,
                                          make_sync_dir, write_weights)
from ada_core.engines.vllm_server import VLLMServerError
from ada_core.occupancy import OccupancyMeter
from ada_core.protocols import RolloutEngine, SamplingParams, StreamOutcome
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
        self.partial = self.members[0].partial  # rollout.partial_rollout: every member's, or none's
        if any(m.partial != self.partial for m in self.members):
            raise ValueError("a vLLM server pool's members must all keep samples in flight across a load, or none")
        self.weight_version: int | None = None
        self._outstanding = [0] * len(self.members)
        self.served = [0] * len(self.members)  # requests each server answered, for logs and tests
        self.streamed = [0] * len(self.members)  # streamed samples each server handed over
        self.resent = 0  # streamed samples re-sent after their server died
        self.concurrency = sum(m.concurrency for m in self.members)
        self.meter = OccupancyMeter(self.concurrency)  # the pool's; each member meters its own server
        self._lock = threading.Lock()
        self._requests = ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix="vllm-pool-request")
        # Failover of streamed samples runs here, never on a member's event loop (a health check blocks).
        self._failover = ThreadPoolExecutor(max_workers=1, thread_name_prefix="vllm-pool-failover")
        self._fanout = ThreadPoolExecutor(max_workers=len(self.members), thread_name_prefix="vllm-pool-sync")
        self._sync_dir = make_sync_dir(sync_root)
        self._closed = False

    # --- the rollout protocol ----------------------------------------------------------------

    @property
    def num_alive(self) -> int:
        return sum(self.alive)

    def generate(self, requests: Sequence[tuple[Prompt, int]], sampling: SamplingParams) -> list[list[Sample]]:
        """Return, for each `(prompt, k)` request, exactly k unscored Samples, in request order."""
        if not self.partial:
            return self.generate_between_loads(requests, sampling)
        check_requests(requests, sampling)  # streamed, so a weight load can freeze and resume them; unseeded
        base_seed = sampling.seed if sampling.seed is not None else random.SystemRandom().getrandbits(62)
        return generate_streamed(self, requests, sampling, base_seed)

    def generate_between_loads(self, requests: Sequence[tuple[Prompt, int]],
                               sampling: SamplingParams) -> list[list[Sample]]:
        """`generate` for a call no weight load can interrupt (evaluation): seeded requests, as one server's."""
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
                with self.meter.running(k):
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

    # --- streaming (the StreamingRolloutEngine protocol) -----------------------------------------

    def submit(self, prompt: Prompt, seed: int, count: int, sampling: SamplingParams) -> _PoolBlock:
        """`count` cancellable samples of `prompt`, seeds seed..seed+count-1, as one request to the
        server with the least outstanding work (ada_core/sampling/streaming.py)."""
        if count < 1:
            raise ValueError(f"prompt {prompt.id}: a block needs >= 1 sample, got {count}")
        block = _PoolBlock(self, count)
        self.meter.add(count)
        self._send(block, prompt, seed, 0, count, sampling, None)
        return block

    def _send(self, block: _PoolBlock, prompt: Prompt, seed: int, first: int, count: int,
              sampling: SamplingParams, last: Exception | None) -> None:
        """Samples first..first+count-1 of `block` to the least-loaded live server."""
        work = len(prompt.prompt_ids) + sampling.max_tokens  # per sample
        with self._lock:
            live = [i for i in range(len(self.members)) if self.alive[i]]
            if not live:
                error = self._none_left(last)
            else:
                error = None
                index = min(live, key=lambda i: (self._outstanding[i], i))
                self._outstanding[index] += work * count
        if error is not None:
            for k in range(first, first + count):
                block.fail(k, error)
            return
        with block.lock:  # registered before a cancel can miss it
            handle = self.members[index].submit(prompt, seed + first, count, sampling)
            block.inner.append(handle)
            cancelled = block.cancelled
        if cancelled:
            handle.cancel()
        for m, future in enumerate(handle.futures):
            future.add_done_callback(lambda f, k=first + m: self._sample_done(block, prompt, seed, k, sampling, index,
                                                                              work, f))

    def _sample_done(self, block: _PoolBlock, prompt: Prompt, seed: int, k: int, sampling: SamplingParams,
                     index: int, work: int, future: Future) -> None:
        with self._lock:
            self._outstanding[index] -= work
        error = future.exception()
        if error is None:
            outcome = future.result()
            if outcome.sample is not None:
                with self._lock:
                    self.streamed[index] += 1
            block.resolve(k, outcome)
        else:  # on the member's event loop: the health check and the re-send go to the failover thread
            self._failover.submit(self._recover, block, prompt, seed, k, sampling, index, error)

    def _recover(self, block: _PoolBlock, prompt: Prompt, seed: int, k: int, sampling: SamplingParams,
                 index: int, error: BaseException) -> None:
        try:
            if block.cancelled:  # no longer wanted: aborted, whatever its server did
                block.resolve(k, StreamOutcome(None, 0))
            elif not isinstance(error, VLLMServerError) or self._still_serving(index):
                block.fail(k, error)  # a live server's error is a real error
            else:
                self._drop(index, error)
                with self._lock:
                    self.resent += 1
                self._send(block, prompt, seed, k, 1, sampling, error)
        except BaseException as err:  # noqa: BLE001 - the future must resolve, or the step would hang
            block.fail(k, err)

    # --- weight sync -----------------------------------------------------------------------------

    def sync_weights(self, module, version: int) -> dict[str, float]:
        """Write `module`'s weights once, reload them on every live server in parallel, and check each
        reports `version`. A server that died meanwhile is dropped; one that failed while alive fails the sync."""
        return self.load_staged(self.stage_weights(module, version))

    def stage_weights(self, module, version: int) -> StagedWeights:
        """Write the weights once, now (see VLLMRolloutEngine.stage_weights)."""
        folder = self._sync_dir / f"v{version}"
        start = time.perf_counter()
        write_weights(module, folder, version)
        return StagedWeights(folder, version, time.perf_counter() - start)

    def load_staged(self, staged: StagedWeights) -> dict[str, float]:
        """Every live server reloads the staged weights in parallel, then must report their version. Under
        partial rollout each freezes its samples in flight around its reload (`reload_in_flight`); a server
        that dies meanwhile is dropped, and its frozen samples, resumed there in vain, are re-sent to the
        others from their first token (`_recover`)."""
        folder, version = staged.folder, staged.version
        start = time.perf_counter()
        partial: dict[str, float] = {}
        try:
            if self.partial:
                frozen = self._each_live(lambda m: m.reload_in_flight(folder, version),
                                         what=f"weight sync to version {version}")
                partial[K.SYNC_FROZEN_SAMPLES] = float(sum(frozen.values()))
            else:
                self._each_live(lambda m: m.reload_weights(folder, version), what=f"weight sync to version {version}")
            reported = self._each_live(lambda m: m.server_weight_version(), what="weight version check")
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        stale = {self.members[i].base_url: v for i, v in reported.items() if v != str(version)}
        if stale:
            raise WeightSyncError(f"weight sync to version {version}: servers report other versions {stale}")
        self.weight_version = version
        return {**partial, K.SYNC_WRITE_S: staged.write_s, K.SYNC_RELOAD_S: time.perf_counter() - start,
                K.SYNC_WEIGHT_VERSION: float(version), K.ROLLOUT_NUM_SERVERS: float(len(self.members)),
                K.ROLLOUT_SERVERS_ALIVE: float(self.num_alive)}

    def server_counts(self) -> dict[str, float]:
        return {K.ROLLOUT_NUM_SERVERS: float(len(self.members)), K.ROLLOUT_SERVERS_ALIVE: float(self.num_alive)}

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

    def server_meters(self) -> list[OccupancyMeter]:
        """Each member's meter (the pool's own `meter` counts the whole pool)."""
        return [m.meter for m in self.members]

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
        self._failover.shutdown(wait=False, cancel_futures=True)
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
            server = member.server  # exit_code, not Popen.poll: the launcher is reaped only by its stop()
            return server.process is not None and server.exit_code() is None and server.healthy()
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


class _PoolBlock:
    """A streamed block over the pool: `futures[k]` resolves once, from whichever server served
    sample k last; `cancel` reaches every server request the block has (first send and re-sends)."""

    def __init__(self, pool: VLLMServerPool, count: int):
        self.futures: list[Future] = [Future() for _ in range(count)]
        self.inner: list[Any] = []
        self.cancelled = False
        self.lock = threading.Lock()
        self._settled: set[int] = set()
        self._pool = pool

    def cancel(self) -> None:
        with self.lock:
            self.cancelled = True
            inner = list(self.inner)
        for handle in inner:
            handle.cancel()

    def resolve(self, k: int, outcome: StreamOutcome) -> None:
        if self._settle(k):
            self.futures[k].set_result(outcome)

    def fail(self, k: int, error: BaseException) -> None:
        if self._settle(k):
            self.futures[k].set_exception(error)

    def _settle(self, k: int) -> bool:
        with self.lock:
            if k in self._settled:
                return False
            self._settled.add(k)
        self._pool.meter.add(-1)
        return True


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
