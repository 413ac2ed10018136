"""Thin Prefect tasks over ada_core: each wraps one call, with retries and caching where safe.

- `curation`: `curate_dataset`, the difficulty-filtered prompt set, cached by its inputs.
- `training`: the trainer's step functions as task runs (`TASK_STEPS`).

Tasks import ada_core and Prefect only, never flows/.
"""

__all__ = ["curation", "training"]
