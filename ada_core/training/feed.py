"""Where the training loop's batches come from: now (synchronous) or ahead on a rollout thread.

`rollout.async_steps = 0` (`SyncFeed`): the step draws its batch, then updates, then syncs the
weights; the servers idle through the update.

`rollout.async_steps = k >= 1` (`AsyncFeed`): one rollout thread runs, strictly in the order they
were queued, two kinds of job: *draw batch b* (the step function `rollout`) and *load weights v*
(`RolloutEngine.load_staged`). Before update t the loop queues the draws of batches up to t + k;
after update t the trainer writes weights v = t at once (`stage_weights`, before update t + 1 can
change them) and queues their load. So

    batch b is drawn on the weights of the last load queued before it:  version(b) = max(0, b - 1 - k)
    (resumed runs too, see below), and trained by update b, whose old policy is b - 1:
    staleness = b - 1 - version(b)  in [0, k]   (checked on every batch: a bug, never input)

and the update of step t overlaps the draw of batch t + 1. A weight load waits for the draw ahead
of it to finish: no sample is ever in flight across a weight change, every sample of a batch comes
from one policy version (`Sample.policy_version`), and the behaviour log-probs the servers return
are exactly that policy's. The order of jobs, hence every batch's version, follows from the loop's
logic, never from timing.

`rollout.partial_rollout` (`AsyncFeed(partial=True)`): loads run on a thread of their own, at once, while
the draw ahead goes on; the engine freezes the samples in flight, loads, and resumes each from its
tokens on the new weights, so a sample can span versions (`Sample.token_versions`; its `policy_version`
is its first token's). A draw or an evaluation still starts only once the loads queued before it are
in, so batch b's tokens come from versions max(0, b - 1 - k) .. b - 1 (checked per token), staleness
in [0, k] per token, and the next draw no longer waits behind a load. Which tokens a load splits
follows from timing: a partial run is not reproducible token for token.

Evaluation runs on the rollout thread too (after the weights of its step are loaded); the loop waits
for it. A weight load that fails stops the rollout thread's later jobs: each raises `WeightLoadError`
instead of drawing or evaluating on the older weights the engine still holds, so no step's batch or
evaluation row is ever credited to weights it was not produced on.

A checkpoint after step t holds the batches already drawn for steps t + 1 .. t + k (drawn on weights
older than the checkpoint's: the checkpoint waits for those draws) and the data cursor, RNG and
sampler state after them (`Snapshot`). A resumed run trains exactly those batches and queues the next
draw on the checkpoint's weights, version t, as the uninterrupted run does: the same batches on the
same versions, every (step, prompt) once, no sample lost or counted twice. (The one case apart: a run
resumed with more `steps` from a checkpoint within k steps of its old end had nothing drawn ahead past
that end, so those batches are drawn on version t, fresher than a longer run would have drawn them.)
"""

from __future__ import annotations

import numpy as np

import contextvars
import json
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ada_core import metrics as K
from ada_core.errors import RunFailure
from ada_core.records import RolloutBatch, batch_from_dict, batch_to_dict


class WeightLoadError(RunFailure):
    """rollout.async_steps: a weight load on the rollout thread failed, so the rollout engine still serves
    older weights. Every job queued after it (a draw, an evaluation) raises this instead of running on
    them: no batch or evaluation row of the step is ever produced on weights it does not name."""


AHEAD_FILE = "rollout_ahead.json"
"""In a checkpoint under rollout.async_steps: the batches drawn ahead of its step (`save_ahead`)."""


@dataclass(frozen=True)
class Ahead:
    """A batch drawn for step `step` on weight version `version` before the trainer reached it."""

    step: int
    version: int
    batch: RolloutBatch


@dataclass(frozen=True)
class Snapshot:
    """What a checkpoint saves of the rollout side: the batches drawn ahead of its step and the cursor,
    RNG and sampler state after them."""

    source: dict[str, Any]
    numpy_rng: dict[str, Any]
    sampler: Any
    ahead: tuple[Ahead, ...] = ()


def snapshot(state, ahead: tuple[Ahead, ...] = ()) -> Snapshot:
    return Snapshot(state.source.state_dict(), state.rng.bit_generator.state, state.sampler.state_dict(), ahead)


def save_ahead(ahead: tuple[Ahead, ...], folder: Path) -> None:
    """Write the batches drawn ahead into a checkpoint folder (nothing when there are none)."""
    if ahead:
        rows = [{"step": a.step, "version": a.version, "batch": batch_to_dict(a.batch)} for a in ahead]
        (folder / AHEAD_FILE).write_text(json.dumps({"ahead": rows}, default=_plain))


