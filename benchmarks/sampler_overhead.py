"""The sampler's own bookkeeping time (engine and verifier excluded) at a paper-sized step.

Runs the real samplers on the simulation's Bernoulli engine, 512 prompts x up to 32 samples each,
and reports the median of `sampler/bookkeeping_s` over repeats, in microseconds. The goal is
<= 1% of a tiny-model step's generation time (compared in docs/benchmarks/trainer-step-time.md).

    .venv/bin/python benchmarks/sampler_overhead.py --prompts 512 --samples 32 --repeats 20
"""

from __future__ import annotations

import argparse
import statistics

import numpy as np

from ada_core import metrics as mk
from ada_core.config import AdvantageConfig, SamplerConfig
from ada_core.protocols import SamplingParams
from ada_core.data import PromptSource
from ada_core.sampling import make_sampler
from ada_core.sampling.simulate import BernoulliEngine, BernoulliVerifier, DifficultyMix, make_prompts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=512)
    parser.add_argument("--samples", type=int, default=32, help="samples per prompt: GRPO n, Ada M0 + (N-1) M")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    m = args.samples // 4
    grpo, global_mean = AdvantageConfig(name="grpo"), AdvantageConfig(name="global_mean")
    samplers = {
        f"fixed n={args.samples}": make_sampler(SamplerConfig(name="fixed", n=args.samples), grpo),
        f"ada-balance M={m} N=4 n=4": make_sampler(SamplerConfig(name="ada", exit_rule="balance", M=m, N=4), global_mean),
        f"ada-pos M={m} N=4 n=4": make_sampler(SamplerConfig(name="ada", exit_rule="pos", M=m, N=4), global_mean),
        # pass rates all in (0, 1) but tiny: every prompt runs all N rounds, the worst case
        f"ada-balance all-hard M={m} N=4": make_sampler(SamplerConfig(name="ada", exit_rule="balance", M=m, N=4), global_mean),
    }
    engine, verifier, sampling = BernoulliEngine(), BernoulliVerifier(), SamplingParams(max_tokens=14)
    default = make_prompts(args.prompts, np.random.default_rng(args.seed))
    hard = make_prompts(args.prompts, np.random.default_rng(args.seed), DifficultyMix(0.0, 0.0, 0.05, 50.0))
    print(f"{args.prompts} prompts, {args.repeats} repeats (median); bookkeeping excludes engine and verifier time")
    print("| sampler | samples/step | bookkeeping us/step | us/sample | engine+verifier ms/step |")
    print("|---|---|---|---|---|")
    for name, sampler in samplers.items():
        prompts = hard if "all-hard" in name else default
        book, other, generated = [], [], []
        for r in range(args.repeats):
            rng = np.random.default_rng([args.seed, r])
            batch = sampler.sample(prompts, engine, verifier, sampling, rng, source=PromptSource(prompts))
            book.append(batch.metrics[mk.SAMPLER_TIME_S])
            other.append(batch.metrics[mk.TIME_GENERATE_S] + batch.metrics[mk.TIME_REWARD_S])
            generated.append(batch.metrics[mk.BUDGET_GENERATED_SAMPLES])
        b, g = statistics.median(book), statistics.median(generated)
        print(f"| {name} | {g:.0f} | {1e6 * b:.0f} | {1e6 * b / g:.2f} | {1e3 * statistics.median(other):.1f} |")


if __name__ == "__main__":
    main()
