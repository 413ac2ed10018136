"""The training loop: `setup` builds a run (state.py), `run_steps` advances it (loop.py), `train` does both.

The Prefect flow runs the same loop with task-wrapped step functions (`StepFunctions`); there is no second one.
"""

from ada_core.training.state import CUMULATIVE, RunState, setup
from ada_core.training.loop import (
    StepFunctions,
    Callbacks,
    rollout_step,
    update_step,
    evaluate,
    save_checkpoint,
    step_metrics,
    DEFAULT_STEPS,
    run_steps,
    train,
)

__all__ = [
    "CUMULATIVE", "Callbacks", "DEFAULT_STEPS", "RunState", "StepFunctions", "evaluate", "rollout_step",
    "run_steps", "save_checkpoint", "setup", "step_metrics", "train", "update_step"
]
