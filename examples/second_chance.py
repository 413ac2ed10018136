"""A sampler of your own, outside the platform: "second chance" (docs/SAMPLERS.md walks through it).

n samples for every prompt in one engine call; a prompt whose n rewards all agree gets `extra` more in a second
call, unless it stayed uniform `give_up` steps in a row (remembered across steps, and so in checkpoints).

    ADA_SAMPLERS=examples/second_chance.py ada simulate --prompts 64 --steps 4
    ADA_SAMPLERS=examples/second_chance.py ada train --preset second-chance
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pydantic import Field

from ada_core.config import AdvantageConfig, SamplerConfig
from ada_core.records import PromptPool
from ada_core.sampling import (DOWNSAMPLERS, SamplerOptions, StepClock, check_prompts, draw_and_score, finish_batch,
                               make_group, options_of, register_sampler)


class SecondChanceOptions(SamplerOptions):
    extra: int = Field(4, ge=1, description="Samples added in a second engine call to a prompt whose n agreed.")
    give_up: int = Field(2, ge=1, description="Steps in a row a prompt may stay uniform before it gets no extra.")


@register_sampler("second_chance", options=SecondChanceOptions,
                  presets={"second-chance": {"sampler": {"n": 4}, "advantage": {"name": "global_mean"}}})
@dataclass
class SecondChanceSampler:
    cfg: SamplerConfig
    advantage: AdvantageConfig
    streak: dict[str, int] = field(default_factory=dict)  # prompt id -> steps in a row it ended uniform

    def sample(self, prompts, engine, verifier, sampling, rng, source=None):
        opts, n, threshold, clock = options_of(self.cfg), self.cfg.n, self.cfg.positive_threshold, StepClock()
        check_prompts(prompts)
        pools = [PromptPool(p, rounds=1) for p in prompts]
        uniform = lambda pool: pool.num_positive(threshold) in (0, len(pool.samples))  # noqa: E731
        for rnd, todo, k in ((0, pools, n), (1, None, opts.extra)):
            if todo is None:  # round 1: the uniform pools that still have a chance
                todo = [p for p in pools if uniform(p) and self.streak.get(p.prompt.id, 0) < opts.give_up]
            if todo:
                clock.active_per_round.append(len(todo))
                drawn = draw_and_score([(p.prompt, k) for p in todo], rnd, engine, verifier, sampling, rng, clock)
                for pool, samples in zip(todo, drawn):
                    pool.samples.extend(samples)
                    pool.rounds = rnd + 1
        groups = []
        for pool in pools:
            pool.exit_reason = "unresolved" if uniform(pool) else "mixed"
            self.streak[pool.prompt.id] = self.streak.get(pool.prompt.id, 0) + 1 if uniform(pool) else 0
            chosen = DOWNSAMPLERS["balanced"](pool.samples, n, threshold, rng)
            groups.append(make_group(pool, chosen, self.advantage, threshold))
        second = sum(pool.rounds == 2 for pool in pools)
        return finish_batch(pools, groups, clock, self.cfg, ["mixed", "unresolved"],
                            {"sampler/second_chances": float(second)}, needed=(1, 1))

    def state_dict(self) -> dict:
        return {"streak": dict(self.streak)}

    def load_state_dict(self, state: dict | None) -> None:
        self.streak = dict(state["streak"]) if state else {}

    def close(self) -> None:
        pass
