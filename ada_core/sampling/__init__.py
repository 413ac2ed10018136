"""How a step's groups are drawn, and what that costs.

- `samplers`: GRPO, DAPO, Reinforce-Ada and the budgeted sampler; read it top to bottom to learn Reinforce-Ada.
- `rounds`: the primitives they share (one engine call plus the verifier, exit rules, downsampling).
- `streaming`: Ada without round barriers (`sampler.schedule: streaming`).
- `allocation`: the budgeted sampler's per-prompt history and allocation policy.
- `step_metrics`: the sampler/*, budget/*, reward/* metrics of one step.
- `budget`: equal-budget accounting (matched GRPO, compute).
- `simulate`: every sampler against Bernoulli prompts, no model (`ada simulate`).

The package exports the samplers and the round primitives; import the other modules by name.
"""

from ada_core.sampling.rounds import (
    draw_and_score,
    apply_verdict,
    EXIT_RULES,
    has_exited,
    downsample_balanced,
    downsample_random,
    DOWNSAMPLERS,
    allocate_round,
    make_group,
    check_prompts,
    finish_batch,
)
from ada_core.sampling.samplers import (
    FixedSampler,
    DynamicFilterSampler,
    AdaSampler,
    BudgetedSampler,
    Sampler,
    SAMPLERS,
    make_sampler,
)

__all__ = [
    "AdaSampler", "BudgetedSampler", "DOWNSAMPLERS", "DynamicFilterSampler", "EXIT_RULES", "FixedSampler",
    "SAMPLERS", "Sampler", "allocate_round", "apply_verdict", "check_prompts", "downsample_balanced",
    "downsample_random", "draw_and_score", "finish_batch", "has_exited", "make_group", "make_sampler"
]
