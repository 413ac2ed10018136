"""The trainer's step functions as Prefect tasks, so every step shows up as task runs in the UI.

Each task is a few lines over `ada_core.training`. They take the in-memory `RunState`, which is
neither hashable nor worth persisting, hence `cache_policy=NO_CACHE, persist_result=False`.
Rollout and update advance the state (prompt cursor, RNG, weights), so they never retry;
evaluation and checkpointing are safe to repeat, so they do.

`TASK_STEPS` is what the train flow hands to `ada_core.training.run_steps`: the state is passed
inside `quote(...)` so Prefect does not walk it looking for upstream futures (on the tiny model
that walk costs more than the step itself).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.runtime import task_run
from prefect.utilities.annotations import quote

from ada_core import training
from ada_core.records import RolloutBatch
from ada_core.training import RunState, StepFunctions

_IN_MEMORY = {"cache_policy": NO_CACHE, "persist_result": False}


def _step_of_state() -> int:
    state = task_run.parameters["state"]
    return (state.unquote() if isinstance(state, quote) else state).step


def _next_step_name(kind: str):
    return lambda: f"{kind}-step-{_step_of_state() + 1}"


def _drawing_step_name(kind: str):
    """The step whose batch is drawn: the next one, or further ahead under rollout.async_steps."""
    def name() -> str:
        state = task_run.parameters["state"]
        return f"{kind}-step-{(state.unquote() if isinstance(state, quote) else state).drawing_step}"

    return name


def _this_step_name(kind: str):
    return lambda: f"{kind}-step-{_step_of_state()}"


@task(name="adaptive_rollout", task_run_name=_drawing_step_name("rollout"), **_IN_MEMORY)
def adaptive_rollout(state: RunState) -> RolloutBatch:
    """Draw the next step's prompts and run the configured sampler (ada, fixed or dynamic_filter)."""
    return training.rollout_step(state)


@task(name="update_policy", task_run_name=_next_step_name("update"), **_IN_MEMORY)
def update_policy(state: RunState, batch: RolloutBatch) -> dict[str, float]:
    """One policy update on the batch's groups, then the weight sync."""
    return training.update_step(state, batch)


@task(name="evaluate", task_run_name=_this_step_name("evaluate"), retries=2, retry_delay_seconds=2, **_IN_MEMORY)
def evaluate(state: RunState) -> dict[str, float]:
    """avg@k and pass@k on the held-out prompts."""
    return training.evaluate(state)


@task(name="save_checkpoint", task_run_name=_this_step_name("checkpoint"), retries=2, retry_delay_seconds=2,
      **_IN_MEMORY)
def save_checkpoint(state: RunState) -> Path:
    """Atomic checkpoint (weights, optimizer, RNG, data cursor) under the run directory."""
    return training.save_checkpoint(state)


def _quoted(step_task: Any):
    def call(*args: Any) -> Any:
        return step_task(*(quote(a) for a in args))

    call.__name__ = step_task.name
    return call


TASK_STEPS = StepFunctions(
    rollout=_quoted(adaptive_rollout),
    update=_quoted(update_policy),
    evaluate=_quoted(evaluate),
    checkpoint=_quoted(save_checkpoint),
)
