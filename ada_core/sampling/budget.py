"""Matched-budget accounting: compare samplers at equal generated samples and at equal compute.

Ada generates more samples per step than GRPO n=4, so per-step curves flatter it (DESIGN.md section 2).
The matched control is a GRPO run with more prompts per step, sized so both generate the same
samples; the compute axis weighs generated, trained and log-prob tokens by what each costs.
"""

from __future__ import annotations

import math


def matched_grpo_prompts(mean_generated_samples_per_step: float, n: int) -> int:
    """Prompts per step for GRPO with group size n to generate as many samples as the reference run.

    round(samples / n) to the nearest integer (halves up), at least 1.
    Ada-balance at 1,715 samples a step, n = 4 -> 429 prompts (429 x 4 = 1,716 samples).
    """
    if n < 1:
        raise ValueError(f"n: must be >= 1, got {n}")
    if not math.isfinite(mean_generated_samples_per_step) or mean_generated_samples_per_step < 0:
        raise ValueError(
            f"mean_generated_samples_per_step: must be a finite number >= 0, got {mean_generated_samples_per_step}"
        )
    return max(1, math.floor(mean_generated_samples_per_step / n + 0.5))


def compute_flops(params: float, generated_tokens: float, trained_tokens: float, logprob_tokens: float) -> float:
    """Approximate FLOPs of a run or step (the usual 2N-forward / 6N-train rule of thumb).

    2 * params per generated token (a forward pass), 6 * params per trained token (forward and
    backward), 2 * params per token of each log-prob recompute (`logprob_tokens` sums over every
    recompute: old-policy and reference log-probs each count their tokens once).
    params 1e6, 100 generated, 40 trained, 40 log-prob tokens -> 2e8 + 2.4e8 + 8e7 = 5.2e8.
    """
    values = {
        "params": params, "generated_tokens": generated_tokens,
        "trained_tokens": trained_tokens, "logprob_tokens": logprob_tokens,
    }
    for name, value in values.items():
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"{name}: must be a finite number >= 0, got {value}")
    return 2.0 * params * generated_tokens + 6.0 * params * trained_tokens + 2.0 * params * logprob_tokens