def load_ahead(folder: Path) -> list[Ahead]:
    """The batches a checkpoint holds drawn ahead of its step (none for a synchronous run's, or one written
    before checkpoints held them)."""
    path = folder / AHEAD_FILE
    if not path.is_file():
        return []
    rows = json.loads(path.read_text())["ahead"]
    return [Ahead(int(r["step"]), int(r["version"]), batch_from_dict(r["batch"])) for r in rows]


def _plain(value: Any) -> Any:
    """numpy scalars and arrays as the Python values they hold (json.dumps calls this for what it cannot write)."""
    if isinstance(value, (np.generic, np.ndarray)):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def tag_versions(batch: RolloutBatch, version: int) -> None:
    """Each sample's `policy_version`: `version`, the draw's; under partial rollout its first token's."""
    for pool in batch.pools:
        for sample in pool.samples:
            sample.policy_version = sample.token_versions[0] if sample.token_versions else version


def staleness_metrics(batch: RolloutBatch, trained_version: int, k: int) -> dict[str, float]:
    """async/*: how many updates old the policy of the step's samples is (every sample drawn, trained
    or not; 0 for a synchronous step)."""
    ages = [trained_version - s.policy_version for pool in batch.pools for s in pool.samples
            if s.policy_version is not None]
    return {K.ASYNC_STEPS: float(k), K.ASYNC_STALENESS_MEAN: sum(ages) / len(ages) if ages else 0.0,
            K.ASYNC_STALENESS_MAX: float(max(ages, default=0))}


