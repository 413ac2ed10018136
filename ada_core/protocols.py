"""The interfaces where the pieces meet: rollout engine, update engine, verifier, streaming engine.

The sampler sees only a `RolloutEngine` (or a `StreamingRolloutEngine`) and a `Verifier`, the trainer
only these and an `UpdateEngine`, so any engine plugs in. `ada_core.engines.factory` chooses them.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from ada_core.occupancy import OccupancyMeter
from ada_core.records import Prompt, Sample, VerifierStatus


@dataclass(frozen=True)
class SamplingParams:
    """Sampling parameters for one engine call."""

    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 64
    stop: tuple[str, ...] = ()
    seed: int | None = None
    """Seed of this call; engines derive per-request seeds from it, so a call is reproducible."""


@runtime_checkable
class RolloutEngine(Protocol):
    """Draws completions. One `generate` call serves a whole sampler round.

    Everything the trainer and the samplers call on a rollout engine is declared here. An in-process
    engine (it samples from the update engine's own module) needs only `generate`: subclass this and
    the rest are the no-ops below. An engine in other processes (vLLM servers) overrides them.
    """

    meter: OccupancyMeter | None = None
    """Sequences in flight against the engine's capacity (rollout/idle_fraction); None: not metered. The
    sampler's rounds read it around each `generate` call (ada_core/sampling/rounds.py)."""

    def generate(self, requests: Sequence[tuple[Prompt, int]], sampling: SamplingParams) -> list[list[Sample]]:
        """Return, for each `(prompt, k)` request, exactly k unscored Samples (reward None)."""
        ...

    def generate_between_loads(self, requests: Sequence[tuple[Prompt, int]],
                               sampling: SamplingParams) -> list[list[Sample]]:
        """`generate` for a call that no weight load interrupts (evaluation runs between loads): reproducible
        from `sampling.seed` even where `generate` is not (partial rollout streams it unseeded)."""
        return self.generate(requests, sampling)

    def sync_weights(self, module: Any, version: int) -> dict[str, float]:
        """Serve `module`'s weights as weight version `version`; returns `sync/*` metrics.
        An in-process engine shares the module: nothing to send."""
        return {}

    def stage_weights(self, module: Any, version: int) -> Any:
        """`rollout.async_steps > 0`: write `module`'s weights as `version` now, for `load_staged` later
        (on the rollout thread, between two batches). Only engines in other processes can."""
        raise NotImplementedError(f"{type(self).__name__} shares the trainer's weights and cannot roll out "
                                  "asynchronously (rollout.async_steps > 0 needs rollout.engine: vllm)")

    def load_staged(self, staged: Any) -> dict[str, float]:
        """Serve the weights `stage_weights` wrote; returns `sync/*` metrics."""
        raise NotImplementedError(f"{type(self).__name__} cannot load staged weights")

    def server_meters(self) -> list[OccupancyMeter]:
        """The occupancy meter of each server behind the engine, for the per-server `rollout/*` metrics
        (ada_core/training/loop.py): the engine's own `meter` when it has one, else none. A pool of servers
        returns one per member."""
        return [self.meter] if self.meter is not None else []

    def server_counts(self) -> dict[str, float]:
        """`rollout/num_servers` and `rollout/servers_alive` now, logged in every step's row (an engine in this
        process has no servers: none)."""
        return {}

    def sleep(self) -> None:
        """Free accelerator memory for the update (vLLM's sleep mode); no-op where there is none."""

    def wake_up(self) -> None:
        """Undo `sleep` before the next weight sync."""

    def close(self) -> None:
        """Release what the engine holds (a launched server, threads, clients). Idempotent."""


@runtime_checkable
class UpdateEngine(Protocol):
    """Trains the policy on a step's groups: one in-process DeepSpeed engine, or a group of N ranks
    (`distributed.num_ranks`) that the trainer cannot tell apart from it."""

    module: Any  # the HF model with the current weights (checkpoints and weight syncs read it)

    def update(self, groups: Sequence[Any]) -> dict[str, float]:
        """One training step on the groups; returns `train/*`, `update/*` and `dist/*` metrics."""
        ...

    def save(self, directory: Any) -> Any:
        """Optimizer, scheduler and engine state (not the HF weights) under `directory`."""
        ...

    def load(self, directory: Any) -> None:
        """Restore what `save` wrote."""
        ...

    def rollout_engine(self, tokenizer: Any, micro_batch_size: int) -> RolloutEngine:
        """An in-process rollout engine on this engine's own weights (with N ranks: split across them)."""
        ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class Verdict:
    reward: float
    status: VerifierStatus = VerifierStatus.OK


@runtime_checkable
class Verifier(Protocol):
    """Scores completions in batches; never raises for a bad completion (status says why)."""

    def verify(self, items: Sequence[tuple[Prompt, str]], within_s: float | None = None) -> list[Verdict]:
        """One verdict per item. With `within_s`, the batch's deadline: an item not scored that many
        seconds after the call gets reward 0 and status `deadline` (None: only the per-item limits)."""
        ...


# ---------------------------------------------------------------------------------------------------
# Samplers: how a step's groups are drawn. Built-in or a researcher's own, each is one class registered by
# name (`ada_core.sampling.register_sampler`); docs/SAMPLERS.md is the guide, examples/second_chance.py the example.
# ---------------------------------------------------------------------------------------------------
@runtime_checkable
class Sampler(Protocol):
    """What the trainer, `ada simulate` and the flows call on a sampler. `make_sampler` builds it as
    `cls(cfg, advantage)`: `cfg` the run's `SamplerConfig` (its own options in `cfg.options`, typed by
    `ada_core.sampling.options_of(cfg)`), `advantage` the run's `AdvantageConfig`. One instance lives for the
    whole run, so it may remember prompts across steps.

    Reported by the sampler, in the `RolloutBatch` that `sample` returns (build it with
    `ada_core.sampling.finish_batch`, which computes the rest):
    - `groups`: the trained groups, each of the sampler's own size (`make_group` gives the advantages by
      `advantage.name` against the prompt's whole pool; the sampler may scale them, as `est` does);
    - `pools`: EVERY prompt it drew this step (kept or not), with all its samples, its `rounds` and its
      `exit_reason` (the sampler's own words, e.g. `mixed`, `unresolved`; `finish_batch`'s `exit_reasons`
      lists the ones it can give, each logged as `sampler/exit_<reason>`, zeros too);
    - `metrics`: any extra `sampler/*` keys of its own (`finish_batch(..., extra=)`).

    Computed by the platform from those, never by the sampler: the budget (`budget/generated_samples`,
    tokens, trained samples and tokens, their running totals and the compute estimates), rewards, lengths,
    verifier statuses, engine and verifier time (`draw_and_score` times every call it makes), the
    sampler's own bookkeeping time, and the prompt ledger's rows (one per pool: samples, positives, rounds,
    exit reason, whether a group of it was trained).
    """

    def sample(self, prompts: list[Prompt], engine: RolloutEngine, verifier: Verifier, sampling: SamplingParams,
               rng: Any, source: Any = None) -> Any:
        """One step's `RolloutBatch` for `prompts` (B distinct prompts; the trainer's draw). Draw only through
        `ada_core.sampling.draw_and_score(requests, round, engine, verifier, sampling, rng, clock)`, seeded by
        `rng` (a numpy Generator; the same rng gives the same batch). `source` (a PromptSource) hands out more
        prompts for a sampler that draws beyond the B it was given (DAPO); None in a test that has none.
        A batch with no groups is valid: the trainer skips the update of that step."""
        ...

    def state_dict(self) -> dict | None:
        """What the sampler remembers across steps, as JSON-serialisable data, saved in every checkpoint
        (`trainer_state.json`); None when it keeps nothing."""
        ...

    def load_state_dict(self, state: dict | None) -> None:
        """Restore `state_dict`'s output when a run resumes, before its next `sample`."""
        ...

    def close(self) -> None:
        """Release what the sampler holds (threads, open requests) when the run ends. Usually nothing."""
        ...


# ---------------------------------------------------------------------------------------------------
# Streaming (`sampler.schedule: streaming`): one sample per request, each with its own seed, each cancellable.
# ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class StreamOutcome:
    """What one sample ended with: the sample, or None when it was aborted first."""

    sample: Sample | None
    tokens: int
    """Completion tokens the server generated for it (all of them, or up to the abort)."""


class BlockHandle(Protocol):
    futures: list[Future]
    """One per sample of the block, in seed order; each resolves to a StreamOutcome as soon as that
    sample is done (not when the block is), or raises the engine's error (a dead server)."""

    def cancel(self) -> None:
        """Abort the block's unfinished samples: their futures then resolve with sample=None. Idempotent."""


@runtime_checkable
class StreamingRolloutEngine(Protocol):
    """An engine that can serve `sampler.schedule: streaming`. A pool of servers implements it by
    handing each block to its least-loaded server; the schedule never sees which."""

    concurrency: int
    """Samples the engine can keep in flight at once: the schedule never asks for more."""
    meter: OccupancyMeter

    def submit(self, prompt: Prompt, seed: int, count: int, sampling: SamplingParams) -> BlockHandle:
        """Start `count` samples of `prompt`, the k-th with seed `seed + k` (sampling.seed is ignored).

        Sample identity depends on its seed only, never on the block it was sent in: vLLM gives copy
        k of an n=count request with seed s exactly the sample of an n=1 request with seed s + k."""
        ...
