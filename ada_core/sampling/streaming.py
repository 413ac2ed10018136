"""Streaming successive elimination (`sampler.schedule: streaming`): Ada without round barriers.

Under `rounds` every active prompt's next M samples wait for the slowest sample of the last round,
and the server idles through each round's tail. Here each sample is its own request:

    every prompt p has a seeded sample sequence s_p0, s_p1, ...  (seed of s_pj = hash(step seed, p.id, j))
    keep up to `window` of p's samples on the server, and the server full
    as each sample comes back it is verified at once (while the others generate), then
    COMMITTED IN INDEX ORDER: s_pj joins p's pool only once s_p0 .. s_pj-1 have
    after every commit the exit rule is checked; once p exits, its outstanding samples are aborted

Committing in index order is what removes the length bias: short completions return first, and a
rule checked on whichever sample returned first would favour them. In order, p's pool is the
shortest prefix of its seeded sequence that meets the exit rule (and holds >= n), capped at
M0 + (N-1)*M samples, whatever order the requests finish in. Samples past the prefix are aborted;
their tokens count as generated tokens (`budget/aborted_tokens`), not as samples.

The global cap counts samples started and not aborted, so the committed samples never pass it.
Downsampling and advantages are the `rounds` ones, applied to the same pools.

`StreamSchedule` is the bookkeeping alone (no threads, no clock): `stream_session.run_streaming` drives
it with a real engine and verifier (and, under `rollout.carry_over`, across steps), and
`benchmarks/streaming_model.py` drives it with a simulated server.
"""

from __future__ import annotations

import hashlib
import heapq
from collections.abc import Sequence

from ada_core.config import SamplerConfig
from ada_core.sampling.rounds import EXIT_RULES


# ---------------------------------------------------------------------------------------------------
# The engine side: one sample per request, each with its own seed, each cancellable.
# ---------------------------------------------------------------------------------------------------
def sample_seed(step_seed: int, prompt_id: str, j: int) -> int:
    """The seed of a prompt's j-th sample in a step: (a hash of the step seed and the prompt id) + j,
    so consecutive samples have consecutive seeds and can share one request. Independent of timing,
    order, blocks and the window."""
    digest = hashlib.blake2b(f"{step_seed}:{prompt_id}".encode(), digest_size=8).digest()
    return (int.from_bytes(digest, "little") >> 3) + j  # < 2**61 + j: fits vLLM's int64 seed field


def round_of(j: int, first_round: int, M: int) -> int:
    """The `rounds` round that sample j would have belonged to (Sample.round; accuracy/reward_mean reads round 0)."""
    return 0 if j < first_round else 1 + (j - first_round) // M


