"""The research samplers (issue #37) against GRPO n = 4 and n = 8 and Ada-balance in the Bernoulli simulation: what
each spends and what signal it buys, on fresh prompts and on a revisited pool. A SIMULATION (known pass rates, no
model, nothing learned), not a testbed result: docs/benchmarks/research-samplers.md records its numbers.

    PYTHONPATH=. OMP_NUM_THREADS=1 .venv/bin/python benchmarks/research_samplers.py [--seeds 5] [--json out.json]

Per method and regime, averaged over steps and seeds (mean, and the sd over seeds of the per-seed means):
- gen/step: samples generated a step (budget/generated_samples); trained/step: samples trained;
- informative/step: trained groups whose rewards are not all equal (a nonzero advantage);
- eff.ratio: informative / prompts trained (Knapsack RL's "effective ratio"); the platform's
  sampler/effective_ratio divides by prompts drawn, skipped ones included (greso's differ);
- signal samples/step: trained samples whose advantage is not zero (a gradient-signal proxy);
- sum|A|/step: the sum of |advantage| over trained samples, weights included (v3w's 1/sqrt(p) counts).
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from ada_core.config import AdvantageConfig, SamplerConfig
from ada_core.data.source import PromptSource
from ada_core.protocols import SamplingParams
from ada_core.sampling import make_sampler
from ada_core.sampling.simulate import BernoulliEngine, BernoulliVerifier, DifficultyMix, make_prompts

REGIMES = {
    # name: (difficulty mix, curation_k, prompts a step, steps, pool)
    "fresh, default mix": (DifficultyMix(), 0, 64, 10, 640),
    "revisit, default mix": (DifficultyMix(), 0, 64, 10, 128),
    "fresh, testbed-like": (DifficultyMix(0.0, 0.0, 2.0, 10.0), 16, 32, 10, 320),
    "revisit, testbed-like": (DifficultyMix(0.0, 0.0, 2.0, 10.0), 16, 32, 10, 64),
}
COLUMNS = ["gen/step", "trained/step", "informative/step", "eff.ratio", "signal samples/step", "sum|A|/step"]


def methods() -> dict[str, object]:
    grpo, gm = AdvantageConfig(name="grpo"), AdvantageConfig(name="global_mean")
    make = lambda adv, **cfg: make_sampler(SamplerConfig(**cfg), adv)  # noqa: E731
    return {
        "grpo-n4": make(grpo, name="fixed", n=4),
        "grpo-n8": make(grpo, name="fixed", n=8),
        "knapsack": make(grpo, name="knapsack", n=4),
        "pilot": make(grpo, name="pilot", n=4),
        "pilot (value: signal)": make(grpo, name="pilot", n=4, options={"value": "signal"}),
        "greso": make(grpo, name="greso", n=4),
        "ada-balance (M 8)": make(gm, name="ada", n=4, exit_rule="balance"),
        "ada-v3w": make(gm, name="ada_v3w", n=4),
    }


def run(regime: str, seed: int) -> dict[str, list[float]]:
    mix, curation_k, per_step, steps, pool = REGIMES[regime]
    dataset = make_prompts(pool, np.random.default_rng(seed), mix, curation_k)
    engine, verifier, sampling = BernoulliEngine(), BernoulliVerifier(), SamplingParams(max_tokens=14)
    out = {}
    for name, sampler in methods().items():
        source, totals = PromptSource(dataset, seed=seed), np.zeros(6)
        for t in range(steps):
            batch = sampler.sample(source.take(per_step), engine, verifier, sampling, np.random.default_rng([seed, t]),
                                   source=source)
            informative = sum(not g.is_uniform for g in batch.groups)
            totals += [batch.metrics["budget/generated_samples"], batch.metrics["budget/trained_samples"], informative,
                       informative / max(1, len(batch.groups)),
                       sum(abs(a) > 1e-12 for g in batch.groups for a in g.advantages),
                       sum(abs(a) for g in batch.groups for a in g.advantages)]
        out[name] = (totals / steps).tolist()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    results = {}
    for regime, (mix, curation_k, per_step, steps, pool) in REGIMES.items():
        per_seed = [run(regime, seed) for seed in range(args.seeds)]
        results[regime] = {m: {"mean": np.mean([r[m] for r in per_seed], axis=0).tolist(),
                               "sd": np.std([r[m] for r in per_seed], axis=0, ddof=1).tolist() if args.seeds > 1
                               else [0.0] * 6} for m in per_seed[0]}
        print(f"\n### {regime}: B = {per_step}, {steps} steps, pool {pool} ({pool // per_step} steps an epoch), "
              f"curation_k {curation_k}, {args.seeds} seeds\n")
        print("| method | " + " | ".join(COLUMNS) + " |")
        print("|---" * (len(COLUMNS) + 1) + "|")
        for m, r in results[regime].items():
            cells = [f"{mu:.0f}" if j < 2 else f"{mu:.3f} ± {sd:.3f}" if j == 3 else f"{mu:.1f} ± {sd:.1f}"
                     for j, (mu, sd) in enumerate(zip(r["mean"], r["sd"]))]
            print(f"| {m} | " + " | ".join(cells) + " |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
