"""Where the training loop's batches come from: now (synchronous) or ahead on a rollout thread.

`rollout.async_steps = 0` (`SyncFeed`): the step draws its batch, then updates, then syncs the
weights; the servers idle through the update.

`rollout.async_steps = k >= 1` (`AsyncFeed`): one rollout thread runs, strictly in the order they
were queued, two kinds of job: *draw batch b* (the step function `rollout`) and *load weights v*
(`RolloutEngine.load_staged`). Before update t the loop queues the draws of batches up to t + k;
after update t the trainer writes weights v = t at once (`stage_weights`, before update t + 1 can
change them) and queues their load. So

    batch b is drawn on the weights of the last load queued before it:  version(b) = max(0, b - 1 - k)
    (in steady state; resumed runs start fresher), and trained by update b, whose old policy is b - 1:
    staleness = b - 1 - version(b)  in [0, k]   (checked on every batch: a bug, never input)

and the update of step t overlaps the draw of batch t + 1. A weight load waits for the draw ahead
of it to finish: no sample is ever in flight across a weight change, every sample of a batch comes
from one policy version (`Sample.policy_version`), and the behaviour log-probs the servers return
are exactly that policy's. The order of jobs, hence every batch's version, follows from the loop's
logic, never from timing.

Evaluation runs on the rollout thread too (after the weights of its step are loaded); the loop waits
for it. A checkpoint after step t records the data cursor, RNG and sampler state as they were just
before batch t + 1 was drawn (`Snapshot`), so a resumed run draws batches t + 1 .. again: every
(step, prompt) once, no sample lost or counted twice.
"""

from __future__ import annotations

import contextvars
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from ada_core import metrics as K
from ada_core.records import RolloutBatch


@dataclass(frozen=True)
class Snapshot:
    """The rollout side's state just before a batch was drawn: what a checkpoint saves."""

    source: dict[str, Any]
    numpy_rng: dict[str, Any]
    sampler: Any


def snapshot(state) -> Snapshot:
    return Snapshot(state.source.state_dict(), state.rng.bit_generator.state, state.sampler.state_dict())


def tag_versions(batch: RolloutBatch, version: int) -> None:
    for pool in batch.pools:
        for sample in pool.samples:
            sample.policy_version = version


def staleness_metrics(batch: RolloutBatch, trained_version: int, k: int) -> dict[str, float]:
    """async/*: how many updates old the policy of the step's samples is (every sample drawn, trained
    or not; 0 for a synchronous step)."""
    ages = [trained_version - s.policy_version for pool in batch.pools for s in pool.samples
            if s.policy_version is not None]
    return {K.ASYNC_STEPS: float(k), K.ASYNC_STALENESS_MEAN: sum(ages) / len(ages) if ages else 0.0,
            K.ASYNC_STALENESS_MAX: float(max(ages, default=0))}


class SyncFeed:
    """`rollout.async_steps: 0`: draw the batch now; the update step syncs the weights itself."""

    k = 0

    def __init__(self, state, steps):
        self.state, self.steps = state, steps

    def next_batch(self) -> tuple[RolloutBatch, dict[str, float]]:
        state = self.state
        state.drawing_step = state.step + 1
        batch = self.steps.rollout(state)
        tag_versions(batch, state.step)
        return batch, {K.ASYNC_POLICY_VERSION: float(state.step)}

    def after_update(self, update_start: float, update_end: float) -> dict[str, float]:
        return {K.TIME_OVERLAP_S: 0.0}

    def evaluate(self) -> dict[str, float]:
        return self.steps.evaluate(self.state)

    def checkpoint_view(self) -> Snapshot | None:
        return None

    def close(self, quiet: bool = False) -> None:
        pass


