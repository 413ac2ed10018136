"""The training loop: `setup` builds a run, `run_steps` advances it, `train` does both.

The Prefect flow runs the same loop with task-wrapped step functions (`StepFunctions`); there is no second one.
"""

from ada_core.training.loop import (
    CUMULATIVE,
    RunState,
    StepFunctions,
    Callbacks,
    setup,
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
