"""The live streaming driver (`sampler.schedule: streaming`, ada_core/sampling/streaming.py) and its
carry-over across steps (`rollout.carry_over`).

`run_streaming` is one step: every drawn prompt is sampled until it exits or reaches its maximum pool,
then the step's batch is built. Under carry-over a `StreamSession` outlives the step:

    a step adds its B new prompts behind the prompts still open from earlier steps, then streams until
    B open prompts are done (exited, or at their maximum pool of M0 + (N-1)M, counted across steps);
    the batch takes the first B done prompts in prompt order (older prompts first);
    the other prompts stay open: their requests keep running across the weight load (partial rollout
    freezes and resumes them) and they enter a later step's batch once done.

So the servers never idle through a step's tail of slow prompts, and no pool is cut short: a prompt's
pool is the same shortest prefix of its seeded sequence whichever step it finishes in. A sample counts
in the budget metrics and the prompt ledger once, in the step its prompt's pool enters a batch (the
step's `budget/*` are its batch's pools, as without carry-over). A prompt is open in one step at a time:
the sampler replaces a newly drawn prompt that is still open (`StreamSession.open_ids`).

A checkpoint holds the committed samples of the open prompts (`state_dict`). What was in flight, or
scored and waiting for an earlier sample, is not saved: a resumed run drops it and counts it in its first
step (`budget/dropped_samples`; `budget/dropped_tokens` counts the tokens of the scored ones), and the
prompt samples on from its committed pool. Ours; verl's partial rollout and AReaL keep in-flight samples
only within a step's batch.
"""

from __future__ import annotations

import queue
import time
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import replace
from typing import Any, Callable

import numpy as np

from ada_core import metrics as mk
from ada_core.config import AdvantageConfig, SamplerConfig
from ada_core.data.source import PromptSource
from ada_core.protocols import BlockHandle, SamplingParams, StreamingRolloutEngine, StreamOutcome, Verifier
from ada_core.records import Prompt, PromptPool, RolloutBatch, Sample, batch_from_dict, batch_to_dict
from ada_core.sampling.rounds import DOWNSAMPLERS, apply_verdict, check_prompts, finish_batch, make_group
from ada_core.sampling.step_metrics import StepClock
from ada_core.sampling.streaming import StreamSchedule, round_of, sample_seed


def check_streaming_engine(engine) -> None:
    if not isinstance(engine, StreamingRolloutEngine):
        raise ValueError(
            f"sampler.schedule: 'streaming' needs a rollout engine that streams single samples and aborts them "
            f"(rollout.engine: vllm); {type(engine).__name__} serves only sampler.schedule: rounds"
        )


def run_streaming(cfg: SamplerConfig, advantage: AdvantageConfig, prompts: list[Prompt], engine, verifier: Verifier,
                  sampling: SamplingParams, rng: np.random.Generator) -> RolloutBatch:
    """One Ada step under the streaming schedule (streaming.py's docstring); same groups contract as rounds."""
    session = StreamSession(cfg, advantage, engine)
    try:
        session.add_prompts(prompts, rng)
        return session.step(verifier, sampling, rng, take=None)
    finally:
        session.close()