def token_staleness_metrics(batch: RolloutBatch, trained_version: int, k: int) -> dict[str, float]:
    """rollout.partial_rollout: how many updates old each drawn token's policy is (the histogram
    `async/tokens_stale_<age>` for ages 0..k, or to the oldest under sampler.carry_over; mean, max) and how many samples span two versions or more."""
    counts = [0] * (k + 1)  # sampler.carry_over: a carried prompt's tokens can be older than k
    spanning = 0
    for pool in batch.pools:
        for s in pool.samples:
            versions = s.token_versions or [s.policy_version] * s.num_tokens
            spanning += len(set(versions)) > 1
            for v in versions:
                age = trained_version - v
                counts.extend([0] * (age + 1 - len(counts)))
                counts[age] += 1
    tokens = sum(counts)
    out = {K.token_staleness_key(age): n / tokens if tokens else 0.0 for age, n in enumerate(counts)}
    out[K.ASYNC_TOKEN_STALENESS_MEAN] = sum(age * n for age, n in enumerate(counts)) / tokens if tokens else 0.0
    out[K.ASYNC_TOKEN_STALENESS_MAX] = float(max((age for age, n in enumerate(counts) if n), default=0))
    out[K.ASYNC_SPANNING_SAMPLES] = float(spanning)
    return out


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

    def __init__(self, state, steps, k: int, partial: bool = False, bound: float | None = None):
        self.state, self.steps, self.k, self.partial = state, steps, k, partial
        self.bound = k if bound is None else bound  # the oldest a batch's policy may be (sampler.carry_over: more)
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="async-rollout")
        # Partial rollout: loads run on a thread of their own, while a draw goes on (the engine freezes and
        # resumes its samples around each); otherwise on the rollout thread, between two draws.
        self._loader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="weight-load") if partial else self._worker
        self._batches: dict[int, Future] = {}
        self._queued_version = state.step  # the weights the next queued draw will see
        self._drawn = state.step  # batches queued so far
        for ahead in state.ahead:  # a resumed checkpoint's batches drawn ahead: trained as they were drawn
            if ahead.step <= state.config.steps:
                self._batches[ahead.step] = Future()
                self._batches[ahead.step].set_result((ahead.batch, ahead.version))
                self._drawn = max(self._drawn, ahead.step)
        state.ahead = []
        self._draws: list[list[float]] = []  # [start, end] of each draw on the worker (end = inf while running)
        self._loads: list[Future] = []
        self._failed_load: str | None = None  # why the first failed weight load failed (then nothing runs on)
        self._lock = threading.Lock()

    def _submit(self, fn, *args, executor: ThreadPoolExecutor | None = None) -> Future:
        context = contextvars.copy_context()  # a Prefect flow's context follows its tasks onto the thread
        return (executor or self._worker).submit(context.run, fn, *args)

    def _await_loads(self, loads: list[Future]) -> None:
        """Partial rollout: a draw or an evaluation starts only once the loads queued before it are in, as
        it would behind them on the rollout thread (a failed one raises its WeightLoadError here)."""
        for load in loads:
            load.result()

    def _load(self, staged) -> dict[str, float]:
        """Job: load weight version `staged.version` into the rollout engine (after the draws queued before it).
        A failure is kept: from then on no draw or evaluation runs (`_refuse_after_failed_load`). A load
        queued after a failed one still runs, so the engine removes what `stage_weights` wrote."""
        try:
            return self.state.rollout.load_staged(staged)
        except BaseException as err:
            why = (f"loading weight version {staged.version} (update {staged.version}'s weights) into the rollout "
                   f"engine failed: {type(err).__name__}: {err}")
            self._failed_load = self._failed_load or why
            raise WeightLoadError(f"rollout.async_steps: {why}") from err

    def _refuse_after_failed_load(self, job: str) -> None:
        """Raise instead of running `job` on the rollout thread once a weight load has failed: the engine
        still holds older weights than the job would be credited to."""
        if self._failed_load is not None:
            raise WeightLoadError(f"rollout.async_steps: {job} was not run, because {self._failed_load}; "
                                  "the engine still holds older weights")

    def _draw(self, b: int, version: int, loads: tuple[Future, ...] = ()) -> tuple[RolloutBatch, int]:
        self._await_loads(list(loads))
        self._refuse_after_failed_load(f"batch {b}'s draw (on weight version {version})")
        state = self.state
        span = [time.perf_counter(), float("inf")]
        with self._lock:
            self._draws.append(span)
        try:
            state.drawing_step = b
            batch = self.steps.rollout(state)
        finally:
            span[1] = time.perf_counter()
        tag_versions(batch, version)
        if self.partial:  # the oldest token's version: loads after the draw began only made tokens fresher
            version = min((s.policy_version for p in batch.pools for s in p.samples), default=version)
        return batch, version

    def next_batch(self) -> tuple[RolloutBatch, dict[str, float]]:
        state = self.state
        t = state.step + 1
        for b in range(self._drawn + 1, min(t + self.k, state.config.steps) + 1):
            loads = tuple(self._loads) if self.partial else ()
            self._batches[b] = self._submit(self._draw, b, self._queued_version, loads)
            self._drawn = b
        start = time.perf_counter()
        batch, version = self._batches.pop(t).result()  # a failed draw raises here
        waited = time.perf_counter() - start
        if not 0 <= t - 1 - version <= self.bound:
            raise RuntimeError(f"batch {t} came from policy version {version}, more than {self.bound} updates before "
                               f"{t - 1} (rollout.async_steps={self.k})")  # the job order (and carry-over's due steps) guarantee it; a bug
        if self.partial and any(v > t - 1 for p in batch.pools for s in p.samples for v in s.token_versions or ()):
            raise RuntimeError(f"batch {t} holds tokens of a policy newer than update {t}'s old one, {t - 1}")  # a bug
        out = {K.ASYNC_POLICY_VERSION: float(version), K.ASYNC_WAIT_S: waited}
        out.update(self._finished_load_metrics())
        return batch, out

    def after_update(self, update_start: float, update_end: float) -> dict[str, float]:
        staged = self.state.staged_weights
        if staged is None:
            raise RuntimeError("rollout.async_steps > 0: the update step staged no weights")
        self.state.staged_weights = None
        self._loads.append(self._submit(self._load, staged, executor=self._loader))
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
        """On the rollout thread, after the loads queued so far: the step's own weights. When one of those
        loads failed it raises `WeightLoadError` instead: an evaluation on the older weights the engine
        still holds would be logged as the step's."""
        return self._submit(self._evaluate, tuple(self._loads) if self.partial else ()).result()

    def _evaluate(self, loads: tuple[Future, ...] = ()) -> dict[str, float]:
        self._await_loads(list(loads))
        self._refuse_after_failed_load(f"step {self.state.step}'s evaluation (on weight version {self.state.step})")
        return self.steps.evaluate(self.state)

    def checkpoint_view(self) -> Snapshot:
        """What a checkpoint after step t saves of the rollout side: the batches drawn ahead for steps
        t + 1 .. (on the older weights an uninterrupted run draws them on) and the cursor, RNG and sampler
        state after them. Waits for those draws: the trainer gives up this step's overlap. No draw is
        queued meanwhile (only the loop queues them), so the state read is still."""
        ahead = []
        for b in sorted(self._batches):
            batch, version = self._batches[b].result()  # a failed draw raises here, before the checkpoint
            ahead.append(Ahead(b, version, batch))
        return snapshot(self.state, tuple(ahead))

    def close(self, quiet: bool = False) -> None:
        """Wait for the running job and the queued weight loads; drop draws no step will train.
        `quiet`: the loop is already failing, so a load's error is not raised over it."""
        for future in self._batches.values():
            future.cancel()
        self._worker.shutdown(wait=True)
        self._loader.shutdown(wait=True)
        for future in self._loads:
            if not future.cancelled() and (not quiet or future.exception() is None):
                future.result()
