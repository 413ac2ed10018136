"""How a step's groups are drawn, and what that costs.

- `samplers`: GRPO, DAPO, Reinforce-Ada and the budgeted sampler; read it top to bottom to learn Reinforce-Ada.
- `rounds`: the primitives they share (one engine call plus the verifier, exit rules, downsampling).
- `streaming`: Ada without round barriers (`sampler.schedule: streaming`).
- `allocation`: the budgeted sampler's per-prompt history and allocation policy.
- `step_metrics`: the sampler/*, budget/*, reward/* metrics of one step.
- `budget`: equal-budget accounting (matched GRPO, compute).
- `research`: the research samplers knapsack, pilot, greso and ada_v3w (issue #37; docs/ALGORITHM.md).
- `simulate`: every sampler against Bernoulli prompts, no model (`ada simulate`).

The package exports the samplers, the registry and the round primitives (a sampler of your own needs
nothing else); import the other modules by name.
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
from ada_core.config.registry import (
    SamplerOptions,
    SamplerSpec,
    PluginError,
    register_sampler,
    get_sampler,
    sampler_names,
    options_of,
)
from ada_core.sampling.samplers import (
    FixedSampler,
    DynamicFilterSampler,
    AdaSampler,
    BudgetedSampler,
    EstSampler,
    make_sampler,
)
from ada_core.protocols import Sampler
from ada_core.sampling import research  # noqa: F401  the research samplers register (issue #37)
from ada_core.sampling.step_metrics import StepClock

__all__ = [
    "AdaSampler", "BudgetedSampler", "DOWNSAMPLERS", "DynamicFilterSampler", "EXIT_RULES", "EstSampler", "FixedSampler",
    "PluginError", "Sampler", "SamplerOptions", "SamplerSpec", "StepClock", "allocate_round", "apply_verdict",
    "check_prompts", "downsample_balanced", "downsample_random", "draw_and_score", "finish_batch", "get_sampler",
    "has_exited", "make_group", "make_sampler", "options_of", "register_sampler", "sampler_names",
]
