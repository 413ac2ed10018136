"""Process-level settings every flow applies before it touches a model."""

from __future__ import annotations

import logging
import os
import time
import uuid


def torch_threads() -> int:
    """Intra-op threads for model work inside a flow: $ADA_TORCH_THREADS, else every core but one.

    A flow shares its machine with Prefect (the ephemeral server or the worker), MLflow and the
    verifier's process pool. A torch op spread over every core stalls whenever one of them runs:
    on 2 cores, tiny-model steps inside a flow ran 5-20x slower with 2 threads than with 1
    (docs/BENCHMARKS.md, Platform overhead).
    """
    explicit = os.environ.get("ADA_TORCH_THREADS")
    if explicit:
        return max(1, int(explicit))
    return max(1, (os.cpu_count() or 1) - 1)


def set_torch_threads() -> int:
    import torch

    threads = torch_threads()
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    return threads


def run_stamp() -> str:
    """A sortable, collision-free suffix for run directories: 20261130-142501-3fa2."""
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:4]}"


def quiet_task_run_logs() -> None:
    """Per-task INFO lines ("Task run 'rollout-step-7' - Finished in state Completed()") off.

    Two task runs a step would print and ship ~2 log lines each to the API, about 6 ms a task on 2
    cores (a few % of a tiny-model step); the UI shows every task run's state without them. Task
    warnings and errors still log; flow-run INFO lines (run ids, counts) are untouched.
    $ADA_TASK_RUN_LOG_LEVEL overrides (e.g. INFO).
    """
    level = os.environ.get("ADA_TASK_RUN_LOG_LEVEL", "WARNING").upper()
    logging.getLogger("prefect.task_runs").setLevel(level)