class StreamSession:
    """The streaming driver's state: the schedule, every prompt's pool and open requests, the verifier
    thread and the event queue the engine's callbacks fill. One step (`step`) runs the event loop in the
    calling thread; between steps the requests run on and their events wait in the queue."""

    def __init__(self, cfg: SamplerConfig, advantage: AdvantageConfig, engine):
        check_streaming_engine(engine)
        self.cfg, self.advantage, self.engine = cfg, advantage, engine
        self.schedule = StreamSchedule(0, cfg, cfg.window, engine.concurrency)
        self.prompts: list[Prompt] = []
        self.seeds: list[int] = []  # each prompt's step seed: the step it was drawn in
        self.due: list[int | None] = []  # rollout.max_staleness: the last step whose batch may take the prompt
        self.pools: list[PromptPool] = []
        self.blocks: list[dict[int, BlockHandle]] = []  # prompt -> first index -> its open block
        self.open: list[int] = []  # prompts in no batch yet, in prompt order
        self.events: queue.Queue = queue.Queue()
        self.pending: dict[tuple[int, int], Future] = {}  # samples whose future has not resolved
        self.waiting: dict[tuple[int, int], Sample] = {}  # scored, waiting for an earlier sample to commit
        self.aborted_keys: set[tuple[int, int]] = set()
        self.backlog: list[tuple[int, int, Sample]] = []  # generated, waiting for the verifier
        self.verifying = False
        self.verify_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="stream-verify")
        self.dropped: tuple[int, int] = (0, 0)  # (samples, tokens) a resume dropped, logged by the next step
        self.drew_ahead = False  # the last step added the next step's prompts
        self.cohorts = 0  # add_prompts calls so far: a prompt's cohort is the call that added it
        self.failed: BaseException | None = None
        self.closed = False

    @property
    def open_ids(self) -> set[str]:
        return {self.prompts[i].id for i in self.open}

    # --- the event loop ---------------------------------------------------------------------------
    def _add(self, prompt: Prompt, seed: int, due: int | None, samples: list[Sample] = (), *, cohort: int) -> None:
        threshold = self.cfg.positive_threshold
        self.prompts.append(prompt)
        self.seeds.append(seed)
        self.due.append(due)
        self.pools.append(PromptPool(prompt, list(samples)))
        self.blocks.append({})
        self.open.append(self.schedule.add_prompt([s.reward > threshold for s in samples], cohort))  # type: ignore[operator]

    def _launch(self, params: SamplingParams) -> None:
        for i, j0, count in self.schedule.starts():
            handle = self.engine.submit(self.prompts[i], sample_seed(self.seeds[i], self.prompts[i].id, j0), count,
                                        params)
            if len(handle.futures) != count:
                raise ValueError(f"engine returned {len(handle.futures)} futures for a block of {count} samples")
            self.blocks[i][j0] = handle
            for k, future in enumerate(handle.futures):
                self.pending[(i, j0 + k)] = future
                future.add_done_callback(
                    lambda f, key=(i, j0 + k), j0=j0: self.events.put(("generated", key, (j0, f))))

    def _cancel_prompt(self, i: int) -> None:
        for handle in self.blocks[i].values():
            handle.cancel()
        self.blocks[i].clear()

    def _start_verifying(self, verifier: Verifier) -> None:
        if self.backlog and not self.verifying:
            self.verifying, batch, self.backlog = True, self.backlog, []

            def verify():
                t0 = time.perf_counter()
                verdicts = verifier.verify([(self.prompts[i], s.text) for i, _, s in batch])
                return batch, verdicts, time.perf_counter() - t0

            self.verify_pool.submit(verify).add_done_callback(lambda f: self.events.put(("verified", None, f)))

    def _busy(self) -> bool:
        return bool(self.pending or self.backlog or self.verifying)

    def _handle(self, event, clock: StepClock, verifier: Verifier, params: SamplingParams) -> bool:
        """One event; True when a sample came back from the engine (the generation clock moves)."""
        cfg = self.cfg
        kind, key, future = event
        if kind == "generated":
            i, j = key
            j0, future = future
            self.pending.pop(key, None)
            outcome: StreamOutcome = future.result()  # a dead server raises here, naming itself
            self.schedule.generated(i, j)
            blocks = self.blocks[i]
            if j0 in blocks and all((i, j0 + k) not in self.pending for k in range(len(blocks[j0].futures))):
                del blocks[j0]
            if key in self.aborted_keys:
                clock.aborted_tokens += outcome.tokens
            elif outcome.sample is None:
                raise RuntimeError(f"engine aborted sample {j} of prompt {self.prompts[i].id!r} unasked")
            elif outcome.sample.prompt_id != self.prompts[i].id:
                raise ValueError(f"engine returned a sample of prompt {outcome.sample.prompt_id!r} for prompt "
                                 f"{self.prompts[i].id!r}")
            else:
                self.backlog.append((i, j, outcome.sample))
                self._start_verifying(verifier)
            self._launch(params)
            return True
        self.verifying = False  # kind == "verified"
        batch, verdicts, spent = future.result()
        clock.reward_s += spent
        if len(verdicts) != len(batch):
            raise ValueError(f"verifier returned {len(verdicts)} verdicts for {len(batch)} completions")
        self._start_verifying(verifier)
        for (i, j, sample), verdict in zip(batch, verdicts):
            if (i, j) in self.aborted_keys:  # its prompt exited while it was being scored
                clock.aborted_tokens += sample.num_tokens
                continue
            apply_verdict(self.prompts[i], sample, verdict, round_of(j, cfg.first_round, cfg.M))
            self.waiting[(i, j)] = sample
            committed, aborted = self.schedule.finished(i, j, sample.reward > cfg.positive_threshold)  # type: ignore[operator]
            self.pools[i].samples.extend(self.waiting.pop((i, k)) for k in committed)
            for k in aborted:
                self.aborted_keys.add((i, k))
                if (i, k) in self.waiting:  # scored past the prefix: its tokens are spent, it is no sample
                    clock.aborted_tokens += self.waiting.pop((i, k)).num_tokens
            if aborted:
                self._cancel_prompt(i)
        self._launch(params)
        return False

    # --- one step -----------------------------------------------------------------------------------
    def add_prompts(self, prompts: list[Prompt], rng: np.random.Generator, due: int | None = None) -> None:
        """A step's prompts join the stream behind the open ones, with one step seed drawn from `rng`; `due`:
        the last step whose batch may take them (rollout.max_staleness), None for no bound."""
        check_prompts(prompts)
        if self.open_ids & {p.id for p in prompts}:  # the sampler replaces them; a bug if one gets here
            raise RuntimeError(f"prompts {sorted(self.open_ids & {p.id for p in prompts})[:5]} are still open")
        step_seed = int(rng.integers(0, 2**31 - 1))  # one draw, as a `rounds` engine call takes
        self.cohorts += 1  # carried prompts, of earlier calls, start their samples before these
        for p in prompts:
            self._add(p, step_seed, due, cohort=self.cohorts)

    def step(self, verifier: Verifier, sampling: SamplingParams, rng: np.random.Generator, take: int | None,
             draw_ahead: Callable[[], None] | None = None, number: int = 0, stale: str = "wait",
             final: bool = False) -> RolloutBatch:
        """Stream until `take` open prompts are done (None: every one, and nothing is carried); the batch is
        the first `take` done prompts in prompt order. `draw_ahead` (carry-over) adds the next step's prompts
        once the server has a free slot, at most once. Open prompts due by step `number` (their `due`) are
        waited for and taken (`stale="wait"`), or dropped if not done when the batch is ready ("drop").
        `final` (the run's last step): the prompts left open after the batch are dropped and counted, since no
        later step will train them; their samples were generated all the same."""
        if self.failed is not None:
            raise RuntimeError(f"the streaming session failed in an earlier step: {self.failed}")
        cfg, clock = self.cfg, StepClock()
        params = replace(sampling, seed=None)
        dropped, self.dropped = self.dropped, (0, 0)
        self.drew_ahead = False

        def is_due(i: int) -> bool:
            return self.due[i] is not None and self.due[i] <= number  # type: ignore[operator]

        def ready() -> bool:
            if take is None:
                return not self._busy()
            done = self.schedule.done_sampling
            if stale == "wait" and not all(done(i) for i in self.open if is_due(i)):
                return False
            return sum(done(i) for i in self.open) >= take

        meter_start = meter_end = self.engine.meter.read()
        started = generation_end = time.perf_counter()
        try:
            self._launch(params)
            is_ready = ready()
            if not self._busy() and not is_ready:  # carry-over: a verifier batch may still be out from the last step
                raise RuntimeError("streaming schedule started no sample")  # a bookkeeping bug, never input
            while not is_ready:
                if not self._busy():  # nothing to wait for, and too few prompts done: a bookkeeping bug
                    raise RuntimeError(f"streaming schedule stalled with {len(self.open)} prompts open")
                generated = self._handle(self.events.get(), clock, verifier, params)
                if generated:
                    generation_end, meter_end = time.perf_counter(), self.engine.meter.read()
                # A prompt is done only once scored samples commit (a "verified" event): with `take` the scan
                # over the open prompts runs per verifier batch, not per sample back from the engine.
                if take is None or not generated:
                    is_ready = ready()
                if draw_ahead is not None and not self.drew_ahead and self.schedule.in_flight < self.schedule.capacity:
                    draw_ahead()  # this step's tail leaves slots free: the next step's prompts start in them
                    self.drew_ahead = True
                    self._launch(params)
        except BaseException as err:
            self.failed = err
            self.close()
            raise
        ended = time.perf_counter()
        clock.generate_s = generation_end - started
        # Scoring ran during generation except for the last batches after the last sample came back.
        clock.reward_overlap_s = max(0.0, clock.reward_s - (ended - generation_end))
        clock.below_capacity_s = meter_end.below_s - meter_start.below_s
        clock.metered_s = meter_end.at - meter_start.at
        clock.slot_s, clock.capacity = meter_end.slot_s - meter_start.slot_s, self.engine.meter.capacity
        clock.aborted_samples = self.schedule.aborted
        self.schedule.aborted = 0
        if take is None and not self.schedule.idle():
            raise RuntimeError("streaming schedule ended with samples unresolved")  # a bookkeeping bug, never input

        if take is None:  # every prompt, done or stopped by the global cap
            chosen, self.open = self.open, []
        else:
            done = [i for i in self.open if self.schedule.done_sampling(i)]
            chosen = sorted(set(done[:take]) | {i for i in done if is_due(i)})  # due ones past the first `take` too
            late = [i for i in self.open if (final or is_due(i)) and i not in set(chosen)]  # stale="drop": not done
            # in time; `final`: every prompt left open, which no later step will train
            late_samples = [s for i in late for s in self.pools[i].samples]
            positives = sum(s.reward > cfg.positive_threshold for s in late_samples)  # type: ignore[operator]
            for i in late:
                in_flight = self.schedule.drop(i)
                self.aborted_keys.update((i, k) for k in in_flight)  # their engine events count as aborted tokens
                scored = [self.waiting.pop((i, k)) for k in in_flight if (i, k) in self.waiting]
                dropped = (dropped[0] + len(self.pools[i].samples) + len(in_flight),
                           dropped[1] + sum(s.num_tokens for s in self.pools[i].samples + scored))
                self._cancel_prompt(i)
            self.open = [i for i in self.open if i not in set(chosen) and i not in set(late)]
        pools = [self.pools[i] for i in chosen]
        for i, pool in zip(chosen, pools):
            pool.rounds = 1 + round_of(max(len(pool.samples) - 1, 0), cfg.first_round, cfg.M) if pool.samples else 0
            if self.schedule.exited[i]:
                pool.exit_reason = cfg.exit_rule
        rounds_reached = max((pool.rounds for pool in pools), default=0)
        clock.active_per_round = [sum(pool.rounds > r for pool in pools) for r in range(rounds_reached)]
        downsample, groups, threshold = DOWNSAMPLERS[cfg.downsample], [], cfg.positive_threshold
        for pool in pools:
            if pool.exit_reason != cfg.exit_rule:
                pool.exit_reason = "unresolved"
                if cfg.unresolved == "drop" or len(pool.samples) < cfg.n:
                    continue
            groups.append(make_group(pool, downsample(pool.samples, cfg.n, threshold, rng), self.advantage, threshold))
        extra = None
        if take is not None:
            extra = {mk.SAMPLER_CARRIED: float(len(self.open)),
                     mk.SAMPLER_CARRIED_SAMPLES: float(sum(len(self.pools[i].samples) for i in self.open)),
                     mk.BUDGET_DROPPED_SAMPLES: float(dropped[0]), mk.BUDGET_DROPPED_TOKENS: float(dropped[1])}
            if stale == "drop":  # what the drop takes out of training: the slow prompts, and how hard they were
                extra[mk.SAMPLER_DROPPED_PROMPTS] = float(len(late))
                extra[mk.SAMPLER_DROPPED_PASS_RATE] = positives / len(late_samples) if late_samples else 0.0
        return finish_batch(pools, groups, clock, cfg, [cfg.exit_rule, "unresolved"], extra)

    def carry_step(self, take: int, source: PromptSource, verifier: Verifier, sampling: SamplingParams,
                   rng: np.random.Generator, number: int, carry_steps: int | None, stale: str,
                   final: bool = False) -> RolloutBatch:
        """Step `number` under carry-over (AdaSampler.carry_step): its `take` prompts join the stream unless
        the last step drew them ahead, and the next step's are drawn ahead when the tail leaves room."""

        def draw() -> None:  # joining during step `number`'s draw, on no older weights than it sees
            due = None if carry_steps is None else number + carry_steps
            self.add_prompts(fresh_prompts(source, take, self.open_ids), rng, due)

        if not self.drew_ahead or len(self.open) < take:  # so `take` open prompts can be done this step
            draw()
        # carry_steps 0: a prompt must enter the batch of the step it joins, so none is drawn ahead
        ahead = draw if (carry_steps is None or carry_steps > 0) and not final else None
        return self.step(verifier, sampling, rng, take=take, draw_ahead=ahead, number=number, stale=stale, final=final)

    # --- checkpoint and end -------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The open prompts with their committed samples and seeds, and what a resume will drop: samples
        started and not committed (their tokens where they are scored). Read between steps."""
        open_pools = [PromptPool(self.prompts[i], list(self.pools[i].samples)) for i in self.open]
        open_set = set(self.open)
        in_flight = sum(len(self.schedule.outstanding[i]) for i in self.open)
        tokens = sum(s.num_tokens for (i, _), s in self.waiting.items() if i in open_set)
        tokens += sum(s.num_tokens for i, _, s in self.backlog if i in open_set)
        return {"open": batch_to_dict(RolloutBatch([], {}, open_pools)), "seeds": [self.seeds[i] for i in self.open],
                "due": [self.due[i] for i in self.open], "cohorts": [self.schedule.cohort[i] for i in self.open],
                "drew_ahead": self.drew_ahead, "dropped": [self.dropped[0] + in_flight, self.dropped[1] + tokens]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """A resumed run's open prompts, before its first step: each samples on from its committed pool."""
        batch = batch_from_dict(state["open"])
        cohorts = state.get("cohorts", [0] * len(batch.pools))  # a checkpoint of 2026-12-04 or older has none
        for pool, seed, due, cohort in zip(batch.pools, state["seeds"], state["due"], cohorts):
            self._add(pool.prompt, int(seed), due, pool.samples, cohort=int(cohort))
        self.cohorts = max(cohorts, default=0)
        self.dropped = (int(state["dropped"][0]), int(state["dropped"][1]))
        self.drew_ahead = bool(state["drew_ahead"])

    def close(self) -> None:
        """Cancel every open request and wait (bounded) for them to leave; stop the verifier thread."""
        if self.closed:
            return
        self.closed = True
        for i in range(len(self.prompts)):
            self._cancel_prompt(i)
        wait(list(self.pending.values()), timeout=30)  # leave no request running behind the run
        self.verify_pool.shutdown(wait=False, cancel_futures=True)


def fresh_prompts(source: PromptSource, k: int, open_ids: set[str]) -> list[Prompt]:
    """The source's next `k` prompts, each one still open in the stream replaced by the next one that is not
    (carry-over: a prompt is in one step's stream at a time). Raises once a whole epoch offers no replacement."""
    out = [p for p in source.take(k) if p.id not in open_ids]
    for _ in range(len(source)):
        if len(out) == k:
            return out
        taken = {p.id for p in out}
        out.extend(p for p in source.take(1) if p.id not in open_ids and p.id not in taken)
    if len(out) < k:
        raise RuntimeError(f"sampler.carry_over: {len(open_ids)} prompts are still open and the {len(source)} "
                           f"training prompts hold no {k} others for the next step")
    return out