class AsyncFeed:
    """`rollout.async_steps: k >= 1` (the module docstring)."""

    def __init__(self, state, steps, k: int):
        self.state, self.steps, self.k = state, steps, k
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="async-rollout")
        self._batches: dict[int, Future] = {}
        self._started: dict[int, threading.Event] = {}
        self._snapshots: dict[int, Snapshot] = {}
        self._queued_version = state.step  # the weights the next queued draw will see
        self._drawn = state.step  # batches queued so far
        self._draws: list[list[float]] = []  # [start, end] of each draw on the worker (end = inf while running)
        self._loads: list[Future] = []
        self._lock = threading.Lock()

    def _submit(self, fn, *args) -> Future:
        context = contextvars.copy_context()  # a Prefect flow's context follows its tasks onto the thread
        return self._worker.submit(context.run, fn, *args)

    def _draw(self, b: int, version: int) -> tuple[RolloutBatch, int]:
        state = self.state
        self._snapshots[b] = snapshot(state)
        self._started[b].set()
        span = [time.perf_counter(), float("inf")]
        with self._lock:
            self._draws.append(span)
        try:
            state.drawing_step = b
            batch = self.steps.rollout(state)
        finally:
            span[1] = time.perf_counter()
        tag_versions(batch, version)
        return batch, version

    def next_batch(self) -> tuple[RolloutBatch, dict[str, float]]:
        state = self.state
        t = state.step + 1
        for b in range(self._drawn + 1, min(t + self.k, state.config.steps) + 1):
            self._started[b] = threading.Event()
            self._batches[b] = self._submit(self._draw, b, self._queued_version)
            self._drawn = b
        start = time.perf_counter()
        batch, version = self._batches.pop(t).result()  # a failed draw raises here
        waited = time.perf_counter() - start
        self._snapshots.pop(t, None)
        self._started.pop(t, None)
        if not 0 <= t - 1 - version <= self.k:
            raise RuntimeError(f"batch {t} came from policy version {version}, more than rollout.async_steps={self.k} "
                               f"updates before {t - 1}")  # the job order guarantees it; a bug, never input
        out = {K.ASYNC_POLICY_VERSION: float(version), K.ASYNC_WAIT_S: waited}
        out.update(self._finished_load_metrics())
        return batch, out

    def after_update(self, update_start: float, update_end: float) -> dict[str, float]:
        staged = self.state.staged_weights
        if staged is None:
            raise RuntimeError("rollout.async_steps > 0: the update step staged no weights")
        self.state.staged_weights = None
        self._loads.append(self._submit(self.state.rollout.load_staged, staged))
        self._queued_version = staged.version
        with self._lock:
            spans = [list(s) for s in self._draws]
            self._draws = [s for s in self._draws if s[1] > update_end]  # still running: may overlap the next
        overlap = sum(max(0.0, min(end, update_end) - max(begin, update_start)) for begin, end in spans)
        return {K.TIME_OVERLAP_S: overlap}

    def _finished_load_metrics(self) -> dict[str, float]:
        """`sync/*` of the newest weight load that has finished (a failed load raises here)."""
        out: dict[str, float] = {}
        while self._loads and self._loads[0].done():
            out = self._loads.pop(0).result()
        return out

    def evaluate(self) -> dict[str, float]:
        """On the rollout thread, after the loads queued so far: the step's own weights."""
        return self._submit(self.steps.evaluate, self.state).result()

    def checkpoint_view(self) -> Snapshot | None:
        """The rollout side's state before the next undrawn-by-the-trainer batch (None: live state is it)."""
        t = self.state.step
        if t + 1 in self._started:
            self._started[t + 1].wait()
            return self._snapshots[t + 1]
        for future in self._loads:  # nothing ahead: let the queue settle so the live state is still
            future.result()
        return None

    def close(self, quiet: bool = False) -> None:
        """Wait for the running job and the queued weight loads; drop draws no step will train.
        `quiet`: the loop is already failing, so a load's error is not raised over it."""
        for future in self._batches.values():
            future.cancel()
        self._worker.shutdown(wait=True)
        for future in self._loads:
            if not future.cancelled() and (not quiet or future.exception() is None):
                future.result()