# ---------------------------------------------------------------------------------------------------
# The schedule: pure bookkeeping, shared by the live driver and the simulator.
# ---------------------------------------------------------------------------------------------------
class StreamSchedule:
    """Which samples to start, commit and abort. Call `starts()`; report each started sample with
    `generated(i, j)` when it leaves the server and `finished(i, j, positive)` once it is scored.

    window: samples of one prompt on the server at once. capacity: samples on the server over all
    prompts (the engine's concurrency). A prompt whose next-to-commit sample is long keeps sampling
    past it (up to its maximum) instead of stalling: the pool is still cut in index order.
    """

    def __init__(self, num_prompts: int, cfg: SamplerConfig, window: int, capacity: int):
        self.need_pos, self.need_neg = EXIT_RULES[cfg.exit_rule](cfg.n)
        self.n = cfg.n
        self.max_per_prompt = cfg.max_samples_per_prompt
        self.cap = cfg.global_sample_cap
        if window < 1 or capacity < 1:
            raise ValueError(f"streaming needs window >= 1 and capacity >= 1, got window={window}, capacity={capacity}")
        self.window, self.capacity = window, capacity
        # A block never needs more slots than the server has: rollout.vllm.concurrency < window // 4 would
        # otherwise wait for room that never comes, and every pool stay empty.
        self.min_block = max(1, min(window // 4, capacity))
        self.next_j = [0] * num_prompts  # next sample index to start
        self.committed = [0] * num_prompts  # samples 0 .. committed-1 are in the pool
        self.positives = [0] * num_prompts
        self.exited = [False] * num_prompts
        self.outstanding: list[set[int]] = [set() for _ in range(num_prompts)]  # started, not committed, not aborted
        self.running: list[set[int]] = [set() for _ in range(num_prompts)]  # started, still on the server
        self.ready: list[dict[int, bool]] = [{} for _ in range(num_prompts)]  # finished, waiting for earlier ones
        self.in_flight = 0  # started and not finished: what the server holds
        self.live = 0  # started and not aborted: what counts against the cap
        self.aborted = 0
        self.cohort = [0] * num_prompts  # carry-over: the step a prompt joined in (0 for one step's prompts)
        # Prompts that may start more: older cohorts first (a carried prompt is never starved by the next
        # step's), then the lowest next sample index (breadth-first, as rounds), then prompt order.
        self._heap = [(0, 0, i) for i in range(num_prompts)]
        self._queued = set(range(num_prompts))

    def add_prompt(self, committed: Sequence[bool] = (), cohort: int = 0) -> int:
        """A prompt joins the schedule (carry-over: a later step's prompts, or a resumed run's carried ones
        with the samples already `committed` to their pools, their positives given). `cohort`: the step it
        joined in; an older cohort's samples start first. Returns its index."""
        i = len(self.next_j)
        self.cohort.append(cohort)
        size, pos = len(committed), sum(committed)
        self.next_j.append(size)
        self.committed.append(size)
        self.positives.append(pos)
        self.exited.append(size >= self.n and pos >= self.need_pos and size - pos >= self.need_neg)
        self.outstanding.append(set())
        self.running.append(set())
        self.ready.append({})
        self._requeue(i)
        return i

    def done_sampling(self, i: int) -> bool:
        """Prompt i's pool is final: it exited, or every sample up to its maximum is committed."""
        return self.exited[i] or self.committed[i] >= self.max_per_prompt

    def drop(self, i: int) -> list[int]:
        """Carry-over: prompt i leaves the schedule unfinished (a checkpoint's resume drops what it had in
        flight). Returns the sample indices it had started and not committed; their slots are freed."""
        dropped = sorted(self.outstanding[i])
        for k in dropped:
            self.generated(i, k)
        self.outstanding[i].clear()
        self.ready[i].clear()
        self.live -= len(dropped)
        self.exited[i] = True  # starts nothing more
        return dropped

    def _may_start(self, i: int) -> bool:
        if self.exited[i] or self.next_j[i] >= self.max_per_prompt:
            return False
        free = self.window - len(self.running[i])
        return free >= min(self.min_block, self.max_per_prompt - self.next_j[i])

    def _requeue(self, i: int) -> None:
        if i not in self._queued and self._may_start(i):
            heapq.heappush(self._heap, (self.cohort[i], self.next_j[i], i))
            self._queued.add(i)

    def starts(self) -> list[tuple[int, int, int]]:
        """Blocks (prompt index, first sample index, count) to start now: older cohorts first, then lower
        sample indices.

        A prompt is topped up to its window in one block, and only once a quarter of its window is
        free (or it has nothing outstanding): one request per sample would cost the server a request
        each, and on a CPU host that overhead rivals the round barrier's.
        """
        out = []
        while self._heap and self.in_flight < self.capacity and (self.cap is None or self.live < self.cap):
            *_, i = heapq.heappop(self._heap)
            self._queued.discard(i)
            if not self._may_start(i):
                continue
            j = self.next_j[i]
            want = min(self.window - len(self.running[i]), self.max_per_prompt - j)
            room = self.capacity - self.in_flight
            if room < min(self.min_block, want):  # wait for a block's worth of server slots
                heapq.heappush(self._heap, (self.cohort[i], j, i))
                self._queued.add(i)
                break
            count = min(want, room, self.cap - self.live if self.cap is not None else want)
            self.next_j[i] += count
            self.outstanding[i].update(range(j, j + count))
            self.running[i].update(range(j, j + count))
            self.in_flight += count
            self.live += count
            out.append((i, j, count))
            self._requeue(i)
        return out

    def generated(self, i: int, j: int) -> None:
        """Sample j of prompt i left the server (done, or its abort took effect): its slot is free."""
        if j in self.running[i]:
            self.running[i].discard(j)
            self.in_flight -= 1
            self._requeue(i)

    def finished(self, i: int, j: int, positive: bool) -> tuple[list[int], list[int]]:
        """Sample j of prompt i is back and scored. Commits what is now in order and checks the exit.

        Returns (committed, aborted): the sample indices newly committed to the pool, in order, and
        those no longer wanted (the caller cancels any still running and drops the others). A sample
        aborted before it was scored returns ([], []).
        """
        self.generated(i, j)
        if j not in self.outstanding[i]:
            return [], []
        self.ready[i][j] = positive
        committed: list[int] = []
        while not self.exited[i] and self.committed[i] in self.ready[i]:
            k = self.committed[i]
            self.positives[i] += self.ready[i].pop(k)
            self.outstanding[i].discard(k)
            self.committed[i] += 1
            committed.append(k)
            pos, size = self.positives[i], self.committed[i]
            self.exited[i] = size >= self.n and pos >= self.need_pos and size - pos >= self.need_neg
        aborted: list[int] = []
        if self.exited[i]:
            aborted = sorted(self.outstanding[i])
            for k in aborted:
                self.generated(i, k)  # the abort frees the server slot now
            self.outstanding[i].clear()
            self.ready[i].clear()
            self.live -= len(aborted)
            self.aborted += len(aborted)
        self._requeue(i)
        return committed, aborted

    def idle(self) -> bool:
        """Nothing started is unresolved: the step is over once `starts()` is empty too."""
        return self.in_flight == 0 and not any(self.outstanding)


def shortest_prefix(rewards: Sequence[float], cfg: SamplerConfig) -> int:
    """The pool size `streaming` commits for a prompt whose seeded samples score `rewards` (no cap):
    the shortest prefix meeting the exit rule and holding >= n, else the per-prompt maximum."""
    need_pos, need_neg = EXIT_RULES[cfg.exit_rule](cfg.n)
    pos = 0
    for size, reward in enumerate(rewards[: cfg.max_samples_per_prompt], start=1):
        pos += reward > cfg.positive_threshold
        if size >= cfg.n and pos >= need_pos and size - pos >= need_neg:
            return size
    return min(len(rewards), cfg.max_samples_per_prompt)
